// Blocks the quarantine holds whatever placed them (the heap, the aligned blocks' own), each
// holding the program's data in its first bytes when freed, then written after the free:
// the report names the function that freed each, never a stack its data would name as an id.
#include <k15/memory.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

[[gnu::noinline]] void* allocate_aligned(std::size_t align) {
    void* block = nullptr;
    if (posix_memalign(&block, align, 64) != 0) std::abort();
    return block;
}

[[gnu::noinline]] void release_here(void* block) { std::free(block); }

}  // namespace

int main() {
    // Stacks of their own first, so that the small numbers the blocks hold name real ones.
    for (int i = 0; i < 32; ++i) std::free(std::malloc(16 + i));
    const std::size_t alignments[] = {16, 128, 256, 4096};
    for (std::size_t align : alignments) {
        auto* block = static_cast<unsigned*>(allocate_aligned(align));
        block[0] = 3;  // the program's data where the free's stack goes
        release_here(block);
        static_cast<volatile char*>(static_cast<void*>(block))[10] = 1;  // after its free
    }
    std::printf("check_heap: %zu\n", k15::memory::check_heap());
    return 0;
}
