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

// A block allocated at the end of one of 2^depth call paths (each level calls down from one of
// two call sites, by a bit of `path`): a parser's or a scene walk's stacks, new ones all the time,
// which is when the tracker keeps stacks in its ring rather than interning them at once.
[[gnu::noinline]] char* descend(int depth, unsigned path, std::size_t size) {
    char* block;
    if (depth == 0) {
        block = keep(new char[size]);
    } else if (path & 1) {
        block = descend(depth - 1, path >> 1, size);
        asm volatile("" ::: "memory");  // no tail call: every level keeps its frame
    } else {
        block = descend(depth - 1, path >> 1, size + 8);
        asm volatile("" ::: "memory");
    }
    return block;
}

// `total` blocks down new paths, each freed 16 allocations later.
void churn_many(int total, std::size_t size_base) {
    static std::atomic<unsigned> seed{1};
    unsigned path = seed.fetch_add(0x9e3779b9u);
    std::vector<char*> held;
    for (int i = 0; i < total; ++i) {
        path = path * 1664525u + 1013904223u;
        held.push_back(descend(14, path >> 8, size_base));
        if (held.size() > 16) {
            delete[] held.front();
            held.erase(held.begin());
        }
    }
    for (char* block : held) delete[] block;
}

void outlive() {
    churn_many(10000, 16);  // the ring comes into use
    sink = leak_small_early();
    sink = leak_large_early();
    sink = nullptr;
    churn_many(200000, 16);
    sink = leak_small_late();
    sink = leak_large_late();
    sink = nullptr;
}

void double_free() {
    churn_many(10000, 16);
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
            churn_many(10000, 32);
            sink = made_by_worker();
            sink = nullptr;
            churn_many(20000, 32);
        });
    }
    for (int t = 0; t < 8; ++t) {
        std::thread([] {
            churn_many(10000, 32);
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
            churn_many(50, 48);
        }
        made_all = true;
        while (!stop) churn_many(100, 48);
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
