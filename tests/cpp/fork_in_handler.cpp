// A timer's signal handler that forks while threads churn new/delete: SIGALRM lands on one of the
// churning threads (one inside new/delete, inside the C runtime's allocator, or exiting; the main
// thread blocks it) and its handler forks a child that runs new/delete and _exits; the parent
// reaps it, kills a child still there after 2 s (counted as stuck), and arms the timer again:
// the next signal comes 0.5 ms after the handler returns. Builds with and without the tracker.
//
//   fork_in_handler waves WAVES   WAVES waves of 3 threads that churn, then exit
//   fork_in_handler steady MS     3 long-lived threads churn for MS ms
//
// Prints "forks: N" (children that exited by themselves with status 0), "stuck children: N", and
// "glibc bytes: N": what glibc's allocator took from the system (0: it was never used).
#include <k15/memory.h>

#include <malloc.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>
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

namespace {

std::atomic<long> forks{0};
std::atomic<long> stuck{0};
std::atomic<bool> stop{false};

// Waits up to 2 s for `child` (only async-signal-safe calls); kills it if it is still there.
void reap(pid_t child) {
    const timespec pause{0, 100000};
    for (int polls = 0; polls < 20000; ++polls) {
        int status = 0;
        const pid_t done = waitpid(child, &status, WNOHANG);
        if (done == child) {
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0) forks.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        if (done < 0 && errno != EINTR) return;
        nanosleep(&pause, nullptr);
    }
    stuck.fetch_add(1, std::memory_order_relaxed);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
}

// Armed for one signal at a time, 0.5 ms ahead. A periodic timer (every 1.5 ms) kept a thread
// inside handlers for good on a loaded machine, where a fork and its reap (a 1 ms sleep at least)
// outlast the period: the signal the kernel held meanwhile landed as soon as the handler
// returned, and the thread made no progress (15 runs of 200 killed in CI: a livelock of the
// test's own making; no thread waited on the tracker).
std::atomic<bool> timer_stopped{false};

void arm_timer() {
    const itimerval once{{0, 0}, {0, 500}};
    setitimer(ITIMER_REAL, &once, nullptr);
}

void fork_in_handler(int) {
    const int saved_errno = errno;
    const pid_t child = fork();
    if (child == 0) {
        char* p = new char[40];
        p[0] = 1;
        delete[] p;
        _exit(0);
    }
    if (child > 0) reap(child);
    if (!timer_stopped.load(std::memory_order_relaxed)) arm_timer();
    errno = saved_errno;
}

// The main thread, which only waits for the others, blocks the signal: it lands on a churning or
// exiting thread. The threads it starts take its mask, and unblock the signal first thing.
void set_alarm_blocked(bool blocked) {
    sigset_t alarm;
    sigemptyset(&alarm);
    sigaddset(&alarm, SIGALRM);
    pthread_sigmask(blocked ? SIG_BLOCK : SIG_UNBLOCK, &alarm, nullptr);
}

void start_timer() {
    struct sigaction action;
    std::memset(&action, 0, sizeof action);
    action.sa_handler = fork_in_handler;
    action.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &action, nullptr);
    set_alarm_blocked(true);
    arm_timer();
}

void stop_timer() {
    timer_stopped = true;
    const itimerval off{};
    setitimer(ITIMER_REAL, &off, nullptr);
    signal(SIGALRM, SIG_IGN);
}

void run_waves(int waves) {
    for (int wave = 0; wave < waves; ++wave) {
        std::vector<std::thread> threads;
        for (int t = 0; t < 3; ++t) {
            threads.emplace_back([t, wave] {
                set_alarm_blocked(false);
                unsigned step = 7u + static_cast<unsigned>(t + 31 * wave);
                for (int i = 0; i < 3000; ++i) churn_once(step);
            });
        }
        for (auto& thread : threads) thread.join();
    }
}

void run_steady(long ms) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
        threads.emplace_back([t] {
            set_alarm_blocked(false);
            unsigned step = 7u + static_cast<unsigned>(t);
            while (!stop.load(std::memory_order_relaxed)) churn_once(step);
        });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    stop = true;
    for (auto& thread : threads) thread.join();
}

}  // namespace

int main(int argc, char** argv) {
    const bool waves = argc >= 3 && std::strcmp(argv[1], "waves") == 0;
    const bool steady = argc >= 3 && std::strcmp(argv[1], "steady") == 0;
    if (!waves && !steady) {
        std::fprintf(stderr, "usage: fork_in_handler waves WAVES | fork_in_handler steady MS\n");
        return 2;
    }
    start_timer();
    if (waves) {
        run_waves(std::atoi(argv[2]));
    } else {
        run_steady(std::atol(argv[2]));
    }
    stop_timer();
    const struct mallinfo2 glibc = mallinfo2();
    std::printf("forks: %ld\nstuck children: %ld\nglibc bytes: %zu\n", forks.load(), stuck.load(),
                glibc.arena + glibc.hblkhd);
    return 0;
}
