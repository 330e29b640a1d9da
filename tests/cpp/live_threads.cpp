// Threads still alive when the program exits (or writes a report midway), holding blocks where
// only they can reach them: in a local while blocked in a system call, in a local while running
// on a core, in a thread_local, in a local while waiting on a condition variable. Each thread
// also leaks one block nothing holds. valgrind scans such threads' stacks from where they stand.
//
//   live_threads           the threads are alive at exit
//   live_threads midway    the report is also written (to midway.log) while they run
//   live_threads crowd     500 threads alive at exit, each holding a 7000-byte block in a local
//                          and dropping a 7001-byte one, while 4 threads keep starting short-lived
//                          threads that allocate and exit, and reports are written midway
//   live_threads unallocated   a thread that never allocates spins on a core, holding only its
//                          std::thread state (whose lambda holds a 9001-byte block); the report
//                          is written midway (unallocated.log) and at exit
//   live_threads register  a thread holds a block in a register alone (r15, its stack scrubbed)
//                          while it spins when a report is written midway (register_midway.log)
//                          and when the process exits
//   live_threads exits     the same, after 6,000 threads ended every way (returning, pthread_exit,
//                          cancelled, std::thread) while a second thread starts threads and the
//                          first forks children that do the same (their reports: child_N.log)
#include "keep.h"
#include <k15/memory.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace {

std::atomic<int> ready{0};
thread_local char* kept_by_thread_local;

__attribute__((noinline)) void blocked_in_a_system_call() {
    char* volatile held = new char[6001];
    kept_by_thread_local = new char[6002];
    keep(new char[6003]);  // LEAK: nothing holds it
    held[0] = 1;
    ++ready;
    for (;;) pause();
}

__attribute__((noinline)) void running_on_a_core() {
    keep(new char[6013]);  // LEAK (first: its address must not linger in a register)
    char* volatile held = new char[6011];
    ++ready;
    for (;;) held[1] = held[0];
}

// Never destroyed: glibc's pthread_cond_destroy waits for the waiter, which never leaves.
auto* lock = new std::mutex;
auto* wake = new std::condition_variable;

__attribute__((noinline)) void waiting_on_a_condition() {
    std::unique_ptr<std::vector<char>> held(new std::vector<char>(6021));
    keep(new char[6023]);  // LEAK
    std::unique_lock<std::mutex> guard(*lock);
    ++ready;
    wake->wait(guard, [] { return false; });
}

__attribute__((noinline)) void hold_one_and_wait() {
    char* volatile held = new char[7000];
    keep(new char[7001]);  // LEAK
    held[0] = 1;
    ++ready;
    for (;;) pause();
}

std::atomic<bool> spinning{false};

// Returns before the report, so that nothing of its frame is read as main's.
__attribute__((noinline)) void start_a_thread_that_never_allocates() {
    char* block = new char[9001];
    std::thread([block] {
        spinning = true;
        auto* bytes = static_cast<volatile char*>(block);
        for (;;) bytes[0] = bytes[1];
    }).detach();
    keep(new char[9002]);  // LEAK
}

std::atomic<bool> in_a_register{false};

// Overwrites the stack below the caller: no stale copy of a pointer is left there.
__attribute__((noinline)) void scrub_stack() {
    volatile char bytes[64 * 1024];
    for (auto& byte : bytes) byte = 0;
}

__attribute__((noinline)) void hold_in_a_register_alone() {
    char* volatile block = new char[9101];
    asm volatile("mov %0, %%r15" : : "m"(block) : "r15");
    block = nullptr;
    scrub_stack();  // r15 is callee-saved: it survives the call
    in_a_register = true;
    asm volatile("1: pause\n\tjmp 1b" : : : "memory");
}

void* returns(void*) { return nullptr; }
void* exits(void*) { pthread_exit(nullptr); }
void* waits_to_be_cancelled(void*) {
    for (;;) pause();
}

// Threads ending every way, `count` of them: each must leave the record of threads.
void end_threads_every_way(int count) {
    for (int i = 0; i < count; ++i) {
        pthread_t thread;
        switch (i % 4) {
            case 0: pthread_create(&thread, nullptr, returns, nullptr); break;
            case 1: pthread_create(&thread, nullptr, exits, nullptr); break;
            case 2:
                pthread_create(&thread, nullptr, waits_to_be_cancelled, nullptr);
                pthread_cancel(thread);
                break;
            default: std::thread([] {}).join(); continue;
        }
        pthread_join(thread, nullptr);
    }
}

void end_threads_while_forking() {
    std::atomic<bool> done{false};
    std::thread starter([&done] {
        while (!done) end_threads_every_way(1);
    });
    for (int round = 0; round < 3; ++round) {
        end_threads_every_way(2000);
        const pid_t child = fork();
        if (child == 0) {
            end_threads_every_way(600);
            start_a_thread_that_never_allocates();
            while (!spinning) usleep(1000);
            char log[32];
            std::snprintf(log, sizeof log, "child_%d.log", round);
            k15::memory::write_leak_report(log);
            _exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::abort();
    }
    done = true;
    starter.join();
}

void crowd() {
    std::atomic<bool> done{false};
    std::vector<std::thread> churners;
    for (int c = 0; c < 4; ++c) {
        churners.emplace_back([&done] {
            while (!done) {
                std::thread([] { delete[] keep(new char[64]); }).join();
            }
        });
    }
    for (int t = 0; t < 500; ++t) {
        std::thread(hold_one_and_wait).detach();
    }
    while (ready < 500) usleep(1000);
    for (int i = 0; i < 3; ++i) k15::memory::write_leak_report("crowd_midway.log");
    done = true;
    for (auto& churner : churners) churner.join();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "crowd") == 0) {
        crowd();
        return 0;
    }
    if (argc > 1 && std::strcmp(argv[1], "register") == 0) {
        std::thread(hold_in_a_register_alone).detach();
        while (!in_a_register) usleep(1000);
        k15::memory::write_leak_report("register_midway.log");
        return 0;
    }
    if (argc > 1 && (std::strcmp(argv[1], "unallocated") == 0 || std::strcmp(argv[1], "exits") == 0)) {
        if (std::strcmp(argv[1], "exits") == 0) end_threads_while_forking();
        start_a_thread_that_never_allocates();
        while (!spinning) usleep(1000);
        k15::memory::write_leak_report("unallocated.log");
        return 0;
    }
    for (auto body : {blocked_in_a_system_call, running_on_a_core, waiting_on_a_condition}) {
        std::thread(body).detach();
    }
    while (ready < 3) usleep(1000);
    usleep(20000);
    if (argc > 1 && std::strcmp(argv[1], "midway") == 0) {
        k15::memory::write_leak_report("midway.log");
    }
    keep(new char[6033]);  // LEAK, on the exiting thread
    return 0;
}
