// Every replaceable global operator new/delete of C++17, the K15_NEW placement forms, the link
// anchor, and the exit hook that writes the report. One translation unit, so that whatever pulls
// in one of these pulls in all of them.

#include "k15/memory.h"
#include "entry.h"

#include <cstddef>
#include <new>

extern "C" const char k15_memory_link_error_put_libk15_memory_a_after_your_sources = 0;

namespace {

using k15::memory::detail::BlockKind;

// Each operator passes its own frame address; the call stack starts at the operator's caller.
inline std::size_t frame_of(void* frame_address) { return reinterpret_cast<std::size_t>(frame_address); }

inline std::size_t alignment(std::align_val_t align) { return static_cast<std::size_t>(align); }

// The new_handler loop of [new.delete.single]: retry while a handler frees memory.
void* allocate_or_throw(std::size_t size, std::size_t align, BlockKind kind, const char* file, int line,
                        std::size_t frame) {
    for (;;) {
        if (void* block = k15_memory_allocate(size, align, kind, file, line, frame)) return block;
        std::new_handler handler = std::get_new_handler();
        if (handler == nullptr) throw std::bad_alloc();
        handler();
    }
}

void* allocate_or_null(std::size_t size, std::size_t align, BlockKind kind, std::size_t frame) noexcept {
    try {
        return allocate_or_throw(size, align, kind, nullptr, 0, frame);
    } catch (...) {
        return nullptr;
    }
}

void release(void* ptr, BlockKind kind, std::size_t frame) noexcept {
    k15_memory_deallocate(ptr, kind, frame);
}

}  // namespace

#define K15_FRAME frame_of(__builtin_frame_address(0))

// Plain, array, nothrow and aligned forms.
void* operator new(std::size_t size) { return allocate_or_throw(size, 0, BlockKind::New, nullptr, 0, K15_FRAME); }
void* operator new[](std::size_t size) {
    return allocate_or_throw(size, 0, BlockKind::NewArray, nullptr, 0, K15_FRAME);
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    return allocate_or_null(size, 0, BlockKind::New, K15_FRAME);
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
    return allocate_or_null(size, 0, BlockKind::NewArray, K15_FRAME);
}
void* operator new(std::size_t size, std::align_val_t align) {
    return allocate_or_throw(size, alignment(align), BlockKind::New, nullptr, 0, K15_FRAME);
}
void* operator new[](std::size_t size, std::align_val_t align) {
    return allocate_or_throw(size, alignment(align), BlockKind::NewArray, nullptr, 0, K15_FRAME);
}
void* operator new(std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
    return allocate_or_null(size, alignment(align), BlockKind::New, K15_FRAME);
}
void* operator new[](std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
    return allocate_or_null(size, alignment(align), BlockKind::NewArray, K15_FRAME);
}

// K15_NEW: the same, with the allocation site.
void* operator new(std::size_t size, const char* file, int line) {
    return allocate_or_throw(size, 0, BlockKind::New, file, line, K15_FRAME);
}
void* operator new[](std::size_t size, const char* file, int line) {
    return allocate_or_throw(size, 0, BlockKind::NewArray, file, line, K15_FRAME);
}
void* operator new(std::size_t size, std::align_val_t align, const char* file, int line) {
    return allocate_or_throw(size, alignment(align), BlockKind::New, file, line, K15_FRAME);
}
void* operator new[](std::size_t size, std::align_val_t align, const char* file, int line) {
    return allocate_or_throw(size, alignment(align), BlockKind::NewArray, file, line, K15_FRAME);
}

// Every delete form; the header knows the size and alignment, so the extra arguments are unused.
void operator delete(void* ptr) noexcept { release(ptr, BlockKind::New, K15_FRAME); }
void operator delete[](void* ptr) noexcept { release(ptr, BlockKind::NewArray, K15_FRAME); }
void operator delete(void* ptr, std::size_t) noexcept { release(ptr, BlockKind::New, K15_FRAME); }
void operator delete[](void* ptr, std::size_t) noexcept { release(ptr, BlockKind::NewArray, K15_FRAME); }
void operator delete(void* ptr, const std::nothrow_t&) noexcept { release(ptr, BlockKind::New, K15_FRAME); }
void operator delete[](void* ptr, const std::nothrow_t&) noexcept { release(ptr, BlockKind::NewArray, K15_FRAME); }
void operator delete(void* ptr, std::align_val_t) noexcept { release(ptr, BlockKind::New, K15_FRAME); }
void operator delete[](void* ptr, std::align_val_t) noexcept { release(ptr, BlockKind::NewArray, K15_FRAME); }
void operator delete(void* ptr, std::size_t, std::align_val_t) noexcept { release(ptr, BlockKind::New, K15_FRAME); }
void operator delete[](void* ptr, std::size_t, std::align_val_t) noexcept {
    release(ptr, BlockKind::NewArray, K15_FRAME);
}
void operator delete(void* ptr, std::align_val_t, const std::nothrow_t&) noexcept {
    release(ptr, BlockKind::New, K15_FRAME);
}
void operator delete[](void* ptr, std::align_val_t, const std::nothrow_t&) noexcept {
    release(ptr, BlockKind::NewArray, K15_FRAME);
}

// Placement deletes of K15_NEW: called only when the constructor throws.
void operator delete(void* ptr, const char*, int) noexcept { release(ptr, BlockKind::New, K15_FRAME); }
void operator delete[](void* ptr, const char*, int) noexcept { release(ptr, BlockKind::NewArray, K15_FRAME); }
void operator delete(void* ptr, std::align_val_t, const char*, int) noexcept {
    release(ptr, BlockKind::New, K15_FRAME);
}
void operator delete[](void* ptr, std::align_val_t, const char*, int) noexcept {
    release(ptr, BlockKind::NewArray, K15_FRAME);
}

// The exit report. An atexit registered by the executable runs before the shared libraries'
// static destructors, which may still free. Registered from .preinit_array (before any shared
// library's initializer) without a DSO handle, the report runs after all of them.
extern "C" int __cxa_atexit(void (*function)(void*), void* argument, void* dso_handle);

namespace {

void report_at_exit(void*) { k15::memory::detail::report_at_exit(); }

void register_exit_report(int, char**, char**) { __cxa_atexit(report_at_exit, nullptr, nullptr); }

[[gnu::used, gnu::section(".preinit_array")]] void (*const register_exit_report_entry)(int, char**, char**) =
    register_exit_report;

}  // namespace
