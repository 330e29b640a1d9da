// The heap's blocks are found by walking its spans, with the world stopped: 200 threads allocate
// (heap sizes, large and over-aligned blocks, which are on shard lists instead) and free their
// own and each other's blocks, while another thread calls check_heap() and stats() in a loop.
// No damage may be found, and the report must list exactly the one block each thread leaks.
#include <k15/memory.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 200;
constexpr int kRounds = 1500;
constexpr int kSlots = 1024;

// Blocks passed between threads: whoever takes one out frees it.
std::atomic<char*> slots[kSlots];
std::atomic<bool> done{false};

struct Random {
    unsigned long state;
    unsigned next() {
        state = state * 6364136223846793005UL + 1442695040888963407UL;
        return static_cast<unsigned>(state >> 33);
    }
};

// A block's first byte says how it was allocated.
constexpr char kArray = 0;
constexpr char kAligned = 1;

char* make(Random& random) {
    const unsigned pick = random.next() % 100;
    char* block;
    if (pick == 0) {
        block = K15_NEW char[150 * 1024];  // large: mapped, on a shard list
    } else if (pick == 1) {
        // over-aligned: from glibc, on a shard list
        block = static_cast<char*>(::operator new(48, std::align_val_t(128)));
        block[0] = kAligned;
        return block;
    } else {
        block = K15_NEW char[1 + random.next() % 400];
    }
    block[0] = kArray;
    return block;
}

void release(char* block) {
    if (block[0] == kAligned) {
        ::operator delete(block, std::align_val_t(128));
    } else {
        delete[] block;
    }
}

void worker(int index) {
    Random random{static_cast<unsigned long>(index) * 7919 + 1};
    std::vector<char*> own;
    for (int round = 0; round < kRounds; ++round) {
        (void)round;
        char* block = make(random);
        if (random.next() % 2 == 0) {
            own.push_back(block);
        } else {
            char* taken = slots[random.next() % kSlots].exchange(block);
            if (taken != nullptr) release(taken);  // another thread's block, most likely
        }
        if (own.size() > 16) {
            const std::size_t at = random.next() % own.size();
            release(own[at]);
            own[at] = own.back();
            own.pop_back();
        }
    }
    for (char* block : own) release(block);
    char* leaked = K15_NEW char[1000 + index];  // LEAK
    leaked[0] = 1;
}

}  // namespace

int main() {
    std::atomic<int> damage{0};
    std::atomic<int> walks{0};
    std::thread checker([&] {
        while (!done.load()) {
            damage += static_cast<int>(k15::memory::check_heap());
            const k15::memory::Stats stats = k15::memory::stats();
            if (stats.total_frees > stats.total_allocations) ++damage;
            ++walks;
        }
    });
    std::vector<std::thread> threads;
    for (int index = 0; index < kThreads; ++index) threads.emplace_back(worker, index);
    for (std::thread& thread : threads) thread.join();
    done = true;
    checker.join();
    for (std::atomic<char*>& slot : slots) {
        char* block = slot.exchange(nullptr);
        if (block != nullptr) release(block);
    }
    std::printf("damage %d\n", damage.load());
    std::printf("walks %s\n", walks.load() > 0 ? "some" : "none");
    std::printf("last line\n");
    return 0;
}
