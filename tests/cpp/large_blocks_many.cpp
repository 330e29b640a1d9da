// Thousands of large blocks alive at once (more than the tracker lists for its quick lookup),
// from four threads: each made with malloc or new[], grown and shrunk by realloc (the pages
// move), its first and last bytes checked, freed in a shuffled order but for the first and the
// last block each thread made, which the main thread frees after all others and then a second
// time (the tracker remembers the latest 1,024 large blocks it unmapped).
// Prints "twice SIZE" for each block freed twice, "checked N wrong M" (blocks whose bytes were
// found as written, or not) and "done".
#include <k15/memory.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 4;
constexpr int kBlocksEach = 1500;

struct Block {
    unsigned char* bytes;
    std::size_t size;
    bool array;
};

std::atomic<long> checked{0};
std::atomic<long> wrong{0};

void fill(const Block& b, unsigned char mark) {
    b.bytes[0] = mark;
    b.bytes[b.size - 1] = mark;
}

void check(const Block& b, unsigned char mark) {
    if (b.bytes[0] == mark && b.bytes[b.size - 1] == mark) {
        checked.fetch_add(1);
    } else {
        wrong.fetch_add(1);
    }
}

void release(const Block& b) {
    if (b.array) {
        delete[] b.bytes;
    } else {
        std::free(b.bytes);
    }
}

void work(int id, std::vector<Block>* twice) {
    std::mt19937 rng(id);
    std::vector<Block> blocks;
    for (int i = 0; i < kBlocksEach; ++i) {
        Block b{nullptr, 125000 + rng() % 200000, i % 3 == 0};
        b.bytes = b.array ? new unsigned char[b.size] : static_cast<unsigned char*>(std::malloc(b.size));
        fill(b, static_cast<unsigned char>(i));
        blocks.push_back(b);
    }
    for (int i = 0; i < kBlocksEach; ++i) {
        Block& b = blocks[i];
        check(b, static_cast<unsigned char>(i));
        if (!b.array && i % 2 == 0) {
            // Grown past its pages (mremap may move it), then shrunk: its first byte stays.
            std::size_t grown = b.size * 3;
            b.bytes = static_cast<unsigned char*>(std::realloc(b.bytes, grown));
            b.size = grown;
            fill(b, static_cast<unsigned char>(i));
            b.size = grown / 4;
            b.bytes = static_cast<unsigned char*>(std::realloc(b.bytes, b.size));
            fill(b, static_cast<unsigned char>(i));
            check(b, static_cast<unsigned char>(i));
        }
    }
    std::vector<int> order(kBlocksEach);
    for (int i = 0; i < kBlocksEach; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (int i : order) {
        check(blocks[i], static_cast<unsigned char>(i));
        if (i == 0 || i == kBlocksEach - 1) {
            twice[id].push_back(blocks[i]);
        } else {
            release(blocks[i]);
        }
    }
}

}  // namespace

int main() {
    std::vector<Block> twice[kThreads];
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t, twice);
    for (auto& t : threads) t.join();
    // Freed last, so that their second frees come soon after.
    for (auto& blocks : twice) {
        for (const Block& b : blocks) release(b);
    }
    for (auto& blocks : twice) {
        for (const Block& b : blocks) {
            std::printf("twice %zu\n", b.size);
            release(b);
        }
    }
    std::printf("checked %ld wrong %ld\n", checked.load(), wrong.load());
    std::puts("done");
    return 0;
}
