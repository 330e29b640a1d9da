// Sizes at the edge of the address space, every alignment up to 1 MiB, every operator new form:
// each request must be refused (null from the nothrow forms, std::bad_alloc from the others),
// never crash, and leave the tracker's counts alone. Then ordinary blocks of every alignment
// still work. `edge_sizes <seed> <requests>`.
#include <k15/memory.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace {

struct Rng {
    std::uint64_t state;
    std::uint64_t next() {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        return state >> 11;
    }
};

// A size no allocator can serve: near SIZE_MAX, near half of it, near PTRDIFF_MAX, or a size
// that only overflows once a header, a guard or an alignment's rounding is added.
std::size_t edge_size(Rng& rng) {
    const std::size_t near = rng.next() % 4096;
    switch (rng.next() % 5) {
        case 0: return SIZE_MAX - near;
        case 1: return SIZE_MAX / 2 + near;
        case 2: return static_cast<std::size_t>(PTRDIFF_MAX) - near;
        case 3: return SIZE_MAX - (std::size_t{1} << (rng.next() % 21)) + 1;
        default: return SIZE_MAX - 64 - (near % 128);
    }
}

using Form = void* (*)(std::size_t size, std::size_t align);

void* plain(std::size_t size, std::size_t) { return ::operator new(size); }
void* array(std::size_t size, std::size_t) { return ::operator new[](size); }
void* nothrow(std::size_t size, std::size_t) { return ::operator new(size, std::nothrow); }
void* nothrow_array(std::size_t size, std::size_t) { return ::operator new[](size, std::nothrow); }
void* aligned(std::size_t size, std::size_t align) { return ::operator new(size, std::align_val_t(align)); }
void* aligned_array(std::size_t size, std::size_t align) { return ::operator new[](size, std::align_val_t(align)); }
void* aligned_nothrow(std::size_t size, std::size_t align) {
    return ::operator new(size, std::align_val_t(align), std::nothrow);
}
void* aligned_nothrow_array(std::size_t size, std::size_t align) {
    return ::operator new[](size, std::align_val_t(align), std::nothrow);
}
void* placed(std::size_t size, std::size_t) { return ::operator new(size, __FILE__, __LINE__); }
void* placed_array(std::size_t size, std::size_t) { return ::operator new[](size, __FILE__, __LINE__); }
void* placed_aligned(std::size_t size, std::size_t align) {
    return ::operator new(size, std::align_val_t(align), __FILE__, __LINE__);
}
void* placed_aligned_array(std::size_t size, std::size_t align) {
    return ::operator new[](size, std::align_val_t(align), __FILE__, __LINE__);
}

struct NamedForm {
    const char* name;
    Form form;
    bool throws;
    bool is_array;
    bool takes_align;
};

const NamedForm kForms[] = {
    {"new", plain, true, false, false},
    {"new[]", array, true, true, false},
    {"new nothrow", nothrow, false, false, false},
    {"new[] nothrow", nothrow_array, false, true, false},
    {"new align", aligned, true, false, true},
    {"new[] align", aligned_array, true, true, true},
    {"new align nothrow", aligned_nothrow, false, false, true},
    {"new[] align nothrow", aligned_nothrow_array, false, true, true},
    {"K15_NEW", placed, true, false, false},
    {"K15_NEW[]", placed_array, true, true, false},
    {"K15_NEW align", placed_aligned, true, false, true},
    {"K15_NEW[] align", placed_aligned_array, true, true, true},
};

}  // namespace

int main(int argc, char** argv) {
    Rng rng{argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1};
    const long requests = argc > 2 ? std::atol(argv[2]) : 2000;
    const k15::memory::Stats before = k15::memory::stats();
    long refused = 0;
    long wrong = 0;
    for (long i = 0; i < requests; ++i) {
        const NamedForm& form = kForms[rng.next() % (sizeof kForms / sizeof kForms[0])];
        const std::size_t align = std::size_t{1} << (rng.next() % 21);  // 1 B .. 1 MiB
        const std::size_t size = edge_size(rng);
        bool threw = false;
        void* block = nullptr;
        try {
            block = form.form(size, align);
        } catch (const std::bad_alloc&) {
            threw = true;
        }
        if (block == nullptr && threw == form.throws) {
            ++refused;
        } else {
            ++wrong;
            std::printf("WRONG: %s size %zu align %zu gave %p, threw %d\n", form.name, size, align, block, threw);
        }
    }
    const k15::memory::Stats after = k15::memory::stats();
    std::printf("refused %ld of %ld, wrong %ld\n", refused, requests, wrong);
    std::printf("counts unchanged: %s\n",
                after.live_blocks == before.live_blocks && after.live_bytes == before.live_bytes ? "yes" : "no");
    // Ordinary requests of every alignment and form still work, aligned as asked.
    long misaligned = 0;
    for (std::size_t align = 1; align <= (std::size_t{1} << 20); align <<= 1) {
        for (const NamedForm& form : kForms) {
            void* block = form.form(100, align);
            const std::size_t expected = form.takes_align ? align : alignof(std::max_align_t);
            if (block == nullptr || reinterpret_cast<std::uintptr_t>(block) % expected != 0) ++misaligned;
            std::memset(block, 1, 100);
            if (form.is_array) {
                ::operator delete[](block);
            } else {
                ::operator delete(block);
            }
        }
    }
    std::printf("ordinary blocks misaligned: %ld\n", misaligned);
    std::printf("last line\n");
    return 0;
}
