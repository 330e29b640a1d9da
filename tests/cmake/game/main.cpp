// The game of tests/cmake/game: one deliberate leak through K15_NEW, one through plain new.
#include <k15/memory.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {
void* volatile sink;
}

int main() {
    std::vector<std::string> names(20, std::string(50, 'n'));
    sink = K15_NEW int[3];  // GAME LEAK
    sink = new double(2.5);
    std::printf("game: %zu names, __cplusplus %ld\n", names.size(), static_cast<long>(__cplusplus));
    return 0;
}
