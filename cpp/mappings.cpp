// mmap, mmap64, munmap and mremap, interposed (this object is linked in when the program calls
// them): the tracker makes each system call itself, as glibc's wrappers do, and records the
// program's anonymous mappings, which the leak scan reads as roots, as valgrind does (an
// engine's arenas and fiber stacks hold pointers to blocks). Nothing here allocates or looks a
// symbol up: a mapping may be made before anything else of the process is ready.
#include <sys/mman.h>

#include <cstdarg>
#include <cstdint>

#include "k15-memory/rust/ffi.rs.h"

namespace {

std::size_t address_of(void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer); }

// A system call's result as a pointer: -1 (errno set) is MAP_FAILED, as from glibc.
void* pointer_of(std::intptr_t result) { return reinterpret_cast<void*>(result); }

}  // namespace

extern "C" void* mmap(void* address, std::size_t length, int protection, int flags, int fd,
                      off_t offset) noexcept {
    return pointer_of(k15::memory::detail::program_mmap(address_of(address), length, protection,
                                                        flags, fd, offset));
}

// On x86_64 glibc's mmap64 is the same function under a second name.
extern "C" void* mmap64(void* address, std::size_t length, int protection, int flags, int fd,
                        off_t offset) noexcept {
    return mmap(address, length, protection, flags, fd, offset);
}

extern "C" int munmap(void* address, std::size_t length) noexcept {
    return static_cast<int>(k15::memory::detail::program_munmap(address_of(address), length));
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
    return pointer_of(k15::memory::detail::program_mremap(
        address_of(old_address), old_length, new_length, flags, address_of(new_address)));
}
