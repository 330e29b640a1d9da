// C functions whose names read as Itanium type codes (`f` float, `i` int, `v` void, `Pc` char*,
// `Sa` std::allocator), each leaking one block of its own size: the report names them as
// they are, as valgrind's leak-cases and leak-tree tests' functions are named.

#include <cstdlib>

#include "keep.h"

extern "C" {
__attribute__((noinline)) void f() { keep(std::malloc(11)); }   // LEAK f
__attribute__((noinline)) void i() { keep(std::malloc(12)); }   // LEAK i
__attribute__((noinline)) void v() { keep(std::malloc(13)); }   // LEAK v
__attribute__((noinline)) void Pc() { keep(std::malloc(14)); }  // LEAK Pc
__attribute__((noinline)) void Sa() { keep(std::malloc(15)); }  // LEAK Sa
}

int main() {
    f();
    i();
    v();
    Pc();
    Sa();
    return 0;
}
