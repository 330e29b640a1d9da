// Signal handlers against the tracker: a handler that calls exit() while the main thread is
// inside new/delete, and handlers that allocate and free while their thread allocates.
//
//   signals exit DELAY_US        leaks 100 blocks, churns, and exit(3)s from SIGALRM after DELAY_US
//   signals alloc THREADS MS     every thread churns for MS ms (cross-thread frees when THREADS > 1)
//                                while a timer signals each of them every 100 us; each handler
//                                runs new/delete; prints the counts the test checks
//   signals exits THREADS WAVES  WAVES waves of THREADS short-lived threads that churn and free each
//                                other's blocks, then exit (settling those frees stops the world),
//                                while SIGALRM every 50 us lands on any thread, exiting ones too,
//                                and its handler runs new/delete
#include <k15/memory.h>

#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "churn_once.h"
#include "exit_timer.h"

namespace {

constexpr int kept_blocks = 100;
int* kept[kept_blocks];

// Runs `handler` on `signal`, restarting the calls it interrupts.
void handle(int signal, void (*handler)(int)) {
    struct sigaction action;
    std::memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = SA_RESTART;
    sigaction(signal, &action, nullptr);
}

int run_exit(long delay_us) {
    for (int i = 0; i < kept_blocks; ++i) kept[i] = new int(i);
    exit_after(delay_us);
    unsigned step = static_cast<unsigned>(delay_us);
    for (;;) churn_once(step);
}

std::atomic<long> handler_pairs{0};
std::atomic<bool> stop{false};

// Per thread, the block its handler allocated last time: freed by the next handler, so the
// free of a tracked block often lands while the thread is inside the tracker (the case that
// must be deferred). Freed by main at the end.
constexpr int max_threads = 8;
int* previous[max_threads];
thread_local int thread_index = 0;

void allocate_in_handler(int) {
    const int saved_errno = errno;
    int* p = new int[4];
    p[0] = 1;
    delete[] p;
    delete previous[thread_index];
    previous[thread_index] = new int(2);
    handler_pairs.fetch_add(1, std::memory_order_relaxed);
    errno = saved_errno;
}

// Blocks handed between threads, so that frees of other threads' blocks go on all along.
constexpr int slots = 64;
std::atomic<int*> exchange[slots];

// Workers that have set their `thread_index`: a handler that ran before would take another
// thread's `previous` block (both would free it: a double free of the test's own).
std::atomic<int> started{0};

void worker(int index, int threads) {
    thread_index = index;
    started.fetch_add(1);
    unsigned step = 77u + static_cast<unsigned>(index);
    std::vector<int*> own;
    own.reserve(1024);
    while (!stop.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 32; ++i) churn_once(step);
        for (int i = 0; i < 16; ++i) own.push_back(new int(i));
        for (int* p : own) delete p;
        own.clear();
        if (threads > 1) {
            step = step * 1103515245u + 12345u;
            delete exchange[(step >> 8) % slots].exchange(new int(index));
        }
    }
}

// Signals every thread in turn every 100 us (SIGALRM from a timer would go to any thread).
void signaller(const std::vector<pthread_t>& targets) {
    const timespec pause{0, 100000};
    while (started.load() < static_cast<int>(targets.size())) std::this_thread::yield();
    while (!stop.load()) {
        for (pthread_t t : targets) pthread_kill(t, SIGUSR1);
        nanosleep(&pause, nullptr);
    }
}

// Runs the workers (this thread is worker 0) under the signaller until the deadline.
void run_threads(int threads, long ms) {
    std::vector<std::thread> workers;
    std::vector<pthread_t> targets;
    for (int t = 1; t < threads; ++t) {
        workers.emplace_back(worker, t, threads);
        targets.push_back(workers.back().native_handle());
    }
    targets.push_back(pthread_self());
    std::thread timer(signaller, targets);
    std::thread deadline([ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        stop = true;
    });
    worker(0, threads);
    deadline.join();
    timer.join();
    for (auto& w : workers) w.join();
}

void new_delete_in_handler(int) {
    const int saved_errno = errno;
    char* p = new char[33];
    p[0] = 1;
    delete[] p;
    handler_pairs.fetch_add(1, std::memory_order_relaxed);
    errno = saved_errno;
}

int run_exits(int threads, int waves) {
    handle(SIGALRM, new_delete_in_handler);
    for (int i = 0; i < kept_blocks; ++i) kept[i] = new int(i);
    const k15::memory::Stats before = k15::memory::stats();
    const itimerval every{{0, 50}, {0, 50}};
    setitimer(ITIMER_REAL, &every, nullptr);
    for (int wave = 0; wave < waves; ++wave) {
        std::vector<std::thread> wave_threads;
        for (int t = 0; t < threads; ++t) {
            wave_threads.emplace_back([t, wave] {
                unsigned step = 7u + static_cast<unsigned>(t + 31 * wave);
                for (int i = 0; i < 2000; ++i) {
                    churn_once(step);
                    delete exchange[(step >> 8) % slots].exchange(new int(i));
                }
            });
        }
        for (auto& w : wave_threads) w.join();
    }
    const itimerval off{};
    setitimer(ITIMER_REAL, &off, nullptr);
    signal(SIGALRM, SIG_IGN);
    for (auto& slot : exchange) delete slot.exchange(nullptr);
    const k15::memory::Stats after = k15::memory::stats();
    std::printf("handler pairs: %ld\n", handler_pairs.load());
    std::printf("live blocks before: %llu after: %llu\n", static_cast<unsigned long long>(before.live_blocks),
                static_cast<unsigned long long>(after.live_blocks));
    return 0;
}

int run_alloc(int threads, long ms) {
    if (threads < 1 || threads > max_threads) return 2;
    handle(SIGUSR1, allocate_in_handler);
    for (int i = 0; i < kept_blocks; ++i) kept[i] = new int(i);
    const k15::memory::Stats before = k15::memory::stats();
    run_threads(threads, ms);
    // Quiet now: no more signals. Free what is left in the exchange and the handlers' blocks.
    signal(SIGUSR1, SIG_IGN);
    for (auto& slot : exchange) delete slot.exchange(nullptr);
    for (int*& block : previous) delete block;
    const k15::memory::Stats after = k15::memory::stats();
    std::printf("handler pairs: %ld\n", handler_pairs.load());
    std::printf("live blocks before: %llu after: %llu\n", static_cast<unsigned long long>(before.live_blocks),
                static_cast<unsigned long long>(after.live_blocks));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc >= 3 && std::strcmp(argv[1], "exit") == 0) return run_exit(std::atol(argv[2]));
    if (argc >= 4 && std::strcmp(argv[1], "alloc") == 0) return run_alloc(std::atoi(argv[2]), std::atol(argv[3]));
    if (argc >= 4 && std::strcmp(argv[1], "exits") == 0) return run_exits(std::atoi(argv[2]), std::atoi(argv[3]));
    std::fprintf(stderr, "usage: signals exit DELAY_US | signals alloc THREADS MS | signals exits THREADS WAVES\n");
    return 2;
}
