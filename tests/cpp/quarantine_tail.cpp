// Writes just past the end of freed blocks under `quarantine=` (`quarantine_tail`): blocks of
// several sizes, with room left in their size class (guard bytes behind them) and without (the
// next block's header behind them), are made, freed, and written one byte past their end; check_heap() must report each as an
// overrun of that freed block, with its allocation and free stacks, as valgrind reports
// "0 bytes after a block of size N free'd".
#include <k15/memory.h>

#include <cstdio>
#include <cstring>

namespace {

volatile std::size_t one = 1;  // an index the compiler cannot see through

[[gnu::noinline]] char* make(std::size_t size) {
    char* block = new char[size];  // ALLOC tail
    std::memset(block, 0, size);
    return block;
}

[[gnu::noinline]] void release(char* block) { delete[] block; }

[[gnu::noinline]] void write_past_freed(std::size_t size, char byte) {
    char* block = make(size);
    release(block);
    block[size * one] = byte;  // WRITE past freed
    std::printf("freed %zu %p\n", size, static_cast<void*>(block));
}

}  // namespace

int main() {
    // 10 and 24: compact and full blocks with guard bytes; 100, 1000: larger classes' guards;
    // 200000: a block of its own mapping.
    // One call each (no loop): valgrind shows one error per call stack.
    write_past_freed(10, 'A');
    write_past_freed(24, 'B');
    write_past_freed(100, 'C');
    write_past_freed(1000, 'D');
    write_past_freed(200000, 'E');
    // Sizes that fill their class: 16 (a compact slot) and 32 (a 64-byte block).
    write_past_freed(16, 'F');
    write_past_freed(32, 'G');
    // Fewer bytes than the free's stack (4) the free path keeps in a freed block: blocks freed
    // and never written are no overruns, nor are the bytes past the one written.
    for (std::size_t size = 0; size < 4; ++size) release(make(size));
    write_past_freed(1, 'H');
    write_past_freed(3, 'I');
#ifndef K15_MEMORY_DISABLED
    std::printf("check_heap: %zu\n", k15::memory::check_heap());
#endif
    std::printf("last line\n");
    return 0;
}
