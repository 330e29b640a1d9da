// Everything here is freed, much of it late (static destructors, a shared library's statics):
// the report must list no leak at all. Checks alignment of every over-aligned form as it goes.
#include <k15/memory.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

extern "C" int static_dso_size();

namespace {

int failures = 0;

void check(bool ok, const char* what) {
    if (!ok) {
        std::printf("FAILED: %s\n", what);
        ++failures;
    }
}

template <typename T>
void check_aligned(const T* p, std::size_t alignment, const char* what) {
    check(reinterpret_cast<std::uintptr_t>(p) % alignment == 0, what);
}

struct alignas(64) CacheLine {
    char bytes[64];
};
struct alignas(256) Page256 {
    char bytes[300];
};
struct alignas(4096) Page {
    char bytes[4096];
};

struct Throws {
    Throws() { throw std::runtime_error("constructor failed"); }
};
struct alignas(128) AlignedThrows {
    AlignedThrows() { throw std::runtime_error("aligned constructor failed"); }
};

// Statics of the executable: constructed before main, destroyed after it.
std::vector<std::string> static_names = {"first static string that is long", "second static string that is long"};
std::map<std::string, std::vector<int>> static_table;

std::string& function_static() {
    static std::string value(100, 'f');
    return value;
}

struct LateFree {
    int* block = new int[32];
    ~LateFree() { delete[] block; }
} late_free;

void* volatile sink;

}  // namespace

int main() {
    // Containers churn.
    for (int round = 0; round < 50; ++round) {
        std::vector<std::string> words;
        for (int i = 0; i < 100; ++i) words.push_back(std::string(40, char('a' + i % 26)));
        std::map<int, std::string> by_id;
        std::unordered_map<std::string, std::shared_ptr<std::vector<int>>> shared;
        for (int i = 0; i < 50; ++i) {
            by_id[i] = words[i];
            shared[words[i] + std::to_string(i)] = std::make_shared<std::vector<int>>(i, i);
        }
        std::function<int(int)> f = [big = std::vector<int>(100, round)](int x) { return x + big[0]; };
        sink = &f;
        static_table[std::to_string(round)].push_back(f(round));
    }

    // K15_NEW and plain new, every over-aligned form, checked.
    auto* line = K15_NEW CacheLine;
    check_aligned(line, 64, "K15_NEW alignas(64)");
    auto* lines = K15_NEW CacheLine[7];
    check_aligned(lines, 64, "K15_NEW alignas(64)[]");
    auto* page256 = new Page256[3];
    check_aligned(page256, 256, "new alignas(256)[]");
    auto* page = K15_NEW Page;
    check_aligned(page, 4096, "K15_NEW alignas(4096)");
    delete line;
    delete[] lines;
    delete[] page256;
    delete page;

    // nothrow, sized and aligned library forms, called directly.
    void* a = ::operator new(24, std::nothrow);
    void* b = ::operator new[](48, std::nothrow);
    void* c = ::operator new(40, std::align_val_t{32});
    void* d = ::operator new[](40, std::align_val_t{512}, std::nothrow);
    void* e = ::operator new(100, std::align_val_t{1024}, std::nothrow);
    check(a && b && c && d && e, "nothrow forms return memory");
    check_aligned(static_cast<char*>(c), 32, "align_val_t 32");
    check_aligned(static_cast<char*>(d), 512, "align_val_t 512");
    check_aligned(static_cast<char*>(e), 1024, "align_val_t 1024");
    ::operator delete(a, std::size_t{24});
    ::operator delete[](b, std::nothrow);
    ::operator delete(c, std::size_t{40}, std::align_val_t{32});
    ::operator delete[](d, std::align_val_t{512}, std::nothrow);
    ::operator delete(e, std::align_val_t{1024}, std::nothrow);

    // Large blocks (mapped by the tracker) and zero-sized ones.
    char* big = new char[1 << 20];
    big[0] = big[(1 << 20) - 1] = 1;
    char* medium = K15_NEW char[200 * 1024];
    char* empty = new char[0];
    char* empty2 = new char[0];
    check(empty != empty2, "new char[0] gives distinct pointers");
    delete[] big;
    delete[] medium;
    delete[] empty;
    delete[] empty2;

    // A throwing constructor under K15_NEW: the matching placement delete frees the block.
    for (int i = 0; i < 3; ++i) {
        try {
            sink = K15_NEW Throws;
        } catch (const std::runtime_error&) {
        }
        try {
            sink = K15_NEW AlignedThrows;
        } catch (const std::runtime_error&) {
        }
        try {
            sink = K15_NEW Throws[2];
        } catch (const std::runtime_error&) {
        }
    }

    // Exhaustion: nothrow gives null, throwing forms throw bad_alloc.
    check(::operator new(std::size_t(1) << 62, std::nothrow) == nullptr, "nothrow exhaustion returns null");
    bool threw = false;
    try {
        sink = ::operator new[](std::size_t(1) << 62);
    } catch (const std::bad_alloc&) {
        threw = true;
    }
    check(threw, "exhaustion throws bad_alloc");

    check(function_static().size() == 100, "function static");
    check(static_dso_size() == 40, "shared library statics");
    check(static_names.size() == 2, "executable statics");
    std::printf("checks done: %d failures\n", failures);
    return failures == 0 ? 0 : 1;
}
