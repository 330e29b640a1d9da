// The churn workload of the benchmark: each thread makes `pairs` new[]/delete[] (or malloc/free)
// pairs of 8..512 bytes into a table of 4096 slots (so blocks live for thousands of iterations),
// beside 1000 long-lived blocks, through three levels of engine-like calls. Prints nanoseconds
// per pair.
//
//   churn <threads> <pairs per thread> [new|malloc] [shared]
//
// `shared`: every iteration of every thread also stores to one global that all threads share,
// as engine code does (a frame counter, a statistics word): each store of the allocator then
// waits behind the line the other thread holds.
#include <k15/memory.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

// Stored to by every thread, every iteration (`shared`): a cache line of its own, so that the
// flags below, read every iteration, do not share it (that measured their reads' misses, and
// only in g++'s layout), and outside the anonymous namespace: clang drops every store to an
// internal variable that nothing reads, atomic or not.
struct alignas(64) SharedLine {
    std::atomic<long> word{0};
};
SharedLine churn_shared_line;

namespace {

constexpr unsigned kSlots = 4096;

bool use_malloc = false;  // the C family instead of new[]/delete[]
bool store_shared = false;

struct Rng {
    std::uint64_t state;
    std::uint64_t next() {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        return state >> 24;
    }
};

[[gnu::noinline]] char* make_buffer(std::size_t size) {
    char* block = use_malloc ? static_cast<char*>(std::malloc(size)) : new char[size];
    block[0] = static_cast<char>(size);  // the pointer escapes, so g++ keeps the pair
    return block;
}

[[gnu::noinline]] char* spawn_component(Rng& rng) { return make_buffer(8 + rng.next() % 505); }

void release(char* block) {
    if (use_malloc)
        std::free(block);
    else
        delete[] block;
}

[[gnu::noinline]] void update_slot(char*& slot, Rng& rng) {
    release(slot);
    slot = spawn_component(rng);
}

void churn(unsigned thread, long pairs) {
    Rng rng{0x9E3779B97F4A7C15ULL * (thread + 1)};
    std::vector<char*> long_lived;
    for (int i = 0; i < 1000; ++i) long_lived.push_back(make_buffer(64));
    std::vector<char*> slots(kSlots, nullptr);
    for (long i = 0; i < pairs; ++i) {
        update_slot(slots[rng.next() % kSlots], rng);
        if (store_shared) churn_shared_line.word.store(i, std::memory_order_relaxed);
    }
    for (char* block : slots) release(block);
    for (char* block : long_lived) release(block);
}

}  // namespace

int main(int argc, char** argv) {
    const unsigned threads = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 1;
    const long pairs = argc > 2 ? std::atol(argv[2]) : 2000000;
    use_malloc = argc > 3 && std::string(argv[3]) == "malloc";
    store_shared = argc > 4 && std::string(argv[4]) == "shared";
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (unsigned t = 0; t < threads; ++t) workers.emplace_back(churn, t, pairs);
    for (auto& worker : workers) worker.join();
    const std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
    std::printf("ns_per_pair %.3f\n", elapsed.count() / static_cast<double>(pairs));
    return 0;
}
