// Random overruns of random lengths past live blocks, among live and freed neighbours:
// `random_overruns <seed> <longest overrun> [largest block]` (blocks of 1 to 600 bytes, or to
// the largest given: 16 makes them all compact-header blocks). Whatever they overwrite (guards, the tracker's
// list links and headers, the heap's free lists), the program must reach its last line with
// the report written: the tracker reports what it finds and never crashes.
//
// `random_overruns <seed> <longest underrun> far`: random underruns in front of blocks from
// outside the heap instead (large ones, and ones aligned to 128 bytes up to a page), over their
// headers, the copies of them and their list links.
#include <k15/memory.h>

#include <cstdio>
#include <new>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t kAlignments[] = {16, 128, 256, 1024, 4096};

char* make_far(std::size_t& size, std::size_t& align) {
    align = kAlignments[std::rand() % 5];
    size = align == 16 ? 130000 + static_cast<std::size_t>(std::rand() % 100000)
                       : 1 + static_cast<std::size_t>(std::rand() % 600);
    char* block = static_cast<char*>(::operator new[](size, std::align_val_t{align}));
    std::memset(block, 1, size);
    return block;
}

void free_far(char* block, std::size_t align) { ::operator delete[](block, std::align_val_t{align}); }

int far_underruns(int longest) {
    constexpr int kBlocks = 300;
    std::vector<char*> blocks(kBlocks);
    std::vector<std::size_t> sizes(kBlocks), aligns(kBlocks);
    for (int i = 0; i < kBlocks; ++i) blocks[i] = make_far(sizes[i], aligns[i]);
    for (int i = 0; i < kBlocks; i += 2) {
        free_far(blocks[i], aligns[i]);
        blocks[i] = nullptr;
    }
    for (int k = 0; k < 40; ++k) {
        const int i = 1 + 2 * (std::rand() % (kBlocks / 2));
        const std::size_t length = 1 + static_cast<std::size_t>(std::rand() % longest);
        std::memset(blocks[i] - length, 'U', length);
    }
    std::printf("check_heap found %zu\n", k15::memory::check_heap());
    std::thread([&] {  // frees of another thread's blocks
        for (int i = 1; i < kBlocks; i += 4) {
            free_far(blocks[i], aligns[i]);
            blocks[i] = nullptr;
        }
    }).join();
    for (int i = 0; i < 2000; ++i) {
        std::size_t size = 0, align = 0;
        free_far(make_far(size, align), align);
    }
    for (int i = 0; i < kBlocks; ++i)
        if (blocks[i] != nullptr) free_far(blocks[i], aligns[i]);
    std::printf("last line\n");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::srand(argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 1);
    const int longest = argc > 2 ? std::atoi(argv[2]) : 64;
    if (argc > 3 && std::strcmp(argv[3], "far") == 0) return far_underruns(longest);
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
