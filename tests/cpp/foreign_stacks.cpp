// Allocations on stacks the thread does not own: a fiber's (swapcontext, the way a job system
// runs its jobs), a signal handler's alternate stack, and a stack of garbage reached by a bare
// stack switch. Each fiber stack is mapped by the program between two PROT_NONE pages, so that
// a walk reading past either end would crash the program.
//
//   foreign_stacks fiber            leaks 100 bytes from a job on a fiber
//   foreign_stacks signal           leaks 77 bytes from a handler on the alternate stack, 66 from
//                                   one on the thread's own stack, and 88 from a handler whose
//                                   alternate stack lies above the stack of the thread it
//                                   interrupted
//   foreign_stacks garbage          leaks 55 bytes from a function run on a stack of garbage:
//                                   words that look like return addresses and frame pointers
//   foreign_stacks churn THREADS N  every thread maps N fibers one after the other (sizes vary,
//                                   each unmapped when done), each running new/delete; every
//                                   fiber leaks one 33-byte block
//   foreign_stacks report PATH      a job holds a 44-byte block in a local only and writes the
//                                   leak report to PATH from its fiber
//   foreign_stacks named MODE ...   MODE fiber, report or churn, each fiber's stack named to the
//                                   tracker (k15::memory::running_on_stack) as a job system would
//   foreign_stacks hidden ...       the stacks mapped with the system call, as a library whose
//                                   mmap calls the tracker does not see maps them (not recorded
//                                   as the program's mappings, which the leak scan reads)
#include <k15/memory.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "keep.h"

namespace {

const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));

// `usable` bytes of stack between two PROT_NONE pages; its lowest usable address.
bool hide_stacks = false;

char* map_guarded(std::size_t usable) {
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS;
    void* mapped = hide_stacks
                       ? reinterpret_cast<void*>(syscall(SYS_mmap, nullptr, usable + 2 * page,
                                                         PROT_NONE, flags, -1, 0))
                       : mmap(nullptr, usable + 2 * page, PROT_NONE, flags, -1, 0);
    char* all = static_cast<char*>(mapped);
    if (all == MAP_FAILED) std::abort();
    if (mprotect(all + page, usable, PROT_READ | PROT_WRITE) != 0) std::abort();
    return all + page;
}

void unmap_guarded(char* usable_start, std::size_t usable) {
    munmap(usable_start - page, usable + 2 * page);
}

// --- fiber -------------------------------------------------------------------------------

thread_local ucontext_t scheduler;
thread_local ucontext_t job_context;
bool name_stacks = false;
thread_local char* job_stack;
thread_local std::size_t job_stack_size;

// The first thing a job does on its fiber (and a job system after every switch).
void entered_job() {
    if (name_stacks) k15::memory::running_on_stack(job_stack, job_stack_size);
}

__attribute__((noinline)) void leak_in_job() {
    keep(new char[100]);  // LEAK on a fiber
}

__attribute__((noinline)) void job_body() {
    entered_job();
    leak_in_job();
    asm volatile("");
}

void fiber_entry() {
    job_body();
    asm volatile("");
}

// Runs `entry` on a fresh guarded fiber stack of `usable` bytes until it returns.
void run_fiber(void (*entry)(), std::size_t usable) {
    char* stack = map_guarded(usable);
    job_stack = stack;
    job_stack_size = usable;
    getcontext(&job_context);
    job_context.uc_stack.ss_sp = stack;
    job_context.uc_stack.ss_size = usable;
    job_context.uc_link = &scheduler;
    makecontext(&job_context, entry, 0);
    swapcontext(&scheduler, &job_context);
    if (name_stacks) k15::memory::running_on_stack(nullptr, 0);
    unmap_guarded(stack, usable);
}

const char* report_path;

__attribute__((noinline)) void report_from_job() {
    entered_job();
    char* volatile held = new char[44];  // only this local points to it
    held[0] = 1;
    k15::memory::write_leak_report(report_path);
    delete[] held;
}

// --- signal --------------------------------------------------------------------------------

__attribute__((noinline)) void leak_in_handler(std::size_t size) {
    keep(new char[size]);  // LEAK in a handler
}

extern "C" void on_alternate_stack(int) { leak_in_handler(77); }
extern "C" void on_own_stack(int) { leak_in_handler(66); }
extern "C" void on_stack_above(int) { leak_in_handler(88); }

__attribute__((noinline)) void raise_on_alternate_stack() {
    raise(SIGUSR1);
    asm volatile("");
}

__attribute__((noinline)) void raise_on_own_stack() {
    raise(SIGUSR2);
    asm volatile("");
}

__attribute__((noinline)) void raise_below_the_alternate_stack() {
    raise(SIGPROF);
    asm volatile("");
}

// One mapping: a thread's stack in its lower part, that thread's alternate signal stack at its
// top, so that the handler's frames lie above the frames the signal interrupted.
void* thread_below_its_alternate_stack(void* alternate) {
    stack_t above{};
    above.ss_sp = alternate;
    above.ss_size = 64 * 1024;
    if (sigaltstack(&above, nullptr) != 0) std::abort();
    struct sigaction action {};
    action.sa_handler = on_stack_above;
    action.sa_flags = SA_ONSTACK;
    sigaction(SIGPROF, &action, nullptr);
    raise_below_the_alternate_stack();
    return nullptr;
}

void run_signal_above_the_thread() {
    const std::size_t thread_stack = 1 << 20;
    char* both = map_guarded(thread_stack + 64 * 1024);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstack(&attr, both, thread_stack);
    pthread_t thread;
    if (pthread_create(&thread, &attr, thread_below_its_alternate_stack, both + thread_stack) != 0)
        std::abort();
    pthread_join(thread, nullptr);
    pthread_attr_destroy(&attr);
}

void run_signals() {
    stack_t alternate{};
    alternate.ss_size = 64 * 1024;
    alternate.ss_sp = map_guarded(alternate.ss_size);
    if (sigaltstack(&alternate, nullptr) != 0) std::abort();
    struct sigaction action {};
    action.sa_handler = on_alternate_stack;
    action.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &action, nullptr);
    action.sa_handler = on_own_stack;
    action.sa_flags = 0;
    sigaction(SIGUSR2, &action, nullptr);
    raise_on_alternate_stack();
    raise_on_own_stack();
    run_signal_above_the_thread();
}

// --- garbage -------------------------------------------------------------------------------

// Calls `function` with rsp at `top` and rbp at `frame`, then comes back. No CFI: a walk that
// gets here has only the garbage rbp to go on.
extern "C" void call_on_stack(char* top, void (*function)(), char* frame);
asm(R"(
    .text
    .p2align 4
    .type call_on_stack, @function
call_on_stack:
    push %rbp
    push %rbx
    mov %rsp, %rbx
    mov %rdi, %rsp
    mov %rdx, %rbp
    call *%rsi
    mov %rbx, %rsp
    pop %rbx
    pop %rbp
    ret
    .size call_on_stack, .-call_on_stack
)");

__attribute__((noinline)) void leak_on_garbage() {
    keep(new char[55]);  // LEAK on garbage
}

void run_on_garbage() {
    const std::size_t usable = 64 * 1024;
    char* stack = map_guarded(usable);
    char* end = stack + usable;
    char* top = stack + usable / 2;
    // Above the top (where a walk goes once past the function): code addresses, addresses of
    // the guard pages and of the garbage itself, as return addresses and saved rbps would be.
    const std::uintptr_t lures[] = {
        reinterpret_cast<std::uintptr_t>(&run_on_garbage) + 7,
        reinterpret_cast<std::uintptr_t>(&leak_in_job) + 3,
        reinterpret_cast<std::uintptr_t>(&std::printf) + 9,
        reinterpret_cast<std::uintptr_t>(end) + 8,
        reinterpret_cast<std::uintptr_t>(stack) - 64,
        reinterpret_cast<std::uintptr_t>(end) - 16,
        reinterpret_cast<std::uintptr_t>(top) + 512,
    };
    std::uintptr_t* word = reinterpret_cast<std::uintptr_t*>(top);
    for (std::size_t i = 0; word + i < reinterpret_cast<std::uintptr_t*>(end); ++i) {
        word[i] = lures[(i * 5 + i / 7) % (sizeof lures / sizeof lures[0])];
    }
    call_on_stack(top, leak_on_garbage, end - 8);
    call_on_stack(top, leak_on_garbage, stack - 32);
    unmap_guarded(stack, usable);
}

// --- churn ---------------------------------------------------------------------------------

thread_local unsigned long churn_seed;

__attribute__((noinline)) void churn_job() {
    entered_job();
    for (int i = 0; i < 200; ++i) {
        churn_seed = churn_seed * 6364136223846793005UL + 1442695040888963407UL;
        char* block = new char[1 + (churn_seed >> 40) % 300];
        block[0] = 1;
        delete[] block;
    }
    keep(new char[33]);  // LEAK once per fiber
}

void churn_entry() { churn_job(); }

void run_churn(int threads, int fibers) {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
        workers.emplace_back([t, fibers] {
            churn_seed = 12345u + t;
            for (int f = 0; f < fibers; ++f) {
                run_fiber(churn_entry, (4 + (churn_seed >> 33) % 60) * page);
            }
        });
    }
    for (auto& w : workers) w.join();
}

}  // namespace

int main(int argc, char** argv) {
    for (bool* flag : {&hide_stacks, &name_stacks}) {
        if (argc > 1 && std::strcmp(argv[1], flag == &name_stacks ? "named" : "hidden") == 0) {
            *flag = true;
            ++argv;
            --argc;
        }
    }
    const char* mode = argc > 1 ? argv[1] : "";
    if (std::strcmp(mode, "fiber") == 0) {
        run_fiber(fiber_entry, 64 * 1024);
    } else if (std::strcmp(mode, "signal") == 0) {
        run_signals();
    } else if (std::strcmp(mode, "garbage") == 0) {
        run_on_garbage();
    } else if (std::strcmp(mode, "report") == 0 && argc > 2) {
        report_path = argv[2];
        run_fiber(report_from_job, 64 * 1024);
    } else if (std::strcmp(mode, "churn") == 0 && argc > 3) {
        run_churn(std::atoi(argv[2]), std::atoi(argv[3]));
    } else {
        std::fprintf(stderr, "usage: foreign_stacks [hidden] [named] fiber|signal|garbage|report PATH|churn THREADS N\n");
        return 2;
    }
    std::puts("done");
    return 0;
}
