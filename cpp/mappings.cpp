// mmap, mmap64, munmap and mremap, interposed (this object is linked in when the program calls
// them): the tracker records the program's anonymous mappings, which the leak scan reads as
// roots, as valgrind does (an engine's arenas and fiber stacks hold pointers to blocks). Each
// makes the system call itself, as glibc's wrappers do, so that nothing here allocates or looks
// a symbol up: a mapping may be made before anything else of the process is ready.
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdint>

#include "k15-memory/rust/ffi.rs.h"

namespace {

std::size_t address_of(void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer); }

}  // namespace

extern "C" void* mmap(void* address, std::size_t length, int protection, int flags, int fd,
                      off_t offset) noexcept {
    // syscall() returns -1 with errno set on failure: MAP_FAILED, as from glibc's mmap.
    void* mapped = reinterpret_cast<void*>(
        syscall(SYS_mmap, address, length, protection, flags, fd, offset));
    if (mapped != MAP_FAILED) {
        k15::memory::detail::mapped(address_of(mapped), length, (flags & MAP_ANONYMOUS) != 0);
    }
    return mapped;
}

// On x86_64 glibc's mmap64 is the same function under a second name.
extern "C" void* mmap64(void* address, std::size_t length, int protection, int flags, int fd,
                        off_t offset) noexcept {
    return mmap(address, length, protection, flags, fd, offset);
}

extern "C" int munmap(void* address, std::size_t length) noexcept {
    const int result = static_cast<int>(syscall(SYS_munmap, address, length));
    if (result == 0) {
        k15::memory::detail::unmapped(address_of(address), length);
    }
    return result;
}

extern "C" void* mremap(void* old_address, std::size_t old_length, std::size_t new_length,
                        int flags, ...) noexcept {
    void* new_address = nullptr;
    if ((flags & MREMAP_FIXED) != 0) {
        va_list rest;
        va_start(rest, flags);
        new_address = va_arg(rest, void*);
        va_end(rest);
    }
    void* moved = reinterpret_cast<void*>(
        syscall(SYS_mremap, old_address, old_length, new_length, flags, new_address));
    if (moved != MAP_FAILED) {
        k15::memory::detail::remapped(address_of(old_address), old_length, address_of(moved),
                                      new_length);
    }
    return moved;
}
