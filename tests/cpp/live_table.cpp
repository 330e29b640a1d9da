// Workers that keep allocating while a report is written, handing their blocks through a global
// table: each round a worker builds a pair (a 64-byte parent holding a 32-byte child; every 16th
// parent is 300 KiB, which the tracker maps and unmaps), swaps it into a random slot and frees
// the pair it took out. Every live pair sits in the table (or in a worker's registers for an
// instant), so the one direct leak is the block main drops at the start (`lost`), and the table's
// pairs are reachable: what the parked run (workers joined first) reports.
//
//   live_table parked        workers stop, then main returns
//   live_table main          main calls exit(0) while the workers run
//   live_table worker        a worker calls exit(0) while the others run
//   live_table sigint        exit(3) from a SIGINT handler sent to main, which churns too
//   live_table midway        main writes the report 10 times (midway_N.log) while they run, then
//                            parks them and returns
//   live_table guard         a live posix_memalign block whose first page is PROT_NONE (a
//                            fiber stack's guard page), kept in a global; main returns
//
// Before it exits (or sends SIGINT), the program prints `exit_ns=` and CLOCK_MONOTONIC in
// nanoseconds: the test measures the exit's time from there.
#include <k15/memory.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "keep.h"

namespace {

constexpr int kSlots = 64;
constexpr int kWorkers = 4;

struct Pair {
    char* child;
};

std::atomic<Pair*> table[kSlots];
std::atomic<bool> stop{false};
std::atomic<int> rounds{0};

Pair* make_pair(unsigned n) {
    const size_t size = n % 16 == 0 ? 300 * 1024 : 64;
    auto* pair = static_cast<Pair*>(operator new(size));
    pair->child = new char[32];
    return pair;
}

void free_pair(Pair* pair) {
    if (pair == nullptr) return;
    delete[] pair->child;
    operator delete(pair);
}

// Unbuffered: printed whichever thread exits, from wherever.
void mark_exit() {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    dprintf(1, "exit_ns=%lld\n", now.tv_sec * 1000000000LL + now.tv_nsec);
}

// One round of the churn; `n` picks the slot and the size.
void churn_once(unsigned n) {
    free_pair(table[(n * 2654435761u >> 7) % kSlots].exchange(make_pair(n)));
    rounds.fetch_add(1, std::memory_order_relaxed);
}

void work(unsigned seed, bool exits) {
    for (unsigned n = seed; !stop.load(std::memory_order_relaxed); n += 7) {
        churn_once(n);
        if (exits && n - seed > 20000 * 7) {
            mark_exit();
            std::exit(0);
        }
    }
}

void exit_from_handler(int) { std::exit(3); }

void wait_for_rounds(int count) {
    while (rounds.load() < count) std::this_thread::yield();
}

}  // namespace

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "parked";
    keep(new char[4242]);  // LEAK: the one direct leak
    if (std::strcmp(mode, "guard") == 0) {
        static void* fiber_stack;
        if (posix_memalign(&fiber_stack, 4096, 8 * 4096) != 0) return 1;
        std::memset(fiber_stack, 0, 8 * 4096);
        mprotect(fiber_stack, 4096, PROT_NONE);  // the guard page, at the block's start
        std::puts("guarded");
        return 0;
    }
    std::vector<std::thread> workers;
    const bool worker_exits = std::strcmp(mode, "worker") == 0;
    for (int i = 0; i < kWorkers; ++i) {
        workers.emplace_back(work, 1000u * i + 1, worker_exits && i == 0);
    }
    wait_for_rounds(5000);
    if (std::strcmp(mode, "main") == 0) {
        mark_exit();
        std::exit(0);
    }
    if (std::strcmp(mode, "worker") == 0) {
        for (;;) pause();
    }
    if (std::strcmp(mode, "sigint") == 0) {
        signal(SIGINT, exit_from_handler);
        const pthread_t main_thread = pthread_self();
        std::thread([main_thread] {
            usleep(20000);
            mark_exit();
            pthread_kill(main_thread, SIGINT);
        }).detach();
        for (unsigned n = 5;; n += 7) churn_once(n);
    }
    if (std::strcmp(mode, "midway") == 0) {
        for (int i = 0; i < 10; ++i) {
            char path[64];
            std::snprintf(path, sizeof path, "midway_%d.log", i);
            k15::memory::write_leak_report(path);
            wait_for_rounds(rounds.load() + 500);
        }
    }
    stop = true;
    for (auto& worker : workers) worker.join();
    return 0;
}
