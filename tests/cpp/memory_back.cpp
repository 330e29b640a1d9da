// Memory comes back to the OS: 60 MiB of blocks freed drop resident memory; a block freed before
// its span went back is double-freed (reported, no crash); blocks of another class reuse the
// returned pages (fresh headers and guards: an overrun of one is caught); leaks made before all
// this, one of them among the freed blocks, are still reported. Prints what it measured.
#include <k15/memory.h>

#include <cstdio>
#include <cstring>
#include <vector>
#include "resident.h"

namespace {

[[gnu::noinline]] char* leak_early() {
    return K15_NEW char[48];  // LEAKED EARLY
}

}  // namespace

int main() {
    char* leaked = leak_early();
    leaked[0] = 1;
    const long start = resident_kib();
    std::vector<char*> blocks;
    blocks.reserve(120000);
    for (int i = 0; i < 120000; ++i) {
        char* block = K15_NEW char[400];  // SPANS OF 400-BYTE BLOCKS
        std::memset(block, 0x5a, 400);
        blocks.push_back(block);
    }
    const long peak = resident_kib();
    char* stale = blocks[60000];  // in a span freed after the few kept resident
    blocks[90000] = nullptr;       // leaked: its span stays
    for (char* block : blocks) delete[] block;
    std::vector<char*>().swap(blocks);
    const long after = resident_kib();
    std::printf("start %ld peak %ld after %ld\n", start, peak, after);
    std::fflush(stdout);

    delete[] stale;  // SECOND DELETE AFTER ITS SPAN WENT BACK
    std::puts("double free survived");

    // Another class on the freed spans (the four kept resident first, then those whose pages went
    // back to the OS): every byte written and read back intact.
    std::vector<char*> reused;
    for (int i = 0; i < 100000; ++i) {
        char* block = new char[200];
        std::memset(block, i & 0xff, 200);
        reused.push_back(block);
    }
    int damaged = 0;
    for (int i = 0; i < 100000; ++i)
        for (int b = 0; b < 200; ++b) damaged += reused[i][b] != static_cast<char>(i & 0xff);
    std::printf("reused blocks damaged %d\n", damaged);
    reused[90000][200] = 1;  // OVERRUN OF A BLOCK ON PAGES THAT WENT BACK TO THE OS
    for (char* block : reused) delete[] block;
    std::puts("survived");
    return 0;
}
