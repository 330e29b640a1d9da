// One new/delete of a size that changes, so that a signal handler lands now and then in every
// size class and in the large-block path.
#pragma once

#include <cstddef>

inline void churn_once(unsigned& step) {
    step = step * 1103515245u + 12345u;
    const std::size_t size = (step >> 8) % 64 == 0 ? 200000 : 8 + (step >> 8) % 600;
    char* block = new char[size];
    block[0] = 1;
    delete[] block;
}
