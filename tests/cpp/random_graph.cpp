// A random graph of blocks for the leak scan's referee test: blocks of random sizes (many of 1
// to 16 bytes), zeroed, then linked by pointers to other blocks' starts; some held by globals;
// some freed, by this thread or another, after every pointer to them is cleared. The census of
// direct, indirect and still reachable blocks must then be the same whatever the allocator's
// addresses, so the tracker and valgrind's memcheck must agree on it.
//
// Usage: random_graph SEED BLOCKS
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

namespace {

constexpr int kRoots = 16;
void* g_roots[kRoots];

// Bookkeeping outside every heap (mapped, unmapped before exit), so it is no root of either tool.
template <typename T>
T* scratch(size_t count) {
    void* p = mmap(nullptr, count * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    return static_cast<T*>(p);
}

size_t random_size(std::mt19937_64& rng) {
    switch (rng() % 4) {
        case 0: return 1 + rng() % 16;   // compact blocks
        case 1: return 8 + 8 * (rng() % 2);
        case 2: return 17 + rng() % 100;
        default: return 1 + rng() % 400;
    }
}

void build_graph(uint64_t seed, int count) {
    std::mt19937_64 rng(seed);
    char** blocks = scratch<char*>(count);
    size_t* sizes = scratch<size_t>(count);
    bool* freed = scratch<bool>(count);

    // Churn first, half of it freed by another thread, so the graph lands among reused memory.
    char** churn = scratch<char*>(count);
    for (int i = 0; i < count; ++i) churn[i] = new char[random_size(rng)];
    std::thread other([&] {
        for (int i = 0; i < count; i += 2) delete[] churn[i];
    });
    other.join();
    for (int i = 1; i < count; i += 2) delete[] churn[i];

    for (int i = 0; i < count; ++i) {
        sizes[i] = random_size(rng);
        blocks[i] = new char[sizes[i]];
        std::memset(blocks[i], 0, sizes[i]);
    }
    // A link in a quarter of the words: chains, trees and cycles, many of them lost.
    for (int i = 0; i < count; ++i) {
        for (size_t word = 0; word + sizeof(void*) <= sizes[i]; word += sizeof(void*)) {
            if (rng() % 4 != 0) continue;
            char* target = blocks[rng() % count];
            std::memcpy(blocks[i] + word, &target, sizeof target);
        }
    }
    for (int r = 0; r < kRoots; ++r) g_roots[r] = blocks[rng() % count];

    // A fifth freed, each by this thread or another, after clearing every pointer to it.
    for (int i = 0; i < count; ++i) freed[i] = rng() % 5 == 0;
    auto points_to_freed = [&](const void* word) {
        char* value;
        std::memcpy(&value, word, sizeof value);
        for (int j = 0; j < count; ++j)
            if (value == blocks[j]) return freed[j];
        return false;
    };
    for (int i = 0; i < count; ++i) {
        if (freed[i]) continue;
        for (size_t word = 0; word + sizeof(void*) <= sizes[i]; word += sizeof(void*))
            if (points_to_freed(blocks[i] + word)) std::memset(blocks[i] + word, 0, sizeof(void*));
    }
    for (auto& root : g_roots)
        if (points_to_freed(&root)) root = nullptr;
    std::thread freer([&] {
        for (int i = 0; i < count; i += 2)
            if (freed[i]) delete[] blocks[i];
    });
    freer.join();
    for (int i = 1; i < count; i += 2)
        if (freed[i]) delete[] blocks[i];

    munmap(blocks, count * sizeof(char*));
    munmap(sizes, count * sizeof(size_t));
    munmap(freed, count * sizeof(bool));
    munmap(churn, count * sizeof(char*));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) return 2;
    const uint64_t seed = std::strtoull(argv[1], nullptr, 10);
    const int count = std::atoi(argv[2]);
    // On a thread of its own, so that no stale word of the work is left on a live stack (valgrind
    // scans the stacks of the threads alive at exit; the tracker does not).
    std::thread worker(build_graph, seed, count);
    worker.join();
    std::printf("random_graph: %d blocks\n", count);
    return 0;
}
