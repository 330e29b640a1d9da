// The two calls of every tracked new and delete, straight into Rust (rust/ffi.rs): not through
// the cxx bridge, whose wrapper and shim would add two calls to each; and the take-over.
#pragma once

#include "k15-memory/rust/ffi.rs.h"

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>

extern "C" {
void* k15_memory_allocate(std::size_t size, std::size_t align, k15::memory::detail::BlockKind kind, const char* file,
                          int line, std::size_t frame_address) noexcept;
// k15_memory_allocate(size, 0, kind, nullptr, 0, frame_address): operator new and new[], three arguments to pass.
void* k15_memory_new(std::size_t size, k15::memory::detail::BlockKind kind, std::size_t frame_address) noexcept;
void k15_memory_deallocate(void* ptr, k15::memory::detail::BlockKind kind, std::size_t frame_address) noexcept;
// An aligned form refused `align` (invalid_alignment); the caller fails the call as the library it replaces does.
void k15_memory_invalid_alignment(std::size_t size, std::size_t align, k15::memory::detail::BlockKind kind,
                                  const char* file, int line, std::size_t frame_address) noexcept;
// The pool API's entries (api.cpp's public forms pass their own frame: the stack starts at their caller).
std::uint32_t k15_memory_pool_create_named(const char* name) noexcept;
void k15_memory_pool_alloc_from(std::uint32_t pool, const void* ptr, std::size_t size, std::size_t frame_address) noexcept;
void k15_memory_pool_free_from(std::uint32_t pool, const void* ptr, std::size_t frame_address) noexcept;
void k15_memory_pool_reset_from(std::uint32_t pool, std::size_t frame_address) noexcept;
// After a take-over (cpp/take_over.cpp): blocks the previous allocator served are freed by it.
void k15_memory_pass_foreign_blocks_to(void (*original_delete)(void*)) noexcept;
}

namespace k15::memory::detail {
// The alignments libstdc++'s aligned operator new and C11's aligned_alloc accept.
inline bool is_power_of_two(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }

// The definition of `name` that an interposer of this library stands in front of (glibc's, as
// a rule): the next one in the loader's search order after the module holding the tracker.
template <typename Function>
Function next_definition(const char* name) {
    return reinterpret_cast<Function>(dlsym(RTLD_NEXT, name));
}

// Points every loaded module's calls of the global operators at `own_module`'s (a handle of the
// module that holds the tracker), and so those of modules dlopen loads later; blocks the
// tracker did not serve go to the process's operator delete. False if the process's operators
// are not libstdc++'s or `own_module` does not export them all (nothing is redirected then).
bool take_over_operators(void* own_module) noexcept;
}  // namespace k15::memory::detail
