// keep(p): the optimizer must assume `p` escapes, so a block meant to leak (or to live) is
// really allocated and its pointer really dropped or stored where the test says.
#pragma once

template <typename T>
T* keep(T* p) {
    asm volatile("" : : "g"(p) : "memory");
    return p;
}
