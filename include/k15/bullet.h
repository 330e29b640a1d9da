// k15-memory for Bullet Physics: route btAlignedAlloc/btAlignedFree (every Bullet allocation,
// including the class-level operator new of BT_DECLARE_ALIGNED_ALLOCATOR) into the tracker, so
// Bullet's blocks appear in the leak log as "language": "bullet" with the size Bullet asked for.
//
// Call k15::memory::install_bullet_hooks() first thing in main, before Bullet allocates: a block
// Bullet allocated earlier and frees later is reported as an invalid free (and left alone).
// Needs Bullet's headers (-I/usr/include/bullet); nothing else of k15-memory depends on Bullet.
#pragma once

#include <k15/memory.h>

#include <LinearMath/btAlignedAllocator.h>

#include <cstddef>

namespace k15 {
namespace memory {

#if defined(K15_MEMORY_DISABLED)

inline void install_bullet_hooks() {}

#else

namespace detail {
void* bullet_allocate_aligned(std::size_t size, int alignment);
void* bullet_allocate(std::size_t size);
void bullet_free(void* block);
}  // namespace detail

inline void install_bullet_hooks() {
    btAlignedAllocSetCustomAligned(detail::bullet_allocate_aligned, detail::bullet_free);
    btAlignedAllocSetCustom(detail::bullet_allocate, detail::bullet_free);
}

#endif

}  // namespace memory
}  // namespace k15
