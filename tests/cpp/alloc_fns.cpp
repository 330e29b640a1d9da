// An engine's allocation wrappers (as Jolt's AllocateImpl/AlignedAllocateImpl), kept out of line
// or always inlined, and a hook that calls either of two: with
// alloc_fns=engine::*AllocateImpl their frames leave the report, and each leak starts at the
// function that asked for the memory (the hook's two blocks: one site).

#include <cstdlib>
#include <cstring>

#include "keep.h"

namespace engine {

// Each wrapper fills the block after allocating it, so that no build turns the call into a
// jump (nor malloc and a zero fill into calloc).
__attribute__((noinline)) void* AllocateImpl(std::size_t size) {
    void* block = std::malloc(size);
    std::memset(block, 0xa5, size);
    return block;
}

__attribute__((noinline)) void* FrameAllocateImpl(std::size_t size) {
    void* block = std::malloc(size);
    std::memset(block, 0xa5, size);
    return block;
}

__attribute__((always_inline)) inline void* InlineAllocateImpl(std::size_t size) {
    void* block = std::malloc(size);
    std::memset(block, 0xa5, size);
    return block;
}

}  // namespace engine

namespace {

__attribute__((noinline)) void leak_outlined() {
    keep(engine::AllocateImpl(72));  // LEAK outlined
}

__attribute__((noinline)) void leak_inlined() {
    keep(engine::InlineAllocateImpl(96));  // LEAK inlined
}

void* (*volatile hooks[2])(std::size_t) = {engine::AllocateImpl, engine::FrameAllocateImpl};

volatile int hook_count = 2;  // read at run time: the loop stays one call site at -O2

__attribute__((noinline)) void leak_through_hooks() {
    for (int i = 0; i < hook_count; ++i) keep(hooks[i](128));  // LEAK hooks
}

}  // namespace

int main() {
    leak_outlined();
    leak_inlined();
    leak_through_hooks();
    return 0;
}
