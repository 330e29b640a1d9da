// The C family of the whole process: malloc, calloc, realloc, reallocarray, free, the aligned
// forms and malloc_usable_size, replacing glibc's as glibc documents ("Replacing malloc"). Each
// passes its own frame address, as operator new does; rust/tracker/malloc.rs decides what
// becomes of the call (tracked with malloc=1, glibc's otherwise). Same archive member rules as
// new_delete.cpp: default visibility, so a shared library built from the archive exports them.

#include "entry.h"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstddef>

using k15::memory::detail::BlockKind;

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

inline bool is_power_of_two(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }

void* invalid_alignment() noexcept {
    errno = EINVAL;
    return nullptr;
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

// C11: a power-of-two alignment (glibc 2.38 and C23 reject others too).
void* aligned_alloc(std::size_t align, std::size_t size) noexcept {
    if (!is_power_of_two(align)) return invalid_alignment();
    return k15_memory_c_allocate(size, align, BlockKind::AlignedAlloc, K15_FRAME);
}

// POSIX: a power of two and a multiple of sizeof(void*); errors are returned, errno is kept.
int posix_memalign(void** out, std::size_t align, std::size_t size) noexcept {
    if (!is_power_of_two(align) || align % sizeof(void*) != 0) return EINVAL;
    const int saved_errno = errno;
    void* block = k15_memory_c_allocate(size, align, BlockKind::PosixMemalign, K15_FRAME);
    errno = saved_errno;
    if (block == nullptr) return ENOMEM;
    *out = block;
    return 0;
}

// glibc: any other alignment is raised to the next power of two.
void* memalign(std::size_t align, std::size_t size) noexcept {
    if (align > (std::size_t(1) << 62)) return invalid_alignment();
    std::size_t power = 1;
    while (power < align) power <<= 1;
    return k15_memory_c_allocate(size, power, BlockKind::Memalign, K15_FRAME);
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
