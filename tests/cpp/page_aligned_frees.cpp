// Page-aligned blocks of glibc's thread arenas, freed with malloc=0 (glibc serves the family):
// the tracker looks for a large block of its own in the pages before such a pointer, and an
// arena's heap begins right after the PROT_NONE reserve of the arena mapped below it.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 8;
std::atomic<int> with_arena{0};

void free_a_page_aligned_block() {
    void* first = std::malloc(64);  // gives this thread its own arena
    with_arena.fetch_add(1);
    while (with_arena.load() < kThreads) {
        std::this_thread::yield();  // every arena exists before any page-aligned free
    }
    void* page = nullptr;
    if (posix_memalign(&page, 4096, 4096) != 0) {
        std::abort();
    }
    std::memset(page, 1, 4096);
    std::free(page);
    std::free(first);
}

}  // namespace

int main() {
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
        threads.emplace_back(free_a_page_aligned_block);
    }
    for (auto& thread : threads) {
        thread.join();
    }
    std::puts("survived");
    return 0;
}
