// Every replaceable global operator new/delete of C++17, the K15_NEW placement forms, the link
// anchor, the start-up check that these operators serve the process, and the exit hook that
// writes the report. One translation unit, so that whatever pulls in one of these pulls in all
// of them.

#include "k15/memory.h"
#include "entry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <new>

extern "C" const char k15_memory_link_error_put_libk15_memory_a_after_your_sources = 0;

namespace {

using k15::memory::detail::BlockKind;
using k15::memory::detail::is_power_of_two;

// Each operator passes its own frame address; the call stack starts at the operator's caller.
inline std::size_t frame_of(void* frame_address) { return reinterpret_cast<std::size_t>(frame_address); }

inline std::size_t alignment(std::align_val_t align) { return static_cast<std::size_t>(align); }

// The new_handler loop of [new.delete.single]: retry while a handler frees memory.
void* allocate_or_throw(std::size_t size, std::size_t align, BlockKind kind, const char* file, int line,
                        std::size_t frame) {
    for (;;) {
        void* block = align == 0 && file == nullptr ? k15_memory_new(size, kind, frame)
                                                    : k15_memory_allocate(size, align, kind, file, line, frame);
        if (block != nullptr) return block;
        std::new_handler handler = std::get_new_handler();
        if (handler == nullptr) throw std::bad_alloc();
        handler();
    }
}

// The aligned forms. libstdc++ throws bad_alloc for an alignment that is not a power of two (0
// included) before trying to allocate, without calling the new_handler; so do they, after
// reporting it.
void* aligned_or_throw(std::size_t size, std::align_val_t align, BlockKind kind, const char* file, int line,
                       std::size_t frame) {
    if (!is_power_of_two(alignment(align))) {
        k15_memory_invalid_alignment(size, alignment(align), kind, file, line, frame);
        throw std::bad_alloc();
    }
    return allocate_or_throw(size, alignment(align), kind, file, line, frame);
}

// The nothrow forms: the block the throwing form gives, null where it throws.
template <class Allocate>
void* null_if_thrown(Allocate allocate) noexcept {
    try {
        return allocate();
    } catch (...) {
        return nullptr;
    }
}

void release(void* ptr, BlockKind kind, std::size_t frame) noexcept {
    k15_memory_deallocate(ptr, kind, frame);
}

}  // namespace

// This module's own operator new, under a name no other module can interpose. Defined below.
extern "C" void* k15_memory_own_operator_new(std::size_t size)
    __attribute__((alias("_Znwm"), visibility("hidden"), malloc, alloc_size(1)));

namespace {

// A handle of the shared library that holds the tracker, pinned: dlclose neither runs its
// destructor early (see the exit report below) nor unmaps the tracker while blocks it served are
// live. Null for the executable, which is never unloaded anyway.
void* this_module() {
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&k15_memory_own_operator_new), &self) == 0 || self.dli_fname == nullptr) {
        return nullptr;
    }
    return dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

// Whether this module's operators serve the process. The dynamic linker resolves them to this
// module's in the executable, a library loaded at start before libstdc++, and under LD_PRELOAD;
// elsewhere (a library loaded by dlopen, or loaded at start after libstdc++), the tracker takes
// them over (cpp/take_over.cpp).
bool operators_are_the_process() {
    static const bool ours = dlsym(RTLD_DEFAULT, "_Znwm") == reinterpret_cast<void*>(&k15_memory_own_operator_new) ||
                             k15::memory::detail::take_over_operators(this_module());
    return ours;
}

// Where neither holds, K15_NEW allocates and frees through the process's operators instead (the
// start-up warning has said that nothing is tracked).
template <class Function>
[[gnu::cold]] Function process_operator(const char* mangled_name) {
    return reinterpret_cast<Function>(dlsym(RTLD_DEFAULT, mangled_name));
}

}  // namespace

#define K15_FRAME frame_of(__builtin_frame_address(0))

// Plain, array, nothrow and aligned forms.
void* operator new(std::size_t size) { return allocate_or_throw(size, 0, BlockKind::New, nullptr, 0, K15_FRAME); }
void* operator new[](std::size_t size) {
    return allocate_or_throw(size, 0, BlockKind::NewArray, nullptr, 0, K15_FRAME);
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    return null_if_thrown([size, frame = K15_FRAME] { return allocate_or_throw(size, 0, BlockKind::New, nullptr, 0, frame); });
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
    return null_if_thrown(
        [size, frame = K15_FRAME] { return allocate_or_throw(size, 0, BlockKind::NewArray, nullptr, 0, frame); });
}
void* operator new(std::size_t size, std::align_val_t align) {
    return aligned_or_throw(size, align, BlockKind::New, nullptr, 0, K15_FRAME);
}
void* operator new[](std::size_t size, std::align_val_t align) {
    return aligned_or_throw(size, align, BlockKind::NewArray, nullptr, 0, K15_FRAME);
}
void* operator new(std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
    return null_if_thrown(
        [size, align, frame = K15_FRAME] { return aligned_or_throw(size, align, BlockKind::New, nullptr, 0, frame); });
}
void* operator new[](std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
    return null_if_thrown([size, align, frame = K15_FRAME] {
        return aligned_or_throw(size, align, BlockKind::NewArray, nullptr, 0, frame);
    });
}

// K15_NEW: the same, with the allocation site.
void* operator new(std::size_t size, const char* file, int line) {
    if (!operators_are_the_process()) return process_operator<void* (*)(std::size_t)>("_Znwm")(size);
    return allocate_or_throw(size, 0, BlockKind::New, file, line, K15_FRAME);
}
void* operator new[](std::size_t size, const char* file, int line) {
    if (!operators_are_the_process()) return process_operator<void* (*)(std::size_t)>("_Znam")(size);
    return allocate_or_throw(size, 0, BlockKind::NewArray, file, line, K15_FRAME);
}
void* operator new(std::size_t size, std::align_val_t align, const char* file, int line) {
    if (!operators_are_the_process()) {
        return process_operator<void* (*)(std::size_t, std::align_val_t)>("_ZnwmSt11align_val_t")(size, align);
    }
    return aligned_or_throw(size, align, BlockKind::New, file, line, K15_FRAME);
}
void* operator new[](std::size_t size, std::align_val_t align, const char* file, int line) {
    if (!operators_are_the_process()) {
        return process_operator<void* (*)(std::size_t, std::align_val_t)>("_ZnamSt11align_val_t")(size, align);
    }
    return aligned_or_throw(size, align, BlockKind::NewArray, file, line, K15_FRAME);
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
void operator delete(void* ptr, const char*, int) noexcept {
    if (!operators_are_the_process()) return process_operator<void (*)(void*)>("_ZdlPv")(ptr);
    release(ptr, BlockKind::New, K15_FRAME);
}
void operator delete[](void* ptr, const char*, int) noexcept {
    if (!operators_are_the_process()) return process_operator<void (*)(void*)>("_ZdaPv")(ptr);
    release(ptr, BlockKind::NewArray, K15_FRAME);
}
void operator delete(void* ptr, std::align_val_t align, const char*, int) noexcept {
    if (!operators_are_the_process()) {
        return process_operator<void (*)(void*, std::align_val_t)>("_ZdlPvSt11align_val_t")(ptr, align);
    }
    release(ptr, BlockKind::New, K15_FRAME);
}
void operator delete[](void* ptr, std::align_val_t align, const char*, int) noexcept {
    if (!operators_are_the_process()) {
        return process_operator<void (*)(void*, std::align_val_t)>("_ZdaPvSt11align_val_t")(ptr, align);
    }
    release(ptr, BlockKind::NewArray, K15_FRAME);
}

// The exit report, after every static destructor of the executable and of every shared library,
// wherever this object was linked: into the executable, into a shared library loaded at start or
// by dlopen, or into libk15_memory.so under LD_PRELOAD. This module's destructor runs inside the
// dynamic linker's _dl_fini, and a handler registered there runs once _dl_fini has returned
// (glibc's exit walk starts over when a handler registers another). A shared library holding the
// tracker is pinned at start-up (this_module).
extern "C" int __cxa_atexit(void (*function)(void*), void* argument, void* dso_handle);
// Defined beside the pthread_create interposer (cpp/threads.cpp): the call also pulls that
// object into every link, as no program's own objects refer to pthread_create (std::thread's
// call lies in libstdc++).
extern "C" void k15_memory_threads_start_up() noexcept;

namespace {

void report_at_exit(void*) { k15::memory::detail::report_at_exit(); }

// Where the tracker could neither be the process's operator new nor take it over (a module that
// hides its operators, a program with its own), say so once.
void warn_unless_operator_new_is_ours() {
    if (operators_are_the_process()) return;
    Dl_info owner{};
    const char* module = dladdr(dlsym(RTLD_DEFAULT, "_Znwm"), &owner) != 0 && owner.dli_fname != nullptr ? owner.dli_fname : "?";
    char line[512];
    const int length = std::snprintf(line, sizeof line,
                                     "k15-memory: warning: operator new of this process is %s's, not the tracker's, "
                                     "which cannot take it over: new/delete are not tracked (see README, "
                                     "\"Adding it to an engine\")\n",
                                     module);
    if (length > 0) {
        const std::size_t size = static_cast<std::size_t>(length) < sizeof line ? static_cast<std::size_t>(length) : sizeof line - 1;
        static_cast<void>(write(2, line, size));
    }
}

// quick_exit runs neither static destructors nor atexit handlers, only at_quick_exit's: the
// report runs there, registered first so that it runs after the program's own handlers.
void report_at_quick_exit() { k15::memory::detail::report_at_exit(); }

[[gnu::constructor]] void start_up() {
    k15::memory::detail::start_up();
    static_cast<void>(this_module());
    k15_memory_threads_start_up();
    warn_unless_operator_new_is_ours();
    std::at_quick_exit(report_at_quick_exit);
}

[[gnu::destructor]] void register_exit_report() { __cxa_atexit(report_at_exit, nullptr, nullptr); }

}  // namespace
