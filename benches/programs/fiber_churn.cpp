// new/delete pairs under 11 frames on the thread's own stack, then the same on a fiber
// (swapcontext, its stack mapped by the program) without and with telling the tracker which
// stack the thread runs on (k15::memory::running_on_stack). Prints nanoseconds per pair of each.
//
//   fiber_churn PAIRS
#include <k15/memory.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

long pairs;
double ns_per_pair;
ucontext_t scheduler;
ucontext_t job;
char* fiber_stack;
constexpr std::size_t fiber_stack_size = 1 << 20;
bool name_the_stack;

__attribute__((noinline)) void churn() {
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < pairs; ++i) {
        char* volatile block = new char[32];
        delete[] block;
    }
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    ns_per_pair = took.count() / static_cast<double>(pairs);
}

__attribute__((noinline)) void deeper(int levels) {
    if (levels == 0) {
        churn();
    } else {
        deeper(levels - 1);
    }
    asm volatile("");
}

void fiber_entry() {
    if (name_the_stack) k15::memory::running_on_stack(fiber_stack, fiber_stack_size);
    deeper(10);
}

double on_a_fiber(bool named) {
    name_the_stack = named;
    getcontext(&job);
    job.uc_stack.ss_sp = fiber_stack;
    job.uc_stack.ss_size = fiber_stack_size;
    job.uc_link = &scheduler;
    makecontext(&job, fiber_entry, 0);
    swapcontext(&scheduler, &job);
    k15::memory::running_on_stack(nullptr, 0);
    return ns_per_pair;
}

}  // namespace

int main(int argc, char** argv) {
    pairs = argc > 1 ? std::atol(argv[1]) : 1000000;
    void* mapped = mmap(nullptr, fiber_stack_size, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) return 1;
    fiber_stack = static_cast<char*>(mapped);
    deeper(10);
    std::printf("own stack: %.1f\n", ns_per_pair);
    std::printf("fiber: %.1f\n", on_a_fiber(false));
    std::printf("named fiber: %.1f\n", on_a_fiber(true));
    return 0;
}
