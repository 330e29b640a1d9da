// Signal handlers that free blocks while their thread is inside the tracker.
//
//   handler_bursts          each handler frees 300 blocks: the main thread checks the heap over
//                           and over (100,000 blocks to walk) while another thread sends it
//                           SIGUSR1 every 300 us, until 200 handlers have freed their 60,000
//                           blocks; then it leaks 7. Prints the live blocks (the 100,000 it keeps
//                           and the 7) and how many handlers ran inside a heap check.
//   handler_bursts storm S  for S seconds a thread sends SIGUSR1 without a pause, each handler
//                           replacing 4 blocks of a table of 4,096 that the main loop replaces
//                           too; then the table is freed. Prints the live blocks (none).
//
// A thread's record of deferred frees holds 128: before, the rest were counted unrecorded and
// their blocks stayed live in the counters.
#include <k15/memory.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "keep.h"

namespace {

constexpr int kBatches = 200;
constexpr int kBatch = 300;
char* pool[kBatches * kBatch];
char* kept[100000];
std::atomic<int> next_batch{0};
std::atomic<bool> checking{false};
std::atomic<int> inside_a_check{0};
std::atomic<bool> done{false};

extern "C" void free_a_batch(int) {
    int batch = next_batch.fetch_add(1);
    if (batch >= kBatches) {
        return;
    }
    if (checking.load()) {
        inside_a_check.fetch_add(1);
    }
    for (int i = 0; i < kBatch; ++i) {
        delete[] pool[batch * kBatch + i];
        pool[batch * kBatch + i] = nullptr;
    }
}

// Installs `handler` for SIGUSR1 and starts a thread that sends it to the calling thread, with
// `pause_us` between two signals, until `done`.
std::thread signal_this_thread(void (*handler)(int), int flags, useconds_t pause_us) {
    struct sigaction action {};
    action.sa_handler = handler;
    action.sa_flags = flags;
    sigaction(SIGUSR1, &action, nullptr);
    pthread_t target = pthread_self();
    return std::thread([target, pause_us] {
        while (!done.load()) {
            pthread_kill(target, SIGUSR1);
            if (pause_us > 0) {
                usleep(pause_us);
            }
        }
    });
}

constexpr unsigned kSlots = 4096;
std::atomic<char*> slots[kSlots];
std::atomic<unsigned> cursor{0};

extern "C" void replace_four(int) {
    for (int i = 0; i < 4; ++i) {
        unsigned at = cursor.fetch_add(7919) % kSlots;
        delete[] slots[at].exchange(new char[16 + at % 64]);
    }
}

int storm(int seconds) {
    for (auto& slot : slots) {
        slot = new char[24];
    }
    std::thread sender = signal_this_thread(replace_four, SA_RESTART, 0);
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    for (unsigned i = 0; std::chrono::steady_clock::now() < end;) {
        for (int k = 0; k < 1000; ++k, ++i) {
            delete[] slots[(i * 2654435761u) % kSlots].exchange(new char[8 + i % 100]);
        }
    }
    done.store(true);
    sender.join();
    for (auto& slot : slots) {
        delete[] slot.exchange(nullptr);
    }
    std::printf("live blocks: %llu\n",
                static_cast<unsigned long long>(k15::memory::stats().live_blocks));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 2 && std::strcmp(argv[1], "storm") == 0) {
        return storm(std::atoi(argv[2]));
    }
    for (auto& p : pool) {
        p = keep(new char[32]);
    }
    for (auto& p : kept) {
        p = keep(new char[48]);
    }
    std::thread sender = signal_this_thread(free_a_batch, 0, 300);
    while (next_batch.load() < kBatches) {
        checking.store(true);
        k15::memory::check_heap();
        checking.store(false);
    }
    done.store(true);
    sender.join();
    for (int i = 0; i < 7; ++i) {
        keep(new char[100]);
    }
    std::printf("handlers inside a check: %d\n", inside_a_check.load());
    std::printf("live blocks: %llu\n",
                static_cast<unsigned long long>(k15::memory::stats().live_blocks));
    return 0;
}
