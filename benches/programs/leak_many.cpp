// The report at scale: `one_site N` leaks N blocks from one call stack; `many_stacks N K` leaks
// N blocks from K distinct call stacks. Prints CLOCK_MONOTONIC (ns) as main returns, so the
// benchmark can time what happens after it: the report.
#include <k15/memory.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace {

template <typename T>
T* keep(T* p) {
    asm volatile("" : : "g"(p) : "memory");
    return p;
}

constexpr int kLevels = 15;  // 2^15 distinct paths through left() and right()

void left(unsigned path, int level, int blocks);
void right(unsigned path, int level, int blocks);

// Each level calls left or right by one bit of `path`: every path is a distinct call stack.
[[gnu::noinline]] void step(unsigned path, int level, int blocks) {
    if (level == kLevels) {
        for (int i = 0; i < blocks; ++i) keep(new char[48]);
        return;
    }
    if (path >> level & 1)
        right(path, level + 1, blocks);
    else
        left(path, level + 1, blocks);
}

[[gnu::noinline]] void left(unsigned path, int level, int blocks) {
    step(path, level, blocks);
    asm volatile("");
}
[[gnu::noinline]] void right(unsigned path, int level, int blocks) {
    step(path, level, blocks);
    asm volatile("");
}

[[gnu::noinline]] void one_site(long count) {
    for (long i = 0; i < count; ++i) keep(new char[48]);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: leak_many one_site N | many_stacks N K\n");
        return 2;
    }
    const long count = std::atol(argv[2]);
    if (std::strcmp(argv[1], "one_site") == 0) {
        one_site(count);
    } else {
        const long stacks = argc > 3 ? std::atol(argv[3]) : 1;
        for (long path = 0; path < stacks; ++path) step(static_cast<unsigned>(path), 0, static_cast<int>(count / stacks));
    }
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    std::printf("%lld\n", static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec);
    std::fflush(stdout);
    return 0;
}
