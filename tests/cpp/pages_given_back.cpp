// The pages the heap gives back are never a live block's: 8 threads allocate blocks of 16 bytes
// to 120 KB (the classes whose free blocks give back the pages inside them among them), fill
// each with a pattern of its own, hand a third of them to the next thread to free, let whole
// classes go idle for a while, and check every byte of every block before it is freed. Prints
// how many blocks were checked and how many bytes differed.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 8;
constexpr int kRounds = 60;

struct Block {
    unsigned char* bytes;
    std::size_t size;
    unsigned char pattern;
};

std::mutex handoff_lock;
std::vector<Block> handoff[kThreads];
std::atomic<long> checked{0};
std::atomic<long> damaged{0};

std::uint32_t next_random(std::uint32_t& state) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
}

Block make(std::size_t size, std::uint32_t& state) {
    Block b{new unsigned char[size], size, static_cast<unsigned char>(next_random(state) | 1)};
    std::memset(b.bytes, b.pattern, size);
    return b;
}

void check_and_free(const Block& b) {
    long wrong = 0;
    for (std::size_t i = 0; i < b.size; ++i) wrong += b.bytes[i] != b.pattern;
    damaged += wrong;
    ++checked;
    delete[] b.bytes;
}

void worker(int id) {
    std::uint32_t state = 0x9e3779b9u * (id + 1);
    std::vector<Block> mine;
    for (int round = 0; round < kRounds; ++round) {
        // Each round uses a few classes only, so that the others go idle and give back.
        const std::size_t small = 16 + 48 * (round % 7);
        const std::size_t large = 8192 + 4096 * (round % 29);
        for (int i = 0; i < 400; ++i) {
            mine.push_back(make(i % 8 == 0 ? large : small + (next_random(state) % 32), state));
        }
        std::vector<Block> kept;
        for (std::size_t i = 0; i < mine.size(); ++i) {
            switch (next_random(state) % 3) {
                case 0:
                    check_and_free(mine[i]);
                    break;
                case 1: {
                    std::lock_guard<std::mutex> lock(handoff_lock);
                    handoff[(id + 1) % kThreads].push_back(mine[i]);
                    break;
                }
                default:
                    kept.push_back(mine[i]);
            }
        }
        mine.swap(kept);
        std::vector<Block> given;
        {
            std::lock_guard<std::mutex> lock(handoff_lock);
            given.swap(handoff[id]);
        }
        for (const Block& b : given) check_and_free(b);
    }
    for (const Block& b : mine) check_and_free(b);
}

}  // namespace

int main() {
    std::vector<std::thread> threads;
    for (int id = 0; id < kThreads; ++id) threads.emplace_back(worker, id);
    for (std::thread& t : threads) t.join();
    for (auto& blocks : handoff) {
        for (const Block& b : blocks) check_and_free(b);
    }
    std::printf("checked %ld damaged %ld\n", checked.load(), damaged.load());
    return 0;
}
