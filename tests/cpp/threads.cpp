// Two threads allocate 100k blocks each and free each other's; many short threads; and
// thread_local destructors that allocate and free at thread exit.
#include <k15/memory.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

constexpr int kBlocksPerThread = 100000;

struct ThreadExitWork {
    int* kept = nullptr;
    ~ThreadExitWork() {
        std::vector<int> scratch(100, 1);  // new and delete during thread exit
        delete[] kept;
        kept = K15_NEW int[3];             // LEAK at thread exit (deliberate)
    }
};

thread_local ThreadExitWork exit_work;

std::vector<int*> blocks[2];
std::atomic<int> ready{0};
std::atomic<bool> go{false};
std::atomic<int> allocated{0};
std::atomic<bool> free_go{false};

void producer_consumer(int self) {
    ready.fetch_add(1);
    while (!go.load()) std::this_thread::yield();
    for (int i = 0; i < kBlocksPerThread; ++i) blocks[self][i] = new int(i);
    allocated.fetch_add(1);
    while (!free_go.load()) std::this_thread::yield();
    for (int* p : blocks[1 - self]) delete p;  // free the other thread's blocks
}

}  // namespace

int main() {
    blocks[0].resize(kBlocksPerThread);
    blocks[1].resize(kBlocksPerThread);
    std::thread a(producer_consumer, 0), b(producer_consumer, 1);
    while (ready.load() < 2) std::this_thread::yield();
    const k15::memory::Stats before = k15::memory::stats();
    go = true;
    while (allocated.load() < 2) std::this_thread::yield();
    const k15::memory::Stats all_live = k15::memory::stats();
    free_go = true;
    a.join();
    b.join();
    const k15::memory::Stats after = k15::memory::stats();
    std::printf("allocated while both ran: %llu\n",
                static_cast<unsigned long long>(all_live.total_allocations - before.total_allocations));
    std::printf("live blocks while both ran: %llu\n",
                static_cast<unsigned long long>(all_live.live_blocks - before.live_blocks));
    std::printf("freed cross-thread: %llu\n", static_cast<unsigned long long>(after.total_frees - all_live.total_frees));
    // The freed pointers must not stay in live memory: the leak scan counts any word inside a
    // block as a pointer to it, so once the freed blocks' memory is reused for the leaks below,
    // these stale words would make some of those leaks "still reachable".
    for (std::vector<int*>& freed : blocks) std::vector<int*>().swap(freed);

    // More threads than the tracker has shards, each with a thread_local destructor.
    std::vector<std::thread> many;
    for (int t = 0; t < 100; ++t) {
        many.emplace_back([t] {
            exit_work.kept = K15_NEW int[t + 1];
            std::vector<int*> local;
            for (int i = 0; i < 1000; ++i) local.push_back(new int(i));
            for (int* p : local) delete p;
        });
    }
    for (auto& t : many) t.join();
    std::puts("threads done");
    return 0;
}
