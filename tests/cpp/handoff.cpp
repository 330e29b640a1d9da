// A job-system pattern: a producer thread allocates a batch of blocks, a consumer thread deletes
// them (each a cross-thread free), round after round. The freed memory must come back to the
// producer (resident memory stays flat), the counts stay exact, and a second delete of a block
// freed on the other thread is still caught. Prints what it measured.
#include <k15/memory.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>
#include "resident.h"

namespace {

constexpr int kRounds = 300;
constexpr int kBlocksPerRound = 10000;

std::mutex handoff_lock;
std::condition_variable handoff;
std::vector<char*> batch;
int round_ready = -1;  // the round whose batch waits for the consumer
int round_freed = -1;  // the last round the consumer freed

void producer() {
    std::vector<char*> made;
    for (int round = 0; round < kRounds; ++round) {
        made.clear();
        for (int i = 0; i < kBlocksPerRound; ++i) {
            char* block = new char[64 + (i * 37) % 449];
            block[0] = static_cast<char>(i);
            made.push_back(block);
        }
        std::unique_lock<std::mutex> lock(handoff_lock);
        handoff.wait(lock, [&] { return round_freed == round - 1; });
        batch.swap(made);
        round_ready = round;
        handoff.notify_all();
    }
}

char* consumer() {
    char* last_freed = nullptr;
    std::vector<char*> taken;
    for (int round = 0; round < kRounds; ++round) {
        {
            std::unique_lock<std::mutex> lock(handoff_lock);
            handoff.wait(lock, [&] { return round_ready == round; });
            taken.swap(batch);
        }
        for (char* block : taken) delete[] block;  // blocks of the producer's thread
        last_freed = taken.back();
        taken.clear();
        std::lock_guard<std::mutex> lock(handoff_lock);
        round_freed = round;
        handoff.notify_all();
    }
    return last_freed;
}

}  // namespace

int main() {
    batch.reserve(kBlocksPerRound);
    const k15::memory::Stats before = k15::memory::stats();
    long resident_after_warm_up = 0;
    char* last_freed = nullptr;
    std::thread make(producer);
    std::thread take([&] { last_freed = consumer(); });
    {
        std::unique_lock<std::mutex> lock(handoff_lock);
        handoff.wait(lock, [] { return round_freed >= 20; });
        resident_after_warm_up = resident_kib();
    }
    make.join();
    take.join();
    const k15::memory::Stats after = k15::memory::stats();
    std::printf("resident growth after warm-up KiB: %ld\n", resident_kib() - resident_after_warm_up);
    std::printf("allocations: %llu\n",
                static_cast<unsigned long long>(after.total_allocations - before.total_allocations));
    std::printf("frees: %llu\n", static_cast<unsigned long long>(after.total_frees - before.total_frees));
    std::printf("live blocks left: %llu\n",
                static_cast<unsigned long long>(after.live_blocks - before.live_blocks));
    delete[] last_freed;  // a second delete of a block the consumer freed: reported, ignored
    std::puts("done");
    return 0;
}
