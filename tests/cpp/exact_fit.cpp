// One-byte overruns of blocks whose size fills their size class exactly (`exact_fit <how> <size>`):
// no guard bytes lie behind such a block, only the next block's header (or a span's guard word),
// and the tracker must still catch the byte and blame the block in front.
//
//   delete      the byte lands in a live neighbour's header, found at the neighbour's delete
//   reuse       the byte lands in a free neighbour's header, found when `new` reuses it
//   check_heap  the byte lands in a live neighbour's header, found by check_heap()
//   span_end    the block is the last one of a span: the byte lands in the span's guard word
//   freed_first the block is deleted before its live neighbour: the damage is seen at its delete
//               and confirmed at the neighbour's
//   freed_alone the neighbour is freed first, then the block: seen at its delete, confirmed when
//               the free neighbour's header is next read (at exit, at the latest)
//   only_one    the only block of its class, deleted: the byte lands in its span's guard word,
//               seen at its delete, confirmed when the span empties (at exit, before it goes)
//   threads     no overrun at all: 8 threads make and delete exact fits of `size` * 1..8 bytes,
//               a third of them deleted by another thread, while each delete looks behind its
//               block at headers other threads are changing: nothing may be reported
//   threads_overrun
//               the same, and one more thread overruns an exact fit of its own 200 times, each
//               deleted at once: every error must name that thread's allocation
//
// With a third argument `compact`, the blocks come from a plain `new` (no `K15_NEW` site): blocks
// of up to 16 bytes then take the compact header, 16 bytes in front of the block.
#include <k15/memory.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

// The header in front of every block (docs/design.md, "The block header"): an exact fit's neighbour starts
// this far behind its last byte. A compact header is 16 bytes.
std::uintptr_t kHeader = 32;
bool compact = false;

void* volatile sink;
volatile std::size_t one = 1;  // an index the compiler cannot see through

[[gnu::noinline]] char* make_without_site(std::size_t size) {
    return new char[size];  // ALLOC no_site
}

[[gnu::noinline]] char* make(std::size_t size) {
    char* block = compact ? make_without_site(size) : K15_NEW char[size];  // ALLOC make
    std::memset(block, 0, size);
    sink = block;
    return block;
}

[[gnu::noinline]] void release(char* block) { delete[] block; }

[[gnu::noinline]] char* make_to_overrun(std::size_t size) {
    return K15_NEW char[size];  // ALLOC make_to_overrun
}

[[gnu::noinline]] void overrun(char* block, std::size_t size) {
    block[size * one] = 'X';  // WRITE exact_fit
}

std::uintptr_t address(const char* block) { return reinterpret_cast<std::uintptr_t>(block); }

// Two blocks of `size` bytes, the second right behind the first; the rest freed.
std::pair<char*, char*> adjacent_pair(std::size_t size) {
    std::vector<char*> blocks;
    for (int i = 0; i < 256; ++i) blocks.push_back(make(size));
    std::set<std::uintptr_t> at;
    for (char* block : blocks) at.insert(address(block));
    char* front = nullptr;
    char* behind = nullptr;
    for (char* block : blocks) {
        if (at.count(address(block) + size + kHeader) != 0) {
            front = block;
            behind = reinterpret_cast<char*>(address(block) + size + kHeader);
            break;
        }
    }
    for (char* block : blocks) {
        if (block != front && block != behind) release(block);
    }
    return {front, behind};
}

// A block of `size` bytes that is the last one carved from its span: no block of ours lies right
// behind it (nor behind the 64 bytes carving skips at a page start), yet blocks lie further on.
// Every other block stays live (returned in `kept`), so that the span keeps its class.
char* last_of_a_span(std::size_t size, std::vector<char*>& kept) {
    std::vector<char*> blocks;
    for (int i = 0; i < 3 * (1 << 20) / static_cast<int>(size + kHeader); ++i) {
        blocks.push_back(make(size));
    }
    std::sort(blocks.begin(), blocks.end());
    std::set<std::uintptr_t> at;
    for (char* block : blocks) at.insert(address(block));
    char* last = nullptr;
    for (char* block : blocks) {
        const std::uintptr_t next = address(block) + size + kHeader;
        if (block != blocks.back() && at.count(next) == 0 && at.count(next + 64) == 0) {
            last = block;
            break;
        }
    }
    for (char* block : blocks) {
        if (block == last) continue;
        kept.push_back(block);
    }
    return last;
}

// Exact fits made and deleted by `count` threads, some handed to another thread to delete.
void churn_exact_fits(std::size_t size, int count) {
    std::mutex lock;
    std::vector<char*> handed;
    std::vector<std::thread> threads;
    for (int t = 0; t < count; ++t) {
        threads.emplace_back([&, t] {
            std::uint32_t state = 2654435761u * (t + 1);
            std::vector<char*> mine;
            for (int i = 0; i < 100000; ++i) {
                state = state * 1664525u + 1013904223u;
                mine.push_back(make(size * (1 + (state >> 16) % 8)));
                if (mine.size() < 64) continue;
                const std::size_t k = (state >> 8) % mine.size();
                char* block = mine[k];
                mine[k] = mine.back();
                mine.pop_back();
                char* theirs = nullptr;
                {
                    std::lock_guard<std::mutex> held(lock);
                    if (state % 3 == 0) {
                        handed.push_back(block);
                        block = nullptr;
                    } else if (!handed.empty()) {
                        theirs = handed.back();
                        handed.pop_back();
                    }
                }
                if (block != nullptr) release(block);
                if (theirs != nullptr) release(theirs);
            }
            for (char* block : mine) release(block);
        });
    }
    for (std::thread& thread : threads) thread.join();
    for (char* block : handed) release(block);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3 && argc != 4) return 2;
    const std::string how = argv[1];
    const std::size_t size = std::strtoul(argv[2], nullptr, 10);
    compact = argc == 4 && std::string(argv[3]) == "compact";
    if (compact && size <= 16) kHeader = 16;
    if (how == "threads_overrun") {
        std::thread culprit([size] {
            for (int i = 0; i < 200; ++i) {
                char* block = make_to_overrun(size * (1 + i % 4));
                overrun(block, size * (1 + i % 4));
                release(block);
                std::this_thread::yield();
            }
        });
        churn_exact_fits(size, 4);
        culprit.join();
        std::printf("last line\n");
        return 0;
    }
    if (how == "threads") {
        churn_exact_fits(size, 8);
        std::printf("check_heap %zu\n", k15::memory::check_heap());
        std::printf("last line\n");
        return 0;
    }
    if (how == "only_one") {
        char* block = make(size);
        std::printf("front %p\n", static_cast<void*>(block));
        overrun(block, size);
        release(block);
        std::printf("last line\n");
        return 0;
    }
    if (how == "span_end") {
        std::vector<char*> kept;
        char* last = last_of_a_span(size, kept);
        if (last == nullptr) {
            std::printf("no span end found\n");
            return 3;
        }
        std::printf("front %p\n", static_cast<void*>(last));
        overrun(last, size);
        std::printf("check_heap %zu\n", k15::memory::check_heap());
        release(last);
        for (char* block : kept) release(block);
        std::printf("last line\n");
        return 0;
    }
    auto [front, behind] = adjacent_pair(size);
    if (front == nullptr) {
        std::printf("no adjacent blocks\n");
        return 3;
    }
    std::printf("front %p\n", static_cast<void*>(front));
    if (how == "delete") {
        overrun(front, size);
        release(behind);
        release(front);
    } else if (how == "reuse") {
        release(behind);
        overrun(front, size);
        char* again = make(size);
        std::printf("reused %s\n", again == behind ? "yes" : "no");
        std::printf("check_heap %zu\n", k15::memory::check_heap());
        release(again);
        release(front);
    } else if (how == "freed_first") {
        overrun(front, size);
        release(front);
        release(behind);
    } else if (how == "freed_alone") {
        release(behind);
        overrun(front, size);
        release(front);
    } else if (how == "check_heap") {
        overrun(front, size);
        std::printf("check_heap %zu\n", k15::memory::check_heap());
        release(behind);
        release(front);
    } else {
        return 2;
    }
    std::printf("last line\n");
    return 0;
}
