// Two threads delete the same 20,000 blocks, which a third thread (main) allocated: every
// block is freed by exactly one of them, the other delete of it is a double free. Neither
// thread owns the blocks' shard, so both go through the claim of the cookie.
#include <k15/memory.h>

#include <cstdio>
#include <thread>
#include <vector>

int main() {
    constexpr int kBlocks = 20000;
    std::vector<int*> blocks;
    blocks.reserve(kBlocks);
    for (int i = 0; i < kBlocks; ++i) blocks.push_back(new int(i));
    const k15::memory::Stats before = k15::memory::stats();
    auto delete_all = [&blocks] {
        for (int* block : blocks) delete block;
    };
    std::thread first(delete_all);
    std::thread second(delete_all);
    first.join();
    second.join();
    const k15::memory::Stats after = k15::memory::stats();
    // The two std::thread states are allocated and freed in between too.
    std::printf("live blocks dropped by: %lld\n",
                static_cast<long long>(before.live_blocks) - static_cast<long long>(after.live_blocks));
    std::printf("frees: %llu\n", static_cast<unsigned long long>(after.total_frees - before.total_frees));
    // The heap hands the freed blocks out again, whole.
    std::vector<int*> again;
    for (int i = 0; i < kBlocks; ++i) again.push_back(new int(i));
    for (int i = 0; i < kBlocks; ++i)
        if (*again[i] != i) std::printf("block %d overwritten\n", i);
    for (int* block : again) delete block;
    std::printf("done\n");
    return 0;
}
