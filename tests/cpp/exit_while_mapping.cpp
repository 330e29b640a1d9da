// Threads that map and unmap pages of their own without a pause (an engine's page allocator)
// while `main` returns with 20,000 leaked blocks: the exit report suspends them, likely inside
// `mmap` or `munmap`, and then needs large blocks of its own for that many leaks. Prints the
// calls made before the exit.
#include <k15/memory.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "keep.h"

namespace {

std::atomic<long> calls{0};

void map_pages_forever() {
    for (;;) {
        void* own = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (own != MAP_FAILED) munmap(own, 1 << 16);
        calls.fetch_add(1, std::memory_order_relaxed);
    }
}

}  // namespace

int main() {
    for (int i = 0; i < 2; ++i) std::thread(map_pages_forever).detach();
    for (int i = 0; i < 20000; ++i) {
        void* block = std::malloc(24 + i % 200);
        keep(block);  // LEAK: 20,000 of them, from one site
        static_cast<char*>(block)[0] = 0;
    }
    while (calls.load() < 10000) std::this_thread::yield();
    std::printf("exiting after %ld calls\n", calls.load());
    return 0;
}
