// Memory a program stopped using comes back while it goes on with other work: blocks of 24 size
// classes freed (each class's span also held by the thread's own lists of that class) go back once
// the thread has not used those classes for a while; the pages inside free 40 KB blocks go back
// while one live block per span keeps the spans. Prints resident KiB at each point.
#include <cstdio>
#include <cstring>
#include <vector>
#include "resident.h"

namespace {

// 24 classes from 48 to 968 bytes, 1.6 MB of blocks each: about 38 MB, several times what the
// heap keeps of its free spans ready for the next class that needs one (4 MiB).
constexpr int kClasses = 24;
constexpr int kBytesPerClass = 1600 * 1000;

std::vector<char*> allocate_classes() {
    std::vector<char*> blocks;
    for (int c = 0; c < kClasses; ++c) {
        const int size = 48 + 40 * c;
        for (int i = 0; i < kBytesPerClass / size; ++i) {
            char* block = new char[size];
            std::memset(block, 0x5a, size);
            blocks.push_back(block);
        }
    }
    return blocks;
}

// Other work: lists of one other class taken and given back, again and again.
void other_work() {
    std::vector<char*> batch(300);
    for (int round = 0; round < 2000; ++round) {
        for (char*& block : batch) block = new char[2000];
        for (char* block : batch) delete[] block;
    }
}

}  // namespace

int main() {
    // 200 blocks of 40 KB (eight spans); one in 25 stays live, so that no span is freed. First,
    // while no free span of the heap is kept resident for reuse.
    const long large_start = resident_kib();
    std::vector<char*> large;
    for (int i = 0; i < 200; ++i) {
        large.push_back(new char[40000]);
        std::memset(large.back(), 0x5a, 40000);
    }
    const long large_peak = resident_kib();
    for (int i = 0; i < 200; ++i) {
        if (i % 25 != 0) {
            delete[] large[i];
            large[i] = nullptr;
        }
    }
    const long large_freed = resident_kib();
    std::printf("large_start %ld large_peak %ld large_freed %ld\n", large_start, large_peak,
                large_freed);
    for (char* block : large) delete[] block;

    const long start = resident_kib();
    std::vector<char*> blocks = allocate_classes();
    const long classes_peak = resident_kib();
    for (char* block : blocks) delete[] block;
    std::vector<char*>().swap(blocks);
    const long classes_freed = resident_kib();
    other_work();
    const long after_other_work = resident_kib();
    std::printf("start %ld classes_peak %ld classes_freed %ld after_other_work %ld\n", start,
                classes_peak, classes_freed, after_other_work);
    std::puts("done");
    return 0;
}
