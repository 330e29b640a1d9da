// check_heap() over many live blocks: `check_heap <blocks>` allocates that many blocks of 16..256
// bytes and prints the best of three timed check_heap() calls (the world stopped, every block's
// guard and check word read).
#include <k15/memory.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
    const long blocks = argc > 1 ? std::atol(argv[1]) : 1000000;
    std::vector<char*> live;
    live.reserve(static_cast<std::size_t>(blocks));
    for (long i = 0; i < blocks; ++i) live.push_back(new char[16 + (i * 37) % 241]);
    double best_ms = 1e30;
    std::size_t problems = 0;
    for (int run = 0; run < 3; ++run) {
        const auto start = std::chrono::steady_clock::now();
        problems += k15::memory::check_heap();
        const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
        if (took.count() < best_ms) best_ms = took.count();
    }
    std::printf("check_heap_ms %.3f\nns_per_block %.3f\nproblems %zu\n", best_ms, best_ms * 1e6 / static_cast<double>(blocks),
                problems);
    for (char* block : live) delete[] block;
    return 0;
}
