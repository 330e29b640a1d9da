// Levels of large blocks loaded and unloaded in turn, as a game loads and unloads its levels:
// the minor page faults of each level (`level N faults F`), a calloc over pages an earlier block
// wrote (`calloc nonzero bytes N`), a second free of a large block just freed (its pages kept),
// and the resident memory at the start and once everything is freed. Built plain (glibc) too,
// without the second free.
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "resident.h"

namespace {

long minor_faults() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_minflt;
}

// A level's large blocks, each written over (a level's meshes and tables): the largest first.
const std::size_t kSizes[] = {3500 * 1024, 800 * 1024, 660 * 1024, 660 * 1024, 330 * 1024, 170 * 1024};

void level() {
    std::vector<char*> blocks;
    for (std::size_t size : kSizes) {
        char* block = static_cast<char*>(std::malloc(size));
        std::memset(block, 0x5a, size);
        blocks.push_back(block);
    }
    for (char* block : blocks) std::free(block);
}

}  // namespace

int main() {
    const long start = resident_kib();
    for (int n = 0; n < 6; ++n) {
        const long before = minor_faults();
        level();
        std::printf("level %d faults %ld\n", n, minor_faults() - before);
    }

    // Pages written with 0x5a by the levels above, handed out again: calloc's must read zero.
    std::size_t nonzero = 0;
    for (std::size_t size : kSizes) {
        auto* block = static_cast<unsigned char*>(std::calloc(1, size));
        for (std::size_t i = 0; i < size; ++i) nonzero += block[i] != 0;
        std::free(block);
    }
    std::printf("calloc nonzero bytes %zu\n", nonzero);

#ifndef K15_MEMORY_DISABLED
    char* twice = static_cast<char*>(std::malloc(kSizes[1]));
    twice[0] = 1;
    std::free(twice);  // FIRST FREE OF A KEPT LARGE BLOCK
    std::free(twice);  // SECOND FREE OF A KEPT LARGE BLOCK
#endif

    std::printf("start_kib %ld\nafter_kib %ld\nsurvived\n", start, resident_kib());
}
