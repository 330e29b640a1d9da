// Every aligned allocating form, with alignments that are not powers of two (and a few that are):
// one line per call on stdout, `form alignment outcome`, which must read the same with the
// tracker as without it (-DK15_MEMORY_DISABLED). Each call lies in a function of its own, on the
// line of its `// CALL` marker, so the test can check the stacks of the invalid_alignment errors.
#include <k15/memory.h>

#include <malloc.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace {

constexpr std::size_t block_size = 64;

// Every block served is checked for its alignment (where it is a power of two: glibc raises
// others to the next one) and freed; a failed call prints why.
void print(const char* form, std::size_t align, void* block, const char* failure) {
    if (block == nullptr) {
        std::printf("%s %zu %s\n", form, align, failure);
        return;
    }
    const bool power_of_two = align != 0 && (align & (align - 1)) == 0;
    const bool aligned = !power_of_two || reinterpret_cast<std::uintptr_t>(block) % align == 0;
    std::printf("%s %zu %s\n", form, align, aligned ? "ok" : "misaligned");
}

const char* errno_name(int error) { return error == EINVAL ? "EINVAL" : error == ENOMEM ? "ENOMEM" : "other"; }

[[gnu::noinline]] void call_new(std::size_t align) {
    try {
        void* block = ::operator new(block_size, std::align_val_t{align});  // CALL new
        print("new", align, block, "");
        ::operator delete(block, std::align_val_t{align});
    } catch (const std::bad_alloc&) {
        print("new", align, nullptr, "bad_alloc");
    }
}

[[gnu::noinline]] void call_new_array(std::size_t align) {
    try {
        void* block = ::operator new[](block_size, std::align_val_t{align});  // CALL new[]
        print("new[]", align, block, "");
        ::operator delete[](block, std::align_val_t{align});
    } catch (const std::bad_alloc&) {
        print("new[]", align, nullptr, "bad_alloc");
    }
}

[[gnu::noinline]] void call_new_nothrow(std::size_t align) {
    void* block = ::operator new(block_size, std::align_val_t{align}, std::nothrow);  // CALL new nothrow
    print("new_nothrow", align, block, "null");
    ::operator delete(block, std::align_val_t{align});
}

[[gnu::noinline]] void call_new_array_nothrow(std::size_t align) {
    void* block = ::operator new[](block_size, std::align_val_t{align}, std::nothrow);  // CALL new[] nothrow
    print("new[]_nothrow", align, block, "null");
    ::operator delete[](block, std::align_val_t{align});
}

// K15_NEW's aligned placement forms; without the tracker K15_NEW is plain new, which calls the
// aligned operator new.
#if defined(K15_MEMORY_DISABLED)
#define K15_ALIGNED_NEW(size, align) ::operator new(size, align)
#define K15_ALIGNED_NEW_ARRAY(size, align) ::operator new[](size, align)
#else
#define K15_ALIGNED_NEW(size, align) ::operator new(size, align, __FILE__, __LINE__)
#define K15_ALIGNED_NEW_ARRAY(size, align) ::operator new[](size, align, __FILE__, __LINE__)
#endif

[[gnu::noinline]] void call_k15_new(std::size_t align) {
    try {
        void* block = K15_ALIGNED_NEW(block_size, std::align_val_t{align});  // CALL K15_NEW
        print("K15_NEW", align, block, "");
        ::operator delete(block, std::align_val_t{align});
    } catch (const std::bad_alloc&) {
        print("K15_NEW", align, nullptr, "bad_alloc");
    }
}

[[gnu::noinline]] void call_k15_new_array(std::size_t align) {
    try {
        void* block = K15_ALIGNED_NEW_ARRAY(block_size, std::align_val_t{align});  // CALL K15_NEW[]
        print("K15_NEW[]", align, block, "");
        ::operator delete[](block, std::align_val_t{align});
    } catch (const std::bad_alloc&) {
        print("K15_NEW[]", align, nullptr, "bad_alloc");
    }
}

[[gnu::noinline]] void call_aligned_alloc(std::size_t align) {
    errno = 0;
    void* block = aligned_alloc(align, block_size);  // CALL aligned_alloc
    print("aligned_alloc", align, block, errno_name(errno));
    std::free(block);
}

[[gnu::noinline]] void call_posix_memalign(std::size_t align) {
    void* block = nullptr;
    errno = 0;
    const int result = posix_memalign(&block, align, block_size);  // CALL posix_memalign
    if (errno != 0) std::printf("posix_memalign %zu changed errno\n", align);
    print("posix_memalign", align, result == 0 ? block : nullptr, errno_name(result));
    std::free(result == 0 ? block : nullptr);
}

[[gnu::noinline]] void call_memalign(std::size_t align) {
    errno = 0;
    void* block = memalign(align, block_size);  // CALL memalign
    print("memalign", align, block, errno_name(errno));
    std::free(block);
}

}  // namespace

int main() {
    const std::size_t largest_power = ~(~std::size_t(0) >> 1);
    const std::size_t alignments[] = {0,  3,   5,    7,    12,   24,   48,   63,
                                      96, 100, 1000, 4097, 6144, 1, 2, 4, 8, 16, 64, 4096,
                                      (largest_power >> 1) + 1, largest_power + 1, SIZE_MAX};
    for (const std::size_t align : alignments) {
        call_new(align);
        call_new_array(align);
        call_new_nothrow(align);
        call_new_array_nothrow(align);
        call_k15_new(align);
        call_k15_new_array(align);
        call_aligned_alloc(align);
        call_posix_memalign(align);
        call_memalign(align);
    }
    std::printf("done\n");
    return 0;
}
