// Overruns of every shape (`overrun_sweep <seed> <first|last|both> <lengths> <size>...`): for each
// size, each overrun length and each free order, eight blocks of that size are made, the fifth is
// overrun by that many bytes, and all eight are freed, the fifth first or last (the others in an
// order the seed shuffles). Afterwards the process's live blocks must be what they were before
// (run with `malloc=0`, so that only the program's own `new`s count). A size written `@N` is made
// with `K15_NEW` (a site: full headers even for 16 bytes or less).
//
// `lengths` is `all` (1 to 64) or a comma-separated list. Every shape prints
//   shape <size> <length> <order> <address> <bytes written, hex>
// and, once its blocks are freed, `count ok` or `count off by <n>`. The bytes written differ from
// shape to shape (the seed, the size, the length and the order pick them), so that the test can
// tell which shape an error is about. Four shapes in a row write their bytes from call stacks of
// different depths: valgrind shows one error per top four frames of a stack.
#include <k15/memory.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace {

[[gnu::noinline]] char* make(std::size_t size) {
    return new char[size];  // ALLOC sweep
}

[[gnu::noinline]] char* make_at_site(std::size_t size) {
    return K15_NEW char[size];  // ALLOC sweep at site
}

[[gnu::noinline]] void release(char* block) { delete[] block; }

// Writes `length` bytes of `bytes` right behind the `size` bytes of `block`, `depth` calls deep.
[[gnu::noinline]] void write_past(char* block, std::size_t size, const unsigned char* bytes,
                                  std::size_t length, int depth) {
    if (depth > 0) {
        write_past(block, size, bytes, length, depth - 1);
        std::printf("%s", "");  // keeps the call from becoming a jump
        return;
    }
    volatile char* end = block + size;
    for (std::size_t i = 0; i < length; ++i) end[i] = static_cast<char>(bytes[i]);  // WRITE past
}

std::uint64_t live_blocks() {
#ifdef K15_MEMORY_DISABLED
    return 0;
#else
    return k15::memory::stats().live_blocks;
#endif
}

struct Rng {
    std::uint64_t state;
    std::uint32_t next() {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        return static_cast<std::uint32_t>(state >> 33);
    }
};

constexpr std::size_t kMaxLength = 64;

// The bytes a shape writes: none of them the guard's fill (0xfd) or 0, the first one told apart
// from the other shapes of its size and length.
void bytes_of(Rng& rng, int shape, unsigned char (&bytes)[kMaxLength]) {
    for (std::size_t i = 0; i < kMaxLength; ++i) {
        bytes[i] = static_cast<unsigned char>(i == 0 ? 1 + shape % 250 : 1 + rng.next() % 250);
    }
}

void one_shape(Rng& rng, int shape, std::size_t size, bool at_site, std::size_t length,
               bool fifth_first, int depth) {
    // On the stack, as every other datum of the program: an overrun must reach only the
    // blocks made for it.
    unsigned char bytes[kMaxLength];
    bytes_of(rng, shape, bytes);
    const std::uint64_t before = live_blocks();
    char* blocks[8];
    for (char*& block : blocks) {
        block = at_site ? make_at_site(size) : make(size);
        std::memset(block, 0x11, size);
    }
    std::printf("shape %zu %zu %s %p ", size, length, fifth_first ? "first" : "last",
                static_cast<void*>(blocks[4]));
    for (std::size_t i = 0; i < length; ++i) std::printf("%02x", bytes[i]);
    std::printf("\n");
    std::fflush(stdout);
    write_past(blocks[4], size, bytes, length, depth);

    int order[7] = {0, 1, 2, 3, 5, 6, 7};
    for (int i = 6; i > 0; --i) std::swap(order[i], order[rng.next() % (i + 1)]);
    if (fifth_first) release(blocks[4]);
    for (int i : order) release(blocks[i]);
    if (!fifth_first) release(blocks[4]);

    const std::uint64_t after = live_blocks();
    if (after == before) {
        std::printf("count ok\n");
    } else {
        std::printf("count off by %lld\n", static_cast<long long>(after - before));
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 5) return 2;
    Rng rng{std::strtoull(argv[1], nullptr, 10) * 0x9e3779b97f4a7c15ULL + 1};
    const char* orders = argv[2];
    std::size_t lengths[kMaxLength];
    std::size_t length_count = 0;
    if (std::strcmp(argv[3], "all") == 0) {
        for (std::size_t n = 1; n <= kMaxLength; ++n) lengths[length_count++] = n;
    } else {
        for (char* p = argv[3]; *p != '\0' && length_count < kMaxLength; p += *p == ',') {
            lengths[length_count++] = std::strtoul(p, &p, 10);
        }
    }
    int shape = 0;
    for (int a = 4; a < argc; ++a) {
        const bool at_site = argv[a][0] == '@';
        const std::size_t size = std::strtoul(argv[a] + (at_site ? 1 : 0), nullptr, 10);
        for (std::size_t l = 0; l < length_count; ++l) {
            const std::size_t length = lengths[l];
            for (int first = 0; first < 2; ++first) {
                if (std::strcmp(orders, "both") != 0 && (std::strcmp(orders, "first") == 0) != (first == 1)) {
                    continue;
                }
                one_shape(rng, shape, size, at_site, length, first == 1, shape % 4);
                ++shape;
            }
        }
    }
    std::printf("last line\n");
    return 0;
}
