// The executable of tests/cmake/untouched: two leaks (one here, one in the static library), and
// a string from the shared library, freed.
#include <cstdio>
#include <string>

int* make_leak();
std::string* make_voice();

namespace {
void* volatile sink;
}

int main() {
    sink = make_leak();
    std::string* voice = make_voice();
    std::printf("untouched: voice of %zu\n", voice->size());
    delete voice;
    sink = new char[11];  // MAIN LEAK
    return 0;
}
