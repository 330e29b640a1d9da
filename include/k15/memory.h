// k15-memory: leak tracking for C++ new/delete.
//
// Include this header in at least one translation unit and link libk15_memory.a after your
// sources: every global operator new/delete of the process is then tracked, and a leak log is
// written at exit. Write K15_NEW where you wrote new to record the file and line.
//
//   g++ -std=c++17 -g -I include app.cpp target/release/libk15_memory.a -lpthread -ldl -o app
//
// Compiles as C++11 and later (g++, clang++, -Wall -Wextra -pedantic clean).
//
// -DK15_MEMORY_DISABLED turns it all off: K15_NEW is plain new and the library is not needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

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

namespace k15 {
namespace memory {

// Counters of the whole process. Bytes are the sizes the program asked for, headers excluded.
struct Stats {
    std::uint64_t live_blocks = 0;
    std::uint64_t live_bytes = 0;
    std::uint64_t peak_bytes = 0;
    std::uint64_t total_allocations = 0;
    std::uint64_t total_frees = 0;
};

// One tag's figures (tag_stats()); a parent's include its children's. Bytes as asked for.
struct TagStats {
    std::string name;
    std::uint64_t live_blocks = 0;
    std::uint64_t live_bytes = 0;
    std::uint64_t peak_bytes = 0;
    std::uint64_t total_allocations = 0;
    std::uint64_t total_bytes = 0;
    std::uint64_t budget_bytes = 0;  // 0: none
};

}  // namespace memory
}  // namespace k15

// The C face (tag scopes among it); K15_MEMORY_DISABLED, set above for sanitizer builds, holds.
#include "memory_c.h"

#define K15_MEMORY_CONCAT_(a, b) a##b
#define K15_MEMORY_CONCAT(a, b) K15_MEMORY_CONCAT_(a, b)

#if defined(K15_MEMORY_DISABLED)

#define K15_NEW new
#define K15_MEMORY_SCOPE(name) static_assert(sizeof("" name "") > 0, "a string literal")

namespace k15 {
namespace memory {
inline Stats stats() noexcept { return {}; }
inline std::vector<TagStats> tag_stats() { return {}; }
inline void frame_mark() noexcept {}
inline bool write_leak_report(const char* = nullptr) noexcept { return false; }
inline std::size_t check_heap() noexcept { return 0; }
inline void ignore_leak(const void*) noexcept {}
inline void running_on_stack(const void*, std::size_t) noexcept {}
class ScopedLeakIgnore {
public:
    ScopedLeakIgnore() noexcept {}
    ScopedLeakIgnore(const ScopedLeakIgnore&) = delete;
    ScopedLeakIgnore& operator=(const ScopedLeakIgnore&) = delete;
};
inline void* allocate(std::size_t size, std::size_t align, const char*) noexcept {
    if ((align & (align - 1)) != 0) return nullptr;  // not a power of two, as with the library
    if (align <= 16) return std::malloc(size);
    void* block = nullptr;
    return posix_memalign(&block, align, size) == 0 ? block : nullptr;  // C++11: no std::aligned_alloc
}
inline void deallocate(void* ptr) noexcept { std::free(ptr); }
using PoolHandle = k15_memory_pool;
inline PoolHandle pool_create(const char*) noexcept { return 0; }
inline void pool_alloc(PoolHandle, const void*, std::size_t) noexcept {}
inline void pool_free(PoolHandle, const void*) noexcept {}
inline void pool_reset(PoolHandle) noexcept {}
}  // namespace memory
}  // namespace k15

#else

// K15_NEW T(args), K15_NEW T[n], and over-aligned T all record __FILE__ and __LINE__.
#define K15_NEW new (__FILE__, __LINE__)

// K15_MEMORY_SCOPE("Physics/Broadphase"): every block this thread allocates until the end of
// the enclosing C++ scope (new, K15_NEW, the malloc family, Rust's TrackedAlloc) carries the
// tag, for life, wherever it is freed. The innermost scope wins; '/' makes a hierarchy whose
// parents include their children's figures (tag_stats(), the report's tags). The name must be
// a string literal: its id is looked up once per call site, so that opening the scope is a few
// instructions (k15_memory_scope_push takes any string).
#define K15_MEMORY_SCOPE(name)                                                                        \
    static const std::uint32_t K15_MEMORY_CONCAT(k15_memory_tag_, __LINE__) = k15_memory_tag("" name ""); \
    const ::k15::memory::TagScope K15_MEMORY_CONCAT(k15_memory_scope_, __LINE__)(                      \
        K15_MEMORY_CONCAT(k15_memory_tag_, __LINE__))

// Defined in the library beside the global replacements (never inline: a block allocated here
// must be freed by the same allocator). The placement deletes run when a constructor throws.
// The aligned forms exist where the language has std::align_val_t (C++17, or -faligned-new);
// below that, over-aligned types get the plain forms, as with plain new.
void* operator new(std::size_t size, const char* file, int line);
void* operator new[](std::size_t size, const char* file, int line);
void operator delete(void* ptr, const char* file, int line) noexcept;
void operator delete[](void* ptr, const char* file, int line) noexcept;
#if defined(__cpp_aligned_new)
void* operator new(std::size_t size, std::align_val_t align, const char* file, int line);
void* operator new[](std::size_t size, std::align_val_t align, const char* file, int line);
void operator delete(void* ptr, std::align_val_t align, const char* file, int line) noexcept;
void operator delete[](void* ptr, std::align_val_t align, const char* file, int line) noexcept;
#endif

namespace k15 {
namespace memory {

// The counters now.
Stats stats() noexcept;

// Every tag's figures now, in the order the tags were first seen (a parent before its
// children). Peaks are exact for one thread, within 32 KiB per thread and tag otherwise.
std::vector<TagStats> tag_stats();

// Ends the frame under way (see k15_memory_frame_mark in memory_c.h): the report gives
// allocations, frees and bytes per frame, per tag and for the process.
inline void frame_mark() noexcept { k15_memory_frame_mark(); }

// What K15_MEMORY_SCOPE declares: a tag scope open for the object's life.
class TagScope {
public:
    explicit TagScope(std::uint32_t tag) noexcept { k15_memory_scope_push_tag(tag); }
    ~TagScope() { k15_memory_scope_pop(); }
    TagScope(const TagScope&) = delete;
    TagScope& operator=(const TagScope&) = delete;
};

// Writes the text report to `path` and the JSON report to `path` + ".json" now (%p in `path`
// is the pid); nullptr means
// the configured log_path (K15_MEMORY_OPTIONS). Returns false if a file could not be written.
bool write_leak_report(const char* path = nullptr) noexcept;

// Checks every live block now (the guard behind its bytes, the check word in front, the
// tracker's links), reports each problem found with the block's allocation stack and this
// call's stack, repairs what it can, and returns the number of problems (0: all intact).
std::size_t check_heap() noexcept;

// The block at `ptr` lives on purpose: never reported as a leak (counted under
// "ignore_leak()"), and the blocks it points to count as reachable. Null and pointers that are
// no live block are ignored.
void ignore_leak(const void* ptr) noexcept;

// For a job system that runs jobs on stacks of its own (fibers: swapcontext, boost.context):
// right after each switch, the stack the calling thread now runs on (its lowest address and
// size; nullptr, 0 when back on the thread's own). Stacks of allocations there are then
// captured as on the thread's own stack. Without it they are captured all the same, asking the
// kernel which pages can be read: a syscall or two more per allocation. The range must be the
// whole mapped stack (like ASan's __sanitizer_finish_switch_fiber).
void running_on_stack(const void* lowest, std::size_t size) noexcept;

// Every block this thread allocates while the scope is open lives on purpose, as with
// ignore_leak (counted under "ScopedLeakIgnore"). Costs nothing per allocation.
class ScopedLeakIgnore {
public:
    ScopedLeakIgnore() noexcept;
    ~ScopedLeakIgnore();
    ScopedLeakIgnore(const ScopedLeakIgnore&) = delete;
    ScopedLeakIgnore& operator=(const ScopedLeakIgnore&) = delete;

private:
    std::size_t token_;
};

// For an engine's or a library's own allocator callbacks (Recast's rcAllocSetCustom, Lua's
// lua_Alloc, SDL_SetMemoryFunctions, ImGui::SetAllocatorFunctions): a tracked block of `size`
// bytes aligned to `align` (0: 16; a power of two), or nullptr when memory is exhausted. `name`
// is the block's "language" in the report: a string that lives as long as the program (a
// literal), kept by address, not copied.
void* allocate(std::size_t size, std::size_t align, const char* name) noexcept;

// Frees a block of allocate(); nullptr is ignored. A block of another family (malloc, new) is a
// mismatched_delete, anything else a reported invalid_free or double_free (left alone).
void deallocate(void* ptr) noexcept;

// Pools, for an arena that carves memory of its own into objects (a frame's temp allocator, a
// fixed-size free list), like Tracy's TracyAllocN/TracyFreeN or valgrind's MEMPOOL_ALLOC: the
// arena tells the tracker of each sub-block it hands out and takes back. Each sub-block is then
// a block of its own in the leak report (allocated with the pool's name, at the stack of its
// pool_alloc, scanned for pointers) and in the tag figures (the tag of the scope pool_alloc
// runs in). The arena's own block, while it holds live sub-blocks, is no leak of its own; its
// bytes count against its tag only where no sub-block holds them. A pool_free of no live
// sub-block, a second one, or a pool_alloc over a live sub-block is reported as a memory error.
using PoolHandle = k15_memory_pool;

// A pool named `name` (copied; "Physics/TempArena"); 0 if it could not be made.
PoolHandle pool_create(const char* name) noexcept;

// The arena handed out `size` bytes at `ptr`.
void pool_alloc(PoolHandle pool, const void* ptr, std::size_t size) noexcept;

// The arena took the sub-block at `ptr` back.
void pool_free(PoolHandle pool, const void* ptr) noexcept;

// The arena took every sub-block back at once (rewound; or before it frees its memory).
void pool_reset(PoolHandle pool) noexcept;

}  // namespace memory
}  // namespace k15

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
