// Large blocks (mapped alone by the tracker) leaked and kept: a 1 MiB block leaked at the address
// where three earlier ones were freed (the tracker keeps a freed mapping for the next large block
// and remembers the blocks it freed there), a 200,000-byte one, a 300,000-byte one aligned to
// 64 KiB, all unreachable; and one a global holds. valgrind is the referee.
#include <k15/memory.h>

#include <cstddef>
#include <cstdio>
#include <new>

namespace {

struct alignas(65536) Aligned {
    char bytes[300000];
};

char* held;

// Not inlined, so that no pointer to the blocks stays in a register or on main's frame.
__attribute__((noinline)) void leak() {
    for (int i = 0; i < 3; ++i) {
        char* freed = new char[1 << 20];
        freed[0] = 1;
        delete[] freed;
    }
    char* reused = new char[1 << 20];
    reused[0] = 2;
    char* plain = new char[200000];
    plain[0] = 3;
    Aligned* aligned = new Aligned;
    aligned->bytes[0] = 4;
    std::printf("leaked %p %p %p\n", static_cast<void*>(reused), static_cast<void*>(plain),
                static_cast<void*>(aligned));
}

}  // namespace

int main() {
    leak();
    held = new char[500000];
    held[0] = 5;
    std::puts("done");
    return 0;
}
