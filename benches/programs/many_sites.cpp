// Allocations from 70,000 call sites in 14,000 functions, in passes: a large program's
// allocation stacks meet tens of thousands of return addresses and FDEs, more than the stack
// capture's rule tables hold at first. Prints the nanoseconds per allocation of each pass.
//
//   many_sites <passes>
#include <k15/memory.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace {

constexpr int kFunctions = 14000;
constexpr int kSitesPerFunction = 5;

char* volatile kept;

__attribute__((noinline)) void allocate_one() {
    kept = new char[1];
    delete[] kept;
}

// Each instance is a function of its own, with an FDE of its own and five return addresses.
template <int N>
__attribute__((noinline)) void five_sites() {
    allocate_one();
    allocate_one();
    allocate_one();
    allocate_one();
    allocate_one();
}

template <std::size_t... I>
constexpr std::array<void (*)(), sizeof...(I)> all_functions(std::index_sequence<I...>) {
    return {&five_sites<int(I)>...};
}

}  // namespace

int main(int argc, char** argv) {
    constexpr auto functions = all_functions(std::make_index_sequence<kFunctions>());
    const int passes = argc > 1 ? std::atoi(argv[1]) : 2;
    for (int pass = 1; pass <= passes; ++pass) {
        const auto start = std::chrono::steady_clock::now();
        for (auto f : functions) f();
        const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
        std::printf("pass %d ns_per_allocation %.1f\n", pass, took.count() / (kFunctions * kSitesPerFunction));
    }
}
