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
#include "keep.h"
#include <k15/memory.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
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
