// The public k15::memory functions, converting the bridge's types to the header's.

#include "k15/memory.h"
#include "k15-memory/rust/ffi.rs.h"

namespace k15::memory {

Stats stats() noexcept {
    const detail::Stats s = detail::stats();
    return Stats{s.live_blocks, s.live_bytes, s.peak_bytes, s.total_allocations, s.total_frees};
}

bool write_leak_report(const char* path) noexcept { return detail::write_leak_report(path); }

std::size_t check_heap() noexcept {
    return detail::check_heap(reinterpret_cast<std::size_t>(__builtin_frame_address(0)));
}

void ignore_leak(const void* ptr) noexcept {
    detail::ignore_leak(static_cast<std::uint8_t*>(const_cast<void*>(ptr)));
}

ScopedLeakIgnore::ScopedLeakIgnore() noexcept : token_(detail::begin_leak_ignore()) {}

ScopedLeakIgnore::~ScopedLeakIgnore() { detail::end_leak_ignore(token_); }

}  // namespace k15::memory
