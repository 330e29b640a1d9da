// Runs out of address space under a limit (ulimit -v) in each of malloc, new and calloc, on
// several threads at once (each thread a different size and call each round), frees
// everything, and goes on as under glibc: a large buffer and a new thread can be had again,
// and a known set of blocks leaks.
//
//   out_of_memory THREADS
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>
constexpr int kMaxThreads = 8;
constexpr int kSlots = 1 << 20;
static void* slots[kMaxThreads][kSlots];
static std::atomic<long> refused{0};
// The leaks' addresses, inverted so that no scan takes them for pointers.
static uintptr_t hidden[1000];
static void storm(int t, size_t size, int kind) {
    int n = 0;
    for (; n < kSlots; n++) {
        void* p = nullptr;
        if (kind == 0) p = malloc(size);
        else if (kind == 1) { try { p = new char[size]; } catch (const std::bad_alloc&) {} }
        else p = calloc(1, size);
        if (!p) { refused++; break; }
        memset(p, 1, size < 64 ? size : 64);  // touched, as a program would
        slots[t][n] = p;
    }
    for (int i = 0; i < n; i++) { if (kind == 1) delete[] static_cast<char*>(slots[t][i]); else free(slots[t][i]); slots[t][i] = nullptr; }
}
static long vm_kib() {
    FILE* f = fopen("/proc/self/status", "r"); char l[256]; long v = -1;
    while (fgets(l, sizeof l, f)) if (!strncmp(l, "VmSize:", 7)) v = atol(l + 7);
    fclose(f); return v;
}
int main(int argc, char** argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    // Sizes of which a million never fit in the limits the tests set.
    const size_t sizes[] = {1000, 5000, 100000, 3 << 20, 2000};
    std::barrier sync(threads);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; t++)
        ts.emplace_back([&, t] { for (int round = 0; round < 5; round++) { storm(t, sizes[(t + round) % 5], (t + round) % 3); sync.arrive_and_wait(); } });
    for (auto& t : ts) t.join();
    fprintf(stderr, "VmSize after the storms: %ld KiB\n", vm_kib());
    // Cleared, so that no stale word in one points at another.
    for (auto& h : hidden) h = ~reinterpret_cast<uintptr_t>(memset(malloc(40), 0, 40));  // LEAK
    printf("%s\n", refused.load() >= 5 * threads ? "every storm ran out" : "some storm never ran out");
    void* big = malloc(64 << 20);
    if (big) memset(big, 1, 64 << 20);
    std::thread later([] { printf("a thread started\n"); });
    later.join();
    printf("a large buffer %s\n", big ? "given" : "refused");
    free(big);
    return 0;
}
