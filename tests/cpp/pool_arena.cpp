// A small bump arena that reports its sub-blocks through the pool API (k15::memory::pool_alloc,
// pool_free, pool_reset) and, for valgrind, through the same client requests
// (VALGRIND_CREATE_MEMPOOL, MEMPOOL_ALLOC, MEMPOOL_FREE, MEMPOOL_TRIM): no-ops outside valgrind,
// so that the plain build (-DK15_MEMORY_DISABLED) under valgrind shows the referee the same pool.
//
//   pool_arena leak     a global keeps two sub-blocks, the third is dropped: one direct leak of
//                       the pool, at the stack of its pool_alloc; the arena's own block is none
//   pool_arena reset    three sub-blocks dropped, then the arena is reset: nothing of the pool's
//   pool_arena holds    a kept sub-block holds the only pointer to a new'd block (reachable); a
//                       dropped one holds another (one direct leak, one indirect)
//   pool_arena misuse   a pool_free of a pointer never handed out, one twice, a pool_alloc over a
//                       live sub-block: three memory errors, and the program goes on
//   pool_arena tags     the arena made under "PoolTest", its sub-blocks under "PoolTest/Temp",
//                       over three frames: prints the tags' live bytes before and after a reset

#include <k15/memory.h>
#include <valgrind/valgrind.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "keep.h"

namespace {

class Arena {
public:
    explicit Arena(std::size_t capacity)
        : base_(new char[capacity]), top_(base_ + kHeader), end_(base_ + capacity),
          pool_(k15::memory::pool_create("Test/BumpArena")) {
        VALGRIND_CREATE_MEMPOOL(this, 0, 0);
    }

    void* alloc(std::size_t size) {
        std::size_t rounded = (size + 15) / 16 * 16;
        if (top_ + rounded > end_) return nullptr;
        char* block = top_;
        top_ += rounded;
        k15::memory::pool_alloc(pool_, block, size);
        VALGRIND_MEMPOOL_ALLOC(this, block, size);
        return block;
    }

    void free(void* block) {
        k15::memory::pool_free(pool_, block);
        VALGRIND_MEMPOOL_FREE(this, block);
    }

    void reset() {
        k15::memory::pool_reset(pool_);
        VALGRIND_MEMPOOL_TRIM(this, base_, 0);
        top_ = base_ + kHeader;
    }

    k15::memory::PoolHandle pool() const { return pool_; }

private:
    // The arena's first bytes are its own: no sub-block starts where its base pointer points.
    static constexpr std::size_t kHeader = 16;
    char* base_;
    char* top_;
    char* end_;
    k15::memory::PoolHandle pool_;
};

struct Payload {
    char bytes[40];
};

struct Holder {
    Payload* payload;
    char rest[40];
};

Arena* g_arena;
void* g_kept[4];

void leak() {
    g_arena = new Arena(4096);
    g_kept[0] = keep(g_arena->alloc(48));
    {
        K15_MEMORY_SCOPE("PoolTest/Leaky");
        keep(g_arena->alloc(56));  // LEAK: dropped
    }
    g_kept[1] = keep(g_arena->alloc(64));
}

void reset() {
    g_arena = new Arena(4096);
    for (std::size_t size : {48, 56, 64}) keep(g_arena->alloc(size));
    g_arena->reset();
}

Holder* holder_in(Arena& arena, std::size_t size) {
    auto* holder = static_cast<Holder*>(keep(arena.alloc(size)));
    holder->payload = keep(new Payload{});
    return holder;
}

void holds() {
    g_arena = new Arena(4096);
    g_kept[0] = holder_in(*g_arena, 48);
    keep(holder_in(*g_arena, 72));  // LEAK: dropped, with the payload it holds
}

void misuse() {
    g_arena = new Arena(4096);
    k15::memory::PoolHandle pool = g_arena->pool();
    char* a = static_cast<char*>(g_arena->alloc(32));
    k15::memory::pool_free(pool, a + 8);  // MISUSE: inside a sub-block
    g_arena->free(a);
    k15::memory::pool_free(pool, a);  // MISUSE: twice
    char* b = static_cast<char*>(g_arena->alloc(64));
    k15::memory::pool_alloc(pool, b + 16, 16);  // MISUSE: over a live sub-block
    k15::memory::pool_free(pool, b + 16);
    std::puts("survived");
}

void print_tags(const char* when) {
    std::uint64_t parent = 0, temp = 0;
    for (const k15::memory::TagStats& t : k15::memory::tag_stats()) {
        if (t.name == "PoolTest") parent = t.live_bytes;
        if (t.name == "PoolTest/Temp") temp = t.live_bytes;
    }
    std::printf("%s: PoolTest %llu PoolTest/Temp %llu live %llu\n", when, static_cast<unsigned long long>(parent),
                static_cast<unsigned long long>(temp),
                static_cast<unsigned long long>(k15::memory::stats().live_bytes));
}

void tags() {
    {
        K15_MEMORY_SCOPE("PoolTest");
        g_arena = new Arena(4096);
    }
    print_tags("made");
    k15::memory::frame_mark();
    for (int frame = 1; frame <= 3; ++frame) {
        {
            K15_MEMORY_SCOPE("PoolTest/Temp");
            keep(g_arena->alloc(100));
            keep(g_arena->alloc(200));
        }
        if (frame == 3) print_tags("carved");
        g_arena->reset();
        k15::memory::frame_mark();
    }
    print_tags("reset");
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "leak") leak();
    if (mode == "reset") reset();
    if (mode == "holds") holds();
    if (mode == "misuse") misuse();
    if (mode == "tags") tags();
    return 0;
}
