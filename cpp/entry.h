// The two calls of every tracked new and delete, straight into Rust (rust/ffi.rs): not through
// the cxx bridge, whose wrapper and shim would add two calls to each.
#pragma once

#include "k15-memory/rust/ffi.rs.h"

#include <cstddef>

extern "C" {
void* k15_memory_allocate(std::size_t size, std::size_t align, k15::memory::detail::BlockKind kind, const char* file,
                          int line, std::size_t frame_address) noexcept;
void k15_memory_deallocate(void* ptr, k15::memory::detail::BlockKind kind, std::size_t frame_address) noexcept;
}
