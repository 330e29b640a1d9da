// k15-memory: leak tracking for C++ new/delete.
//
// Include this header in at least one translation unit and link libk15_memory.a after your
// sources: every global operator new/delete of the process is then tracked, and a leak log is
// written at exit. Write K15_NEW where you wrote new to record the file and line.
//
//   g++ -std=c++17 -g -I include app.cpp target/release/libk15_memory.a -lpthread -ldl -o app
//
// -DK15_MEMORY_DISABLED turns it all off: K15_NEW is plain new and the library is not needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

// Sanitizer builds bring their own operator new: two sets of replacements cannot link.
#if !defined(K15_MEMORY_DISABLED)
#if defined(__SANITIZE_ADDRESS__)
#define K15_MEMORY_DISABLED
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer) || __has_feature(memory_sanitizer)
#define K15_MEMORY_DISABLED
#endif
#endif
#endif

namespace k15::memory {

// Counters of the whole process. Bytes are the sizes the program asked for, headers excluded.
struct Stats {
    std::uint64_t live_blocks = 0;
    std::uint64_t live_bytes = 0;
    std::uint64_t peak_bytes = 0;
    std::uint64_t total_allocations = 0;
    std::uint64_t total_frees = 0;
};

}  // namespace k15::memory

#if defined(K15_MEMORY_DISABLED)

#define K15_NEW new

namespace k15::memory {
inline Stats stats() noexcept { return {}; }
inline bool write_leak_report(const char* = nullptr) noexcept { return false; }
inline void* allocate(std::size_t size, std::size_t align, const char*) noexcept {
    if ((align & (align - 1)) != 0) return nullptr;  // not a power of two, as with the library
    if (align <= 16) return std::malloc(size);
    return std::aligned_alloc(align, (size + align - 1) / align * align);
}
inline void deallocate(void* ptr) noexcept { std::free(ptr); }
}  // namespace k15::memory

#else

// K15_NEW T(args), K15_NEW T[n], and over-aligned T all record __FILE__ and __LINE__.
#define K15_NEW new (__FILE__, __LINE__)

// Defined in the library beside the global replacements (never inline: a block allocated here
// must be freed by the same allocator). The placement deletes run when a constructor throws.
void* operator new(std::size_t size, const char* file, int line);
void* operator new[](std::size_t size, const char* file, int line);
void* operator new(std::size_t size, std::align_val_t align, const char* file, int line);
void* operator new[](std::size_t size, std::align_val_t align, const char* file, int line);
void operator delete(void* ptr, const char* file, int line) noexcept;
void operator delete[](void* ptr, const char* file, int line) noexcept;
void operator delete(void* ptr, std::align_val_t align, const char* file, int line) noexcept;
void operator delete[](void* ptr, std::align_val_t align, const char* file, int line) noexcept;

namespace k15::memory {

// The counters now.
Stats stats() noexcept;

// Writes the text report to `path` and the JSON report to `path` + ".json" now; nullptr means
// the configured log_path (K15_MEMORY_OPTIONS). Returns false if a file could not be written.
bool write_leak_report(const char* path = nullptr) noexcept;

// For an engine's or a library's own allocator callbacks (Recast's rcAllocSetCustom, Lua's
// lua_Alloc, SDL_SetMemoryFunctions, ImGui::SetAllocatorFunctions): a tracked block of `size`
// bytes aligned to `align` (0: 16; a power of two), or nullptr when memory is exhausted. `name`
// is the block's "language" in the report: a string that lives as long as the program (a
// literal), kept by address, not copied.
void* allocate(std::size_t size, std::size_t align, const char* name) noexcept;

// Frees a block of allocate(); nullptr is ignored. A block of another family (malloc, new) is a
// mismatched_delete, anything else a reported invalid_free or double_free (left alone).
void deallocate(void* ptr) noexcept;

}  // namespace k15::memory

// Every translation unit that includes this header refers to this symbol, which lives in the
// same object as the operator replacements: linking pulls them in, and a link line that puts
// the library before the sources fails loudly with this name instead of silently running on
// libstdc++'s operators.
extern "C" const char k15_memory_link_error_put_libk15_memory_a_after_your_sources;
namespace {
[[gnu::used]] const char* const k15_memory_link_anchor =
    &k15_memory_link_error_put_libk15_memory_a_after_your_sources;
}  // namespace

#endif
