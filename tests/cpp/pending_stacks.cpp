// Stacks kept in a ring until their block outlives its place there (`pending_stacks <how>`): the
// stack a report or an error shows must be the block's own wherever it was when it was needed.
//
//   outlive      blocks leaked early, then 200,000 allocations of many depths (the ring comes
//                round many times), then blocks leaked just before exit (still in the ring)
//   double_free  a block freed, then 100,000 allocations of another size (its memory is not
//                reused, its entry is long gone), then freed again; and one freed twice at once
//   threads      16 threads each leak a block and churn, half of them exit before the report
//                and half are still blocked in it; 4 more threads each double-free 100 blocks
//                that a churning thread made (its ring changing under the reader)
#include <k15/memory.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "keep.h"

namespace {

void* volatile sink;

[[gnu::noinline]] char* leak_small_early() { return keep(new char[8]); }       // ALLOC small_early
[[gnu::noinline]] char* leak_large_early() { return keep(new char[200]); }     // ALLOC large_early
[[gnu::noinline]] char* leak_small_late() { return keep(new char[12]); }       // ALLOC small_late
[[gnu::noinline]] char* leak_large_late() { return keep(new char[300]); }      // ALLOC large_late
[[gnu::noinline]] char* made_by_worker() { return keep(new char[24]); }        // ALLOC worker
[[gnu::noinline]] char* made_to_free_twice() { return keep(new char[40]); }    // ALLOC twice
[[gnu::noinline]] char* made_for_another() { return keep(new char[56]); }      // ALLOC handed

// Allocations `depth` calls deep, of sizes that vary with the depth: distinct stacks, blocks
// freed at once or a while later.
[[gnu::noinline]] void churn(int depth, int count, std::size_t size_base) {
    if (depth > 0) {
        churn(depth - 1, count, size_base);
        asm volatile("" ::: "memory");  // no tail call: every level keeps its frame
        return;
    }
    std::vector<char*> held;
    for (int i = 0; i < count; ++i) {
        held.push_back(keep(new char[size_base + (i % 7) * 8]));
        if (held.size() > 16) {
            delete[] held.front();
            held.erase(held.begin());
        }
    }
    for (char* block : held) delete[] block;
}

void churn_many(int total, std::size_t size_base) {
    for (int round = 0; total > 0; ++round) {
        const int count = 100;
        churn(round % 23, count, size_base);
        total -= count;
    }
}

void outlive() {
    sink = leak_small_early();
    sink = leak_large_early();
    sink = nullptr;
    churn_many(200000, 16);
    sink = leak_small_late();
    sink = leak_large_late();
    sink = nullptr;
}

void double_free() {
    char* late = made_to_free_twice();
    delete[] late;
    churn_many(100000, 400);  // blocks of another class: `late`'s memory stays free
    delete[] late;            // FREE late_again
    char* soon = made_to_free_twice();
    delete[] soon;
    delete[] soon;  // FREE soon_again
}

// Threads that stay blocked through the report (in `pause`, till the process ends).
std::atomic<int> blocked_ready{0};

void threads() {
    std::vector<std::thread> exiting;
    for (int t = 0; t < 8; ++t) {
        exiting.emplace_back([] {
            sink = made_by_worker();
            sink = nullptr;
            churn_many(20000, 32);
        });
    }
    for (int t = 0; t < 8; ++t) {
        std::thread([] {
            sink = made_by_worker();
            sink = nullptr;
            churn_many(5000, 32);
            blocked_ready.fetch_add(1);
            for (;;) pause();
        }).detach();
    }
    for (auto& t : exiting) t.join();

    // A thread that makes blocks for others and keeps churning while they free them twice.
    std::vector<char*> handed;
    std::mutex handed_lock;
    std::atomic<bool> made_all{false};
    std::atomic<bool> stop{false};
    std::thread maker([&] {
        for (int i = 0; i < 400; ++i) {
            char* block = made_for_another();
            {
                std::lock_guard<std::mutex> hold(handed_lock);
                handed.push_back(block);
            }
            churn(i % 9, 50, 48);
        }
        made_all = true;
        while (!stop) churn(3, 100, 48);
    });
    std::vector<std::thread> freeing;
    for (int t = 0; t < 4; ++t) {
        freeing.emplace_back([&] {
            for (int done = 0; done < 100;) {
                char* block = nullptr;
                {
                    std::lock_guard<std::mutex> hold(handed_lock);
                    if (!handed.empty()) {
                        block = handed.back();
                        handed.pop_back();
                    }
                }
                if (block == nullptr) {
                    if (made_all) break;
                    std::this_thread::yield();
                    continue;
                }
                delete[] block;
                delete[] block;  // FREE handed_again
                ++done;
            }
        });
    }
    for (auto& t : freeing) t.join();
    stop = true;
    maker.join();
    while (blocked_ready.load() < 8) std::this_thread::yield();
}

}  // namespace

int main(int argc, char** argv) {
    const std::string how = argc > 1 ? argv[1] : "";
    if (how == "outlive") {
        outlive();
    } else if (how == "double_free") {
        double_free();
    } else if (how == "threads") {
        threads();
    } else {
        std::fprintf(stderr, "unknown mode %s\n", how.c_str());
        return 2;
    }
    std::printf("last line\n");
    return 0;
}
