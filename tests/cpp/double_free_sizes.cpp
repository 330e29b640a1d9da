// A second delete of blocks of every size range and of 64-byte-aligned blocks, each after a run
// of frees that would have let glibc give the memory back to the OS (its heap top is trimmed
// past 128 KiB of free memory): each must be reported with its size, and survived.
#include <k15/memory.h>

#include <cstddef>
#include <cstdio>
#include <new>
#include <vector>

namespace {

constexpr std::size_t kSizes[] = {16, 1000, 40000, 100000, 131000, 200000, 1 << 20};
constexpr int kBlocks = 40;

struct alignas(64) Line {
    char bytes[64];
};

}  // namespace

int main() {
    for (std::size_t size : kSizes) {
        std::vector<char*> plain;
        std::vector<Line*> aligned;
        for (int i = 0; i < kBlocks; ++i) {
            plain.push_back(new char[size]);
            plain.back()[size - 1] = 1;
            aligned.push_back(new Line[size / sizeof(Line) + 1]);
            aligned.back()->bytes[0] = 1;
        }
        for (int i = kBlocks - 1; i >= 0; --i) {
            delete[] plain[i];
            delete[] aligned[i];
        }
        delete[] plain.back();    // double free of the last block made (the top of the heap)
        delete[] aligned.back();  // the same, over-aligned
        std::printf("survived %zu\n", size);
    }
    std::puts("done");
    return 0;
}
