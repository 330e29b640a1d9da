// Threads growing and shrinking blocks with realloc (in place, moving, remapping) while the main
// thread checks the heap, reads the counters and writes reports: none of them may find a block
// half rewritten (tests/realloc.rs).
#include <k15/memory.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

std::atomic<bool> done{false};
std::atomic<unsigned long> wrong_bytes{0};

// Up and down between 16 bytes and 300 KiB in 16-byte steps within a class and doubling steps
// across, each block's bytes checked after every call.
void resize_loop(unsigned seed) {
    std::vector<size_t> sizes;
    for (size_t s = 16; s < 300 << 10; s += s < 4096 ? 16 : s / 8) sizes.push_back(s);
    auto* block = static_cast<unsigned char*>(std::malloc(sizes[0]));
    std::memset(block, seed & 0xff, sizes[0]);
    size_t size = sizes[0];
    for (int round = 0; round < 60; round++) {
        for (size_t i = 0; i < 2 * sizes.size() - 1; i++) {
            size_t next = i < sizes.size() ? sizes[i] : sizes[2 * sizes.size() - 2 - i];
            block = static_cast<unsigned char*>(std::realloc(block, next));
            size_t kept = size < next ? size : next;
            if (block[0] != (seed & 0xff) || block[kept - 1] != (seed & 0xff)) wrong_bytes++;
            std::memset(block, seed & 0xff, next);
            size = next;
        }
    }
    std::free(block);
}

}  // namespace

int main() {
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 4; t++) threads.emplace_back(resize_loop, t + 1);
    std::thread reader([] {
        size_t problems = 0;
        unsigned checks = 0;
        while (!done.load()) {
            problems += k15::memory::check_heap();
            k15::memory::Stats stats = k15::memory::stats();
            if (stats.live_bytes > (1u << 30)) problems++;
            checks++;
        }
        std::printf("checks %u, problems %zu\n", checks, problems);
    });
    for (auto& t : threads) t.join();
    done = true;
    reader.join();
    std::printf("wrong bytes %lu\nsurvived\n", wrong_bytes.load());
}
