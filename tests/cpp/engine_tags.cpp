// Blocks of the engine allocators made under a tag scope count against the tag, as plain new
// and allocate() do: live until freed, rewound or destroyed. Prints each tag's live blocks,
// live bytes, allocations and bytes allocated after the allocations ("made"), after some frees
// ("freed"), and after an allocator was destroyed with a tagged block live ("dropped": a leak,
// which the report lists and the tag keeps); the blocks left at exit leak, each with its tag.

#include <k15/engine.h>
#include <k15/memory.h>

#include <cstdio>
#include <new>

#include "keep.h"

namespace {

struct Thing {
    char bytes[40];
};

void print_tags(const char* when) {
    for (const k15::memory::TagStats& t : k15::memory::tag_stats()) {
        std::printf("%s %s %llu %llu %llu %llu\n", when, t.name.c_str(), static_cast<unsigned long long>(t.live_blocks),
                    static_cast<unsigned long long>(t.live_bytes),
                    static_cast<unsigned long long>(t.total_allocations),
                    static_cast<unsigned long long>(t.total_bytes));
    }
}

// Never destroyed: their blocks stay readable at exit, and are reported there.
alignas(k15::memory::PoolAllocator) unsigned char g_pool[sizeof(k15::memory::PoolAllocator)];
alignas(k15::memory::StackAllocator) unsigned char g_stack[sizeof(k15::memory::StackAllocator)];
alignas(k15::memory::BlockAllocator) unsigned char g_blocks[sizeof(k15::memory::BlockAllocator)];
alignas(k15::memory::TypedPool<Thing>) unsigned char g_things[sizeof(k15::memory::TypedPool<Thing>)];

}  // namespace

int main() {
    auto& pool = *new (g_pool) k15::memory::PoolAllocator("tags.pool");
    auto& stack = *new (g_stack) k15::memory::StackAllocator("tags.stack", 4096);
    auto& blocks = *new (g_blocks) k15::memory::BlockAllocator("tags.blocks", 1 << 16);
    auto& things = *new (g_things) k15::memory::TypedPool<Thing>("tags.things");
    void* kept_pool_block;
    void* freed_pool_block;
    k15::memory::Marker marker;
    Thing* destroyed;
    {
        K15_MEMORY_SCOPE("Engine/Pool");
        kept_pool_block = keep(pool.allocate(100));
        freed_pool_block = keep(pool.allocate(200));
    }
    {
        K15_MEMORY_SCOPE("Engine/Stack");
        marker = stack.marker();
        keep(stack.allocate(48));
        keep(stack.allocate(80));
    }
    {
        K15_MEMORY_SCOPE("Engine/Blocks");
        keep(blocks.allocate(300));  // LEAK: block allocator
    }
    {
        K15_MEMORY_SCOPE("Engine/Things");
        keep(things.create());  // LEAK: typed pool
        destroyed = keep(things.create());
    }
    {
        K15_MEMORY_SCOPE("Engine/Named");
        keep(k15::memory::allocate(64, 0, "named"));  // LEAK: allocate()
    }
    print_tags("made");
    pool.deallocate(freed_pool_block);
    stack.rewind(marker);
    things.destroy(destroyed);
    print_tags("freed");
    {
        k15::memory::BlockAllocator dropped("tags.dropped", 1 << 12);
        K15_MEMORY_SCOPE("Engine/Dropped");
        keep(dropped.allocate(128));  // LEAK: its allocator destroyed
    }
    print_tags("dropped");
    keep(kept_pool_block);  // LEAK: pool, dropped here
    return 0;
}
