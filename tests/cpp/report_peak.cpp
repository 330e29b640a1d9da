// The report at exit runs in the memory the heap gave up: this program's heap peaks at 4 MiB of
// small blocks, all freed (spans the heap keeps resident for reuse), then it leaks one block
// through std::function, so that the report symbolizes the program, libstdc++ and libc. With the
// heap's free spans kept through the report, symbolizing raised the process's peak by its own
// size; with them given back first, it fits under the peak the program set.
#include <k15/memory.h>

#include <cstring>
#include <functional>
#include <vector>

namespace {

[[gnu::noinline]] int* leak_through_std_function() {
    std::function<int*()> make = [] { return K15_NEW int[8]; };  // LEAKED AT THE END
    return make();
}

}  // namespace

int main() {
    std::vector<char*> blocks;
    blocks.reserve(40000);
    for (int i = 0; i < 40000; ++i) {
        char* block = new char[64];
        std::memset(block, 0x5a, 64);
        blocks.push_back(block);
    }
    for (char* block : blocks) delete[] block;
    int* leaked = leak_through_std_function();
    leaked[0] = 1;
    return 0;
}
