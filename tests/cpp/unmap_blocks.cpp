// A program that takes large malloc'd buffers for mappings of its own: it unmaps, remaps and maps
// over them (live ones, and one freed a moment before), from four threads at once, while it
// maps and unmaps pages of its own beside them. Under glibc every such call fails with EINVAL
// (its blocks never start a page) and the program runs on; it must under the tracker too. It
// prints what each call returned, then checks every byte of its blocks.
#include <k15/memory.h>

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kBlock = 1 << 20;

std::atomic<long> own_calls_failed{0};
std::atomic<long> block_calls_succeeded{0};  // on live blocks
std::atomic<long> bytes_damaged{0};

const char* outcome(long result) { return result == -1 && errno == EINVAL ? "EINVAL" : "done"; }

// The calls the program makes on a block's pages: how many went through.
long misuse(char* block) {
    long succeeded = 0;
    succeeded += munmap(block, kBlock) == 0;
    succeeded += munmap(block + 8 * kPage, kPage) == 0;
    succeeded += munmap(block - kPage, kPage) == 0;
    succeeded += mremap(block, kBlock, 2 * kBlock, MREMAP_MAYMOVE) != MAP_FAILED;
    succeeded += mmap(block, kPage, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED;
    return succeeded;
}

// Pages of the program's own, mapped and unmapped in pieces: every call must work.
void own_mappings() {
    void* own = mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (own == MAP_FAILED) {
        ++own_calls_failed;
        return;
    }
    char* pages = static_cast<char*>(own);
    std::memset(pages, 7, 4 * kPage);
    if (munmap(pages + kPage, kPage) != 0) ++own_calls_failed;
    if (mmap(pages + kPage, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
             -1, 0) == MAP_FAILED)
        ++own_calls_failed;
    if (munmap(pages, 4 * kPage) != 0) ++own_calls_failed;
}

void check(const char* block, std::size_t size, char value) {
    for (std::size_t i = 0; i < size; ++i)
        if (block[i] != value) ++bytes_damaged;
}

void worker(int id) {
    for (int round = 0; round < 50; ++round) {
        const char value = static_cast<char>(id * 50 + round);
        char* block = static_cast<char*>(std::malloc(kBlock));
        std::memset(block, value, kBlock);
        block_calls_succeeded += misuse(block);
        own_mappings();
        check(block, kBlock, value);
        const std::uintptr_t kept_after_free = reinterpret_cast<std::uintptr_t>(block);
        std::free(block);
        // A pointer kept after its free: the block's pages may be kept for the next one, which
        // must keep them (where they went back to the OS, the calls unmap nothing: not counted).
        misuse(reinterpret_cast<char*>(kept_after_free));
        char* next = static_cast<char*>(std::malloc(kBlock));
        std::memset(next, value, kBlock);
        check(next, kBlock, value);
        std::free(next);
    }
}

}  // namespace

int main() {
    char* block = static_cast<char*>(std::malloc(kBlock));
    std::memset(block, 1, kBlock);
    std::printf("munmap(block) %s\n", outcome(munmap(block, kBlock)));
    std::printf("munmap(page before block) %s\n", outcome(munmap(block - kPage, kPage)));
    std::printf("mremap(block) %s\n",
                outcome(mremap(block, kBlock, 2 * kBlock, MREMAP_MAYMOVE) == MAP_FAILED ? -1 : 0));
    std::printf("mmap(MAP_FIXED over block) %s\n",
                outcome(mmap(block, kPage, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
                             0) == MAP_FAILED
                            ? -1
                            : 0));
    check(block, kBlock, 1);
    std::free(block);

    std::vector<std::thread> threads;
    for (int id = 0; id < 4; ++id) threads.emplace_back(worker, id);
    for (auto& thread : threads) thread.join();
    std::printf("calls on live blocks that went through %ld\n", block_calls_succeeded.load());
    std::printf("calls on own pages that failed %ld\n", own_calls_failed.load());
    std::printf("bytes damaged %ld\n", bytes_damaged.load());
}
