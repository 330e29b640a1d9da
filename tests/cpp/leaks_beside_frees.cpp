// Small blocks leaked beside blocks that are freed: the tracker keeps header addresses of its
// own (a thread's free lists, its queue of frees of other threads' blocks), and none of them
// may count as the program's pointer. (A compact header's address is the user address of the
// block in front: a scan that took the tracker's state for a root would call leaks here
// "still reachable".)
#include "keep.h"
#include <k15/memory.h>

#include <cstdio>
#include <thread>
#include <vector>

namespace {

constexpr int kCrossThreadPairs = 2000;
constexpr int kSameThreadPairs = 1000;

// Fresh 4-byte blocks in pairs: the first of each pair leaks, the second goes to a thread
// that frees it.
void leak_beside_frees_of_another_thread() {
    auto* to_free = new std::vector<int*>;
    for (int i = 0; i < kCrossThreadPairs; ++i) {
        keep(new int(i));  // LEAK beside a block another thread frees
        to_free->push_back(new int(-i));
    }
    std::thread freer([to_free] {
        for (int* p : *to_free) delete p;
        delete to_free;
    });
    freer.join();
}

// A block freed right after the leak beside it, on this thread: the freed one heads this
// thread's free list when the report is written.
__attribute__((noinline)) void leak_beside_own_frees() {
    for (int i = 0; i < kSameThreadPairs; ++i) {
        int* freed = keep(new int(-i));
        keep(new int(i));  // LEAK beside a block this thread frees
        delete freed;
    }
}

}  // namespace

int main() {
    leak_beside_frees_of_another_thread();
    leak_beside_own_frees();
    // A report now scans this thread's stack and thread-locals too (the tracker's excepted).
    std::printf("midway report written: %d\n", k15::memory::write_leak_report("midway.log"));
    std::printf("leaks_beside_frees: %d leaked\n", kCrossThreadPairs + kSameThreadPairs);
    return 0;
}
