// The C family under the tracker (run with malloc=1 unless a test says otherwise): argv[1]
// picks a scenario; each prints what it checked and leaves its leaks and errors to the report.

#include <k15/memory.h>

#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

extern "C" void* __libc_malloc(std::size_t size);  // glibc's own: memory the tracker never saw
extern "C" void* dso_make_buffer(std::size_t size);  // tests/cpp/malloc_dso.cpp

namespace {

void* volatile sink;  // keeps leaked pointers out of the optimizer's sight
bool all_aligned = true;

void keep(void* block, std::size_t align) {
    sink = block;
    if (block == nullptr || reinterpret_cast<std::uintptr_t>(block) % align != 0) all_aligned = false;
}

[[gnu::noinline]] void leak_malloc() { keep(malloc(11), 16); }
[[gnu::noinline]] void leak_calloc() {
    void* dirty = malloc(21);
    std::memset(dirty, 0xff, 21);
    free(dirty);
    auto* zeroed = static_cast<unsigned char*>(calloc(3, 7));  // most likely dirty's memory
    for (int i = 0; i < 21; ++i)
        if (zeroed[i] != 0) std::printf("calloc not zeroed\n");
    keep(zeroed, 16);
}
void* volatile no_block = nullptr;  // g++ turns realloc(nullptr, n) written out into malloc(n)
[[gnu::noinline]] void leak_realloc() { keep(realloc(no_block, 13), 16); }
[[gnu::noinline]] void leak_reallocarray() { keep(reallocarray(no_block, 5, 8), 16); }
[[gnu::noinline]] void leak_aligned_alloc() { keep(aligned_alloc(64, 192), 64); }
[[gnu::noinline]] void leak_posix_memalign() {
    void* block = nullptr;
    if (posix_memalign(&block, 256, 33) != 0) std::printf("posix_memalign failed\n");
    keep(block, 256);
}
[[gnu::noinline]] void leak_memalign() { keep(memalign(4096, 45), 4096); }
[[gnu::noinline]] void leak_valloc() { keep(valloc(57), 4096); }
[[gnu::noinline]] void leak_pvalloc() { keep(pvalloc(99), 4096); }
[[gnu::noinline]] void leak_strdup() { keep(strdup("strdup leak"), 16); }
[[gnu::noinline]] void leak_asprintf() {
    char* text = nullptr;
    if (asprintf(&text, "%d-%s", 42, "asprintf") < 0) std::printf("asprintf failed\n");
    keep(text, 16);
}
[[gnu::noinline]] void leak_getline() {
    FILE* file = fopen("/proc/self/cmdline", "r");
    char* line = nullptr;
    std::size_t capacity = 0;
    if (getline(&line, &capacity, file) < 0) std::printf("getline failed\n");
    fclose(file);
    keep(line, 16);
}

// grow, grow past the heap into a mapping, shrink back: the bytes follow each move.
[[gnu::noinline]] void realloc_chain() {
    auto* text = static_cast<char*>(realloc(no_block, 16));
    std::strcpy(text, "chain of blocks");
    for (std::size_t size : {1000u, 200000u, 24u}) {
        text = static_cast<char*>(realloc(text, size));
        if (std::strcmp(text, "chain of blocks") != 0) std::printf("realloc lost the bytes at %zu\n", size);
    }
    keep(text, 16);
}

void leaks() {
    leak_malloc();
    leak_calloc();
    leak_realloc();
    leak_reallocarray();
    leak_aligned_alloc();
    leak_posix_memalign();
    leak_memalign();
    leak_valloc();
    leak_pvalloc();
    leak_strdup();
    leak_asprintf();
    leak_getline();
    const auto before = k15::memory::stats();
    realloc_chain();
    void* gone = realloc(malloc(64), 0);  // glibc: frees, returns null
    const auto after = k15::memory::stats();
    std::printf("realloc chain: %llu block, %llu bytes, freed by realloc 0: %s\n",
                static_cast<unsigned long long>(after.live_blocks - before.live_blocks),
                static_cast<unsigned long long>(after.live_bytes - before.live_bytes), gone ? "no" : "yes");
    std::printf("usable: %zu %zu %zu\n", malloc_usable_size(const_cast<void*>(sink)), malloc_usable_size(nullptr),
                malloc_usable_size(pvalloc(1)));
    std::printf("aligned: %s\n", all_aligned ? "yes" : "no");
}

[[gnu::noinline]] int* make_int() { return new int(7); }
[[gnu::noinline]] int* make_ints() { return new int[4]; }
[[gnu::noinline]] void* make_buffer(std::size_t size) { return malloc(size); }

void mismatches() {
    const auto before = k15::memory::stats();
    free(make_int());                                             // FREE new
    keep(realloc(make_ints(), 100), 16);                          // REALLOC new[]
    delete static_cast<int*>(make_buffer(sizeof(int)));          // DELETE malloc
    delete[] static_cast<int*>(make_buffer(8 * sizeof(int)));    // DELETE[] malloc
    const auto after = k15::memory::stats();
    std::printf("released: %s\n", after.live_blocks == before.live_blocks + 1 ? "yes" : "no");
}

void foreign(bool tracked) {
    void* glibc_block = __libc_malloc(100);
    std::printf("glibc usable: %zu\n", malloc_usable_size(glibc_block));
    free(glibc_block);  // FREE glibc
    void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    free(page);  // FREE mmap
    alignas(16) char on_stack[32] = {};
    free(on_stack + 16);  // FREE stack
    volatile std::uintptr_t near_null = 0x30;
    free(reinterpret_cast<void*>(near_null));  // FREE near null
    keep(realloc(on_stack + 16, 64), 1);  // REALLOC stack
    std::printf("realloc of a stack pointer: %s\n", sink == nullptr ? "null" : "a block");
    munmap(page, 4096);
    if (!tracked) return;  // glibc's own checks would abort on what follows
    void* block = malloc(40);
    free(block);
    free(block);  // FREE twice
}

// pthread_getattr_np reallocs while holding the thread's own lock; as a thread's first call
// (Rust's runtime makes it in every thread it starts) that realloc is the thread's first capture.
[[gnu::noinline]] void ask_for_own_stack() {
    pthread_attr_t attr;
    void* stack = nullptr;
    std::size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        pthread_attr_getstack(&attr, &stack, &size);
        pthread_attr_destroy(&attr);
    }
    std::printf("own stack known: %s\n", size > 0 ? "yes" : "no");
}

void threads() {
    std::thread(ask_for_own_stack).join();
    void* from_main = malloc(300);
    std::thread worker([from_main] {
        free(from_main);
        keep(make_buffer(333), 16);  // THREAD leak
    });
    worker.join();
    keep(dso_make_buffer(444), 16);
}

// The tracker's own memory (stack depot, unwinder caches, symbolizer, report) never comes back
// through the family it tracks: only the program's calls are counted.
[[gnu::noinline]] void* deep(int depth) {
    if (depth == 0) return malloc(8);
    void* block = deep(depth - 1);
    sink = &depth;
    return block;
}

void reentrancy() {
    std::printf("counting\n");  // stdout's buffer, allocated before the count starts
    const auto before = k15::memory::stats();
    for (int round = 0; round < 2; ++round) {
        for (int depth = 0; depth < 40; ++depth) free(deep(depth));
        k15::memory::write_leak_report("midway.log");
    }
    const auto after = k15::memory::stats();
    std::printf("allocations: %llu, frees: %llu\n",
                static_cast<unsigned long long>(after.total_allocations - before.total_allocations),
                static_cast<unsigned long long>(after.total_frees - before.total_frees));
}

// Sizes no allocator can serve, some only once rounded up (pvalloc's whole pages, an
// alignment, the header): every function refuses them as glibc does, null and ENOMEM (returned
// by posix_memalign), and the counts stay as they were.
void huge_sizes() {
    const std::size_t sizes[] = {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - 4095, SIZE_MAX / 2 + 1, std::size_t{1} << 40};
    const auto before = k15::memory::stats();
    int served = 0;
    int other_errno = 0;
    auto refused = [&](auto allocate) {
        errno = 0;
        void* block = allocate();
        if (block != nullptr) ++served;
        if (errno != ENOMEM) ++other_errno;
        free(block);
    };
    for (const std::size_t size : sizes) {
        refused([&] { return malloc(size); });
        refused([&] { return calloc(1, size); });
        refused([&] { return valloc(size); });
        refused([&] { return pvalloc(size); });
        refused([&] { return memalign(256, size); });
        refused([&] { return aligned_alloc(8192, size); });
        refused([&] {
            void* block = nullptr;
            const int result = posix_memalign(&block, 64, size);
            errno = result;  // posix_memalign returns its error and leaves errno alone
            return result == 0 ? block : nullptr;
        });
        void* resized = malloc(10);
        refused([&] {
            void* moved = realloc(resized, size);
            if (moved == nullptr) free(resized);
            return moved;
        });
    }
    const auto after = k15::memory::stats();
    std::printf("huge sizes served: %d, other errno: %d, counts unchanged: %s\n", served, other_errno,
                after.live_blocks == before.live_blocks && after.live_bytes == before.live_bytes ? "yes" : "no");
}

}  // namespace

int main(int argc, char** argv) {
    const std::string scenario = argc > 1 ? argv[1] : "";
    if (scenario == "leaks") leaks();
    if (scenario == "mismatches") mismatches();
    if (scenario == "foreign") foreign(true);
    if (scenario == "foreign_to_glibc") foreign(false);
    if (scenario == "threads") threads();
    if (scenario == "reentrancy") reentrancy();
    if (scenario == "huge_sizes") huge_sizes();
    std::printf("survived\n");
}
