// Thread churn: THREADS short threads, at most ALIVE at once. Each allocates blocks, frees blocks
// that earlier threads (maybe gone by now) left in a shared exchange, leaves some of its own
// there, and exits. At the end every block is freed except one leaked block per 1000 threads.
//
//   thread_churn THREADS ALIVE
#include <k15/memory.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

constexpr int slots = 4096;
std::atomic<int*> exchange[slots];

void short_life(int index) {
    unsigned step = 2654435761u * static_cast<unsigned>(index + 1);
    std::vector<int*> own;
    for (int i = 0; i < 16; ++i) own.push_back(new int(i));
    for (int i = 0; i < 4; ++i) {
        step = step * 1103515245u + 12345u;
        // Another thread's block out (freed here), one of ours in.
        delete exchange[(step >> 8) % slots].exchange(own.back());
        own.pop_back();
    }
    for (int* p : own) delete p;
    if (index % 1000 == 0) {
        int* leaked = K15_NEW int[3];  // K15_CHURN_LEAK
        leaked[0] = index;
    }
}

void run_batches(int threads, int alive) {
    std::vector<std::thread> batch;
    batch.reserve(alive);
    for (int started = 0; started < threads;) {
        for (int i = 0; i < alive && started < threads; ++i) batch.emplace_back(short_life, started++);
        for (auto& t : batch) t.join();
        batch.clear();
    }
}

}  // namespace

int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 20000;
    const int alive = argc > 2 ? std::atoi(argv[2]) : 500;
    const k15::memory::Stats before = k15::memory::stats();
    run_batches(threads, alive);
    for (auto& slot : exchange) delete slot.exchange(nullptr);
    const k15::memory::Stats after = k15::memory::stats();
    std::printf("threads: %d live blocks before: %llu after: %llu\n", threads,
                static_cast<unsigned long long>(before.live_blocks), static_cast<unsigned long long>(after.live_blocks));
    return 0;
}
