// Every kind of bad free, one after the other: each must be reported and survived, and none may
// change the tracker's counts beyond what a correct free would have done.
#include <k15/memory.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

int global_object;
void* volatile sink;

bool same(const k15::memory::Stats& a, const k15::memory::Stats& b) {
    return a.live_blocks == b.live_blocks && a.live_bytes == b.live_bytes && a.total_allocations == b.total_allocations &&
           a.total_frees == b.total_frees;
}

[[gnu::noinline]] void free_array_with_delete(int* block) { delete block; }           // MISMATCH new[] -> delete
[[gnu::noinline]] void free_object_with_delete_array(long* block) { delete[] block; }  // MISMATCH new -> delete[]

}  // namespace

int main() {
    int* array = K15_NEW int[4];  // ALLOC array
    long* object = K15_NEW long;  // ALLOC object
    int* twice = K15_NEW int(7);  // ALLOC twice
    char* large = new char[1 << 20];
    char* page_aligned = static_cast<char*>(::operator new(64, std::align_val_t{4096}));
    char* live = K15_NEW char[64];
    std::memset(live, 0, 64);
    void* from_malloc = std::malloc(32);

    // Mismatches are reported and the block is still freed.
    const k15::memory::Stats before_mismatch = k15::memory::stats();
    free_array_with_delete(array);
    free_object_with_delete_array(object);
    const k15::memory::Stats after_mismatch = k15::memory::stats();
    std::printf("mismatch freed: %s\n",
                after_mismatch.live_blocks + 2 == before_mismatch.live_blocks && after_mismatch.total_frees == before_mismatch.total_frees + 2
                    ? "yes"
                    : "no");

    delete twice;
    delete[] large;
    ::operator delete(page_aligned, std::align_val_t{4096});

    // From here on, nothing is a valid free: the counts must not move.
    const k15::memory::Stats before = k15::memory::stats();
    delete twice;                                      // double free, small block
    delete[] large;                                    // double free, large (unmapped) block
    ::operator delete(page_aligned, std::align_val_t{4096});  // double free, page-aligned block
    int on_stack = 0;
    sink = &on_stack;
    delete static_cast<int*>(sink);                    // invalid: the stack
    delete &global_object;                             // invalid: a global
    delete[] (live + 16);                              // invalid: inside a live block
    delete static_cast<char*>(from_malloc);            // invalid: malloc's memory
    delete static_cast<int*>(nullptr);                 // fine: no-op
    const k15::memory::Stats after = k15::memory::stats();
    std::printf("counts unchanged: %s\n", same(before, after) ? "yes" : "no");

    // The tracker is intact: the live block is still freed normally.
    live[63] = 1;
    delete[] live;
    std::free(from_malloc);
    std::puts("survived");
    return 0;
}
