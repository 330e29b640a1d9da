// Leaks a block from a function the suppressions name and one from main, then moves to
// another directory before it exits, as games move to their data and daemons to /.
//
//   moves_directory DIRECTORY
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

[[gnu::noinline]] void* vendor_cache() { return std::memset(std::malloc(21), 0, 21); }

std::uintptr_t hidden[2];  // inverted: no roots

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    hidden[0] = ~reinterpret_cast<std::uintptr_t>(vendor_cache());
    hidden[1] = ~reinterpret_cast<std::uintptr_t>(std::memset(std::malloc(33), 0, 33));  // LEAK
    if (chdir(argv[1]) != 0) return 3;
    std::puts("moved");
    return 0;
}
