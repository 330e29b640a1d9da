// Jobs on Boost.Context fibers (Debian's libboost-context-dev), the fiber library engines and
// Boost.Fiber/Asio coroutines build on: its make_fcontext switches stacks in hand-written
// assembly, and protected_fixedsize_stack maps each fiber's stack with a guard page and unmaps
// it when the fiber ends. Nothing here tells the tracker about the fibers.
//
//   boost_fibers one            leaks 91 bytes from a job on a fiber
//   boost_fibers churn THREADS N  every thread runs N fibers one after another (stack sizes
//                               vary), each doing new/delete and leaking one 29-byte block
#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "keep.h"

namespace ctx = boost::context;

namespace {

__attribute__((noinline)) void leak_in_boost_job() {
    keep(new char[91]);  // LEAK on a boost fiber
}

__attribute__((noinline)) void boost_job_body() {
    leak_in_boost_job();
    asm volatile("");
}

void run_one() {
    ctx::fiber job{std::allocator_arg, ctx::protected_fixedsize_stack(64 * 1024),
                   [](ctx::fiber&& scheduler) {
                       boost_job_body();
                       return std::move(scheduler);
                   }};
    job = std::move(job).resume();
}

__attribute__((noinline)) void churn_job(unsigned long& seed) {
    for (int i = 0; i < 200; ++i) {
        seed = seed * 6364136223846793005UL + 1442695040888963407UL;
        char* block = new char[1 + (seed >> 40) % 300];
        block[0] = 1;
        delete[] block;
    }
    keep(new char[29]);  // LEAK once per boost fiber
}

void run_churn(int threads, int fibers) {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
        workers.emplace_back([t, fibers] {
            unsigned long seed = 777u + t;
            for (int f = 0; f < fibers; ++f) {
                const std::size_t size = (16 + (seed >> 33) % 240) * 1024;
                ctx::fiber job{std::allocator_arg, ctx::protected_fixedsize_stack(size),
                               [&seed](ctx::fiber&& scheduler) {
                                   churn_job(seed);
                                   return std::move(scheduler);
                               }};
                job = std::move(job).resume();
            }
        });
    }
    for (auto& w : workers) w.join();
}

}  // namespace

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "";
    if (std::strcmp(mode, "one") == 0) {
        run_one();
    } else if (std::strcmp(mode, "churn") == 0 && argc > 3) {
        run_churn(std::atoi(argv[2]), std::atoi(argv[3]));
    } else {
        std::fprintf(stderr, "usage: boost_fibers one|churn THREADS N\n");
        return 2;
    }
    std::puts("done");
    return 0;
}
