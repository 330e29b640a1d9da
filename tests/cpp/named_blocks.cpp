// Blocks of k15::memory::allocate() (an engine's or a library's own allocator callbacks) hold
// pointers like any other block: what they point to is reachable through them, or lost with
// them. Built with and without the tracker (valgrind is the referee of the plain build).
//
//   named_blocks global   a global holds an allocate() block holding a new[], a malloc and
//                         another allocate() block: nothing lost
//   named_blocks chain    a lost chain head -> mid -> tail of allocate() blocks: one direct
//                         leak (head), two indirect
//   named_blocks mixed    a lost allocate() block holding a new'd block holding an allocate()
//                         block: one direct leak, two indirect
//   named_blocks engine   engine allocators' blocks (allocators alive until exit): a global
//                         holds a pool block holding a block allocator's; a lost pool block
//                         holds a new'd block holding a block allocator's: one direct leak,
//                         two indirect

#include <k15/engine.h>
#include <k15/memory.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "keep.h"

namespace {

struct Holder {
    void* array;
    void* c_block;
    void* named;
};

struct Link {
    Link* next;
    char payload[40];
};

Holder* g_holder;

Link* named_link(Link* next, std::size_t size) {
    void* block = k15::memory::allocate(size, 0, "engine");
    auto* link = static_cast<Link*>(keep(block));
    link->next = next;
    return link;
}

void global_holder() {
    g_holder = static_cast<Holder*>(k15::memory::allocate(sizeof(Holder), 0, "engine"));
    g_holder->array = keep(new char[100]);
    g_holder->c_block = keep(std::malloc(200));
    g_holder->named = keep(k15::memory::allocate(300, 0, "engine"));
}

void lost_chain() {
    Link* tail = named_link(nullptr, 96);
    Link* mid = named_link(tail, 80);
    keep(named_link(mid, 64));  // LEAK: the head, dropped
}

void lost_mixed() {
    Link* tail = named_link(nullptr, 112);
    auto* mid = new Link{tail, {}};
    keep(named_link(mid, 72));  // LEAK: the head, dropped
}

// Never destroyed: their blocks stay readable at exit.
alignas(k15::memory::PoolAllocator) unsigned char g_pool_storage[sizeof(k15::memory::PoolAllocator)];
alignas(k15::memory::BlockAllocator) unsigned char g_blocks_storage[sizeof(k15::memory::BlockAllocator)];
Link* g_engine_link;

Link* engine_link(k15::memory::EngineAllocator& allocator, Link* next, std::size_t size) {
    auto* link = static_cast<Link*>(keep(allocator.allocate(size)));
    link->next = next;
    return link;
}

void engine_blocks() {
    auto& pool = *new (g_pool_storage) k15::memory::PoolAllocator("pool");
    auto& blocks = *new (g_blocks_storage) k15::memory::BlockAllocator("blocks", 1 << 16);
    g_engine_link = engine_link(pool, engine_link(blocks, nullptr, 176), 128);
    auto* mid = new Link{engine_link(blocks, nullptr, 192), {}};
    keep(engine_link(pool, mid, 160));  // LEAK: the head, dropped
}

}  // namespace

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "";
    if (std::strcmp(mode, "global") == 0) global_holder();
    if (std::strcmp(mode, "chain") == 0) lost_chain();
    if (std::strcmp(mode, "mixed") == 0) lost_mixed();
    if (std::strcmp(mode, "engine") == 0) engine_blocks();
    return 0;
}
