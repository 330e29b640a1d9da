// The functions install_bullet_hooks() (include/k15/bullet.h) hands to Bullet. Bullet's free
// passes no size: the block header has it. Bullet's allocators return null on exhaustion.

#include "entry.h"

#include <cstddef>
#include <cstdint>

namespace k15::memory::detail {

namespace {

std::size_t frame_of(void* frame_address) { return reinterpret_cast<std::size_t>(frame_address); }

}  // namespace

void* bullet_allocate_aligned(std::size_t size, int alignment) {
    const std::size_t align = alignment > 0 ? static_cast<std::size_t>(alignment) : 0;
    return k15_memory_allocate(size, align, BlockKind::Bullet, nullptr, 0, frame_of(__builtin_frame_address(0)));
}

void* bullet_allocate(std::size_t size) {
    return k15_memory_allocate(size, 0, BlockKind::Bullet, nullptr, 0, frame_of(__builtin_frame_address(0)));
}

void bullet_free(void* block) {
    k15_memory_deallocate(block, BlockKind::Bullet, frame_of(__builtin_frame_address(0)));
}

}  // namespace k15::memory::detail
