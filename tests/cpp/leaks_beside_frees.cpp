// Small blocks leaked beside blocks that another thread frees: the tracker queues such frees
// and keeps header addresses of its own, and none of that may count as the program's pointer.
// (A compact header's address is the user address of the block in front: a scan that took the
// tracker's queue for a root would call every leak here "still reachable".)
#include "keep.h"
#include <k15/memory.h>

#include <cstdio>
#include <thread>
#include <vector>

namespace {

constexpr int kPairs = 2000;

}  // namespace

int main() {
    // Fresh 4-byte blocks, in pairs: the first of each pair leaks, the second goes to a thread
    // that frees it.
    auto* to_free = new std::vector<int*>;
    for (int i = 0; i < kPairs; ++i) {
        keep(new int(i));  // LEAK beside a block another thread frees
        to_free->push_back(new int(-i));
    }
    std::thread freer([to_free] {
        for (int* p : *to_free) delete p;
        delete to_free;
    });
    freer.join();
    std::printf("leaks_beside_frees: %d leaked\n", kPairs);
    return 0;
}
