// Random overruns of random lengths past live blocks, among live and freed neighbours:
// `random_overruns <seed> <longest overrun> [largest block]` (blocks of 1 to 600 bytes, or to
// the largest given: 16 makes them all compact-header blocks). Whatever they overwrite (guards, the tracker's
// list links and headers, the heap's free lists), the program must reach its last line with
// the report written: the tracker reports what it finds and never crashes.
#include <k15/memory.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
    std::srand(argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 1);
    const int longest = argc > 2 ? std::atoi(argv[2]) : 64;
    const int largest = argc > 3 ? std::atoi(argv[3]) : 600;
    constexpr int kBlocks = 3000;
    std::vector<char*> blocks;
    std::vector<std::size_t> sizes;
    for (int i = 0; i < kBlocks; ++i) {
        sizes.push_back(1 + static_cast<std::size_t>(std::rand() % largest));
        blocks.push_back(new char[sizes.back()]);
        std::memset(blocks.back(), 1, sizes.back());
    }
    for (int i = 0; i < kBlocks; i += 2) {  // every other block freed: free neighbours too
        delete[] blocks[i];
        blocks[i] = nullptr;
    }
    for (int k = 0; k < 40; ++k) {
        const int i = 1 + 2 * (std::rand() % (kBlocks / 2));
        std::memset(blocks[i] + sizes[i], 'R', static_cast<std::size_t>(1 + std::rand() % longest));
    }
    std::printf("check_heap found %zu\n", k15::memory::check_heap());
    std::thread([&blocks] {  // frees of another thread's blocks
        for (int i = 1; i < kBlocks; i += 4) {
            delete[] blocks[i];
            blocks[i] = nullptr;
        }
    }).join();
    for (int i = 0; i < 20000; ++i) {  // the heap hands out its free blocks again
        char* block = new char[1 + std::rand() % largest];
        block[0] = 1;
        delete[] block;
    }
    for (char* block : blocks) delete[] block;
    std::printf("live blocks %llu\n", static_cast<unsigned long long>(k15::memory::stats().live_blocks));
    std::printf("last line\n");
    return 0;
}
