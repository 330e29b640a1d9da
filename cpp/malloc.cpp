// The C family of the whole process: malloc, calloc, realloc, reallocarray, free, the aligned
// forms and malloc_usable_size, replacing glibc's as glibc documents ("Replacing malloc"). Each
// passes its own frame address, as operator new does; rust/tracker/malloc.rs decides what
// becomes of the call (tracked with malloc=1, glibc's otherwise). Same archive member rules as
// new_delete.cpp: default visibility, so a shared library built from the archive exports them.

#include "entry.h"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <gnu/libc-version.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>

using k15::memory::detail::BlockKind;
using k15::memory::detail::is_power_of_two;

extern "C" {
void* k15_memory_c_allocate(std::size_t size, std::size_t align, BlockKind kind, std::size_t frame_address) noexcept;
void* k15_memory_c_calloc(std::size_t count, std::size_t size, std::size_t frame_address) noexcept;
void* k15_memory_c_realloc(void* ptr, std::size_t size, std::size_t frame_address) noexcept;
void k15_memory_c_free(void* ptr, std::size_t frame_address) noexcept;
std::size_t k15_memory_c_usable_size(void* ptr) noexcept;
}

namespace {

constexpr std::size_t page_size = 4096;

inline std::size_t frame_of(void* frame_address) { return reinterpret_cast<std::size_t>(frame_address); }

// An alignment the function refuses, as glibc does (EINVAL), reported with the caller's stack.
void* invalid_alignment(std::size_t size, std::size_t align, BlockKind kind, std::size_t frame) noexcept {
    k15_memory_invalid_alignment(size, align, kind, nullptr, 0, frame);
    errno = EINVAL;
    return nullptr;
}

// glibc's memalign: an alignment that is not a power of two is raised to the next one; past
// the largest power of two a size_t holds, EINVAL.
void* raised_to_power_of_two(std::size_t size, std::size_t align, BlockKind kind, std::size_t frame) noexcept {
    constexpr std::size_t largest = ~(~std::size_t(0) >> 1);
    if (align > largest) return invalid_alignment(size, align, kind, frame);
    std::size_t power = 1;
    while (power < align) power <<= 1;
    return k15_memory_c_allocate(size, power, kind, frame);
}

// glibc refuses aligned_alloc an alignment that is not a power of two from 2.38 on (as C23
// asks); before, it serves it as memalign does. Read only for such alignments.
bool glibc_refuses_odd_aligned_alloc() noexcept {
    char* minor = nullptr;
    const unsigned long major = std::strtoul(gnu_get_libc_version(), &minor, 10);
    return major > 2 || (major == 2 && *minor == '.' && std::strtoul(minor + 1, nullptr, 10) >= 38);
}

}  // namespace

#define K15_FRAME frame_of(__builtin_frame_address(0))

extern "C" {

void* malloc(std::size_t size) noexcept { return k15_memory_c_allocate(size, 0, BlockKind::Malloc, K15_FRAME); }

void free(void* ptr) noexcept { k15_memory_c_free(ptr, K15_FRAME); }

void* calloc(std::size_t count, std::size_t size) noexcept { return k15_memory_c_calloc(count, size, K15_FRAME); }

void* realloc(void* ptr, std::size_t size) noexcept { return k15_memory_c_realloc(ptr, size, K15_FRAME); }

void* reallocarray(void* ptr, std::size_t count, std::size_t size) noexcept {
    std::size_t total = 0;
    if (__builtin_mul_overflow(count, size, &total)) {
        errno = ENOMEM;
        return nullptr;
    }
    return k15_memory_c_realloc(ptr, total, K15_FRAME);
}

// C11: a power-of-two alignment; what becomes of others is glibc's choice, by version.
void* aligned_alloc(std::size_t align, std::size_t size) noexcept {
    if (!is_power_of_two(align)) {
        if (glibc_refuses_odd_aligned_alloc()) return invalid_alignment(size, align, BlockKind::AlignedAlloc, K15_FRAME);
        return raised_to_power_of_two(size, align, BlockKind::AlignedAlloc, K15_FRAME);
    }
    return k15_memory_c_allocate(size, align, BlockKind::AlignedAlloc, K15_FRAME);
}

// POSIX: a power of two and a multiple of sizeof(void*); errors are returned, errno is kept.
int posix_memalign(void** out, std::size_t align, std::size_t size) noexcept {
    const int saved_errno = errno;
    if (!is_power_of_two(align) || align % sizeof(void*) != 0) {
        k15_memory_invalid_alignment(size, align, BlockKind::PosixMemalign, nullptr, 0, K15_FRAME);
        errno = saved_errno;
        return EINVAL;
    }
    void* block = k15_memory_c_allocate(size, align, BlockKind::PosixMemalign, K15_FRAME);
    errno = saved_errno;
    if (block == nullptr) return ENOMEM;
    *out = block;
    return 0;
}

void* memalign(std::size_t align, std::size_t size) noexcept {
    return raised_to_power_of_two(size, align, BlockKind::Memalign, K15_FRAME);
}

void* valloc(std::size_t size) noexcept {
    return k15_memory_c_allocate(size, page_size, BlockKind::Valloc, K15_FRAME);
}

// Whole pages: the size is rounded up in the tracker, so the block's size says what it holds.
void* pvalloc(std::size_t size) noexcept {
    return k15_memory_c_allocate(size, page_size, BlockKind::Pvalloc, K15_FRAME);
}

std::size_t malloc_usable_size(void* ptr) noexcept { return k15_memory_c_usable_size(ptr); }

}  // extern "C"

// glibc's pthread_getattr_np reallocs while it holds the calling thread's own lock. A stack
// capture in that realloc (the first allocation of a thread often is one: Rust's runtime asks
// for every new thread's stack this way) must not ask pthread_getattr_np for the stack bounds
// in turn, which would wait on that lock forever: this wrapper says when the thread is inside.
namespace {
thread_local bool inside_pthread_getattr = false;
}

extern "C" bool k15_memory_thread_in_pthread_getattr() noexcept { return inside_pthread_getattr; }

extern "C" int pthread_getattr_np(pthread_t thread, pthread_attr_t* attr) noexcept {
    using Function = int (*)(pthread_t, pthread_attr_t*);
    static std::atomic<Function> glibc_function{nullptr};
    const bool outermost = !inside_pthread_getattr;
    inside_pthread_getattr = true;
    Function function = glibc_function.load(std::memory_order_acquire);
    if (function == nullptr) {
        function = reinterpret_cast<Function>(dlsym(RTLD_NEXT, "pthread_getattr_np"));
        glibc_function.store(function, std::memory_order_release);
    }
    const int result = function != nullptr ? function(thread, attr) : ENOSYS;
    if (outermost) inside_pthread_getattr = false;
    return result;
}
