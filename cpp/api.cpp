// The public k15::memory functions and their C face (include/k15/memory_c.h), converting the
// bridge's types to the headers'.

#include "k15/memory.h"
#include "k15/memory_c.h"
#include "entry.h"

namespace k15::memory {

namespace {

// `frame` is the frame of the public function: the call stack starts at its caller.
void* allocate_named(std::size_t size, std::size_t align, const char* name, void* frame) noexcept {
    if ((align & (align - 1)) != 0) return nullptr;  // not a power of two
    return k15_memory_allocate(size, align, detail::BlockKind::Named, name != nullptr ? name : "unnamed", 0,
                               reinterpret_cast<std::size_t>(frame));
}

void deallocate_named(void* ptr, void* frame) noexcept {
    k15_memory_deallocate(ptr, detail::BlockKind::Named, reinterpret_cast<std::size_t>(frame));
}

}  // namespace

Stats stats() noexcept {
    const detail::Stats s = detail::stats();
    return Stats{s.live_blocks, s.live_bytes, s.peak_bytes, s.total_allocations, s.total_frees};
}

std::vector<TagStats> tag_stats() {
    std::vector<TagStats> tags;
    for (const detail::TagStats& t : detail::tag_stats()) {
        tags.push_back(TagStats{std::string(t.name), t.live_blocks, t.live_bytes, t.peak_bytes, t.total_allocations,
                                t.total_bytes, t.budget_bytes});
    }
    return tags;
}

bool write_leak_report(const char* path) noexcept { return detail::write_leak_report(path); }

std::size_t check_heap() noexcept {
    return detail::check_heap(reinterpret_cast<std::size_t>(__builtin_frame_address(0)));
}

void ignore_leak(const void* ptr) noexcept {
    detail::ignore_leak(static_cast<std::uint8_t*>(const_cast<void*>(ptr)));
}

void running_on_stack(const void* lowest, std::size_t size) noexcept {
    detail::running_on_stack(reinterpret_cast<std::size_t>(lowest), size);
}

ScopedLeakIgnore::ScopedLeakIgnore() noexcept : token_(detail::begin_leak_ignore()) {}

ScopedLeakIgnore::~ScopedLeakIgnore() { detail::end_leak_ignore(token_); }
void* allocate(std::size_t size, std::size_t align, const char* name) noexcept {
    return allocate_named(size, align, name, __builtin_frame_address(0));
}

void deallocate(void* ptr) noexcept { deallocate_named(ptr, __builtin_frame_address(0)); }

PoolHandle pool_create(const char* name) noexcept { return k15_memory_pool_create_named(name); }

void pool_alloc(PoolHandle pool, const void* ptr, std::size_t size) noexcept {
    k15_memory_pool_alloc_from(pool, ptr, size, reinterpret_cast<std::size_t>(__builtin_frame_address(0)));
}

void pool_free(PoolHandle pool, const void* ptr) noexcept {
    k15_memory_pool_free_from(pool, ptr, reinterpret_cast<std::size_t>(__builtin_frame_address(0)));
}

void pool_reset(PoolHandle pool) noexcept { k15_memory_pool_reset_from(pool, reinterpret_cast<std::size_t>(__builtin_frame_address(0))); }

}  // namespace k15::memory

extern "C" {

void* k15_memory_alloc(std::size_t size, std::size_t align, const char* name) {
    return k15::memory::allocate_named(size, align, name, __builtin_frame_address(0));
}

void k15_memory_free(void* ptr) { k15::memory::deallocate_named(ptr, __builtin_frame_address(0)); }

k15_memory_stats k15_memory_get_stats(void) {
    const k15::memory::Stats s = k15::memory::stats();
    return k15_memory_stats{s.live_blocks, s.live_bytes, s.peak_bytes, s.total_allocations, s.total_frees};
}

int k15_memory_write_leak_report(const char* path) { return k15::memory::write_leak_report(path) ? 1 : 0; }

k15_memory_pool k15_memory_pool_create(const char* name) { return k15_memory_pool_create_named(name); }

void k15_memory_pool_alloc(k15_memory_pool pool, const void* ptr, size_t size) {
    k15_memory_pool_alloc_from(pool, ptr, size, reinterpret_cast<std::size_t>(__builtin_frame_address(0)));
}

void k15_memory_pool_free(k15_memory_pool pool, const void* ptr) {
    k15_memory_pool_free_from(pool, ptr, reinterpret_cast<std::size_t>(__builtin_frame_address(0)));
}

void k15_memory_pool_reset(k15_memory_pool pool) {
    k15_memory_pool_reset_from(pool, reinterpret_cast<std::size_t>(__builtin_frame_address(0)));
}

void k15_memory_running_on_stack(const void* lowest, size_t size) {
    k15::memory::running_on_stack(lowest, size);
}

}  // extern "C"
