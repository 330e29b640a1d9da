// pthread_create, interposed (new_delete.cpp's start-up pulls this object into every link):
// each thread the program starts is in the report's record of threads from its first
// instruction, not only from its first allocation, so that a report written while a thread runs
// on a core without having allocated reads its stack (LeakSanitizer intercepts pthread_create
// for the same reason). What the program hands the new thread (a std::thread's state) waits in
// a static slot, which the leak scan reads as a global, until the thread holds it.
#include <errno.h>
#include <pthread.h>

#include <atomic>

#include "entry.h"

namespace {

using Start = void* (*)(void*);

struct Handoff {
    std::atomic<Start> start{nullptr};
    std::atomic<void*> argument{nullptr};
};

// Threads starting at once that get a slot; past them a thread starts as without this file
// (recorded at its first allocation).
Handoff handoffs[256];

// A cancellation requested meanwhile waits: an unwind out of the tracker's Rust frames would
// abort the process (none of them is a cancellation point today; this keeps it so).
struct CancellationHeld {
    int before = PTHREAD_CANCEL_ENABLE;
    CancellationHeld() { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &before); }
    ~CancellationHeld() { pthread_setcancelstate(before, nullptr); }
    CancellationHeld(const CancellationHeld&) = delete;
    CancellationHeld& operator=(const CancellationHeld&) = delete;
};

// In the record from here until the start routine returns or the thread exits inside it
// (pthread_exit and cancellation unwind through this frame).
struct InTheRecord {
    InTheRecord() {
        const CancellationHeld held;
        k15::memory::detail::thread_starts();
    }
    ~InTheRecord() {
        const CancellationHeld held;
        k15::memory::detail::thread_ends();
    }
    InTheRecord(const InTheRecord&) = delete;
    InTheRecord& operator=(const InTheRecord&) = delete;
};

// In a forked child the threads that were starting are gone: their slots serve again, and
// what was handed to them is no longer held.
void forget_handoffs() {
    for (Handoff& handoff : handoffs) {
        handoff.argument.store(nullptr, std::memory_order_relaxed);
        handoff.start.store(nullptr, std::memory_order_relaxed);
    }
}

}  // namespace

namespace k15 {
namespace memory {
namespace detail {

// The start routine of every thread pthread_create starts through a slot. Named in the
// tracker's namespace: the report leaves this frame out of the stacks it shows.
static void* start_in_the_record(void* slot) {
    auto* handoff = static_cast<Handoff*>(slot);
    const Start start = handoff->start.load(std::memory_order_relaxed);
    void* const argument = handoff->argument.load(std::memory_order_relaxed);
    const InTheRecord recorded;
    // The argument is on this (recorded) stack now: the slot may serve another thread.
    handoff->argument.store(nullptr, std::memory_order_relaxed);
    handoff->start.store(nullptr, std::memory_order_release);
    return start(argument);
}

}  // namespace detail
}  // namespace memory
}  // namespace k15

extern "C" void k15_memory_threads_start_up() noexcept {
    static_cast<void>(pthread_atfork(nullptr, nullptr, forget_handoffs));
}

// Weak: a program with a pthread_create of its own (an interposer of its own) links, and its
// definition is the process's; its threads are then recorded at their first allocation.
extern "C" [[gnu::weak]] int pthread_create(pthread_t* thread, const pthread_attr_t* attributes,
                                            Start start, void* argument) noexcept {
    using Create = int (*)(pthread_t*, const pthread_attr_t*, Start, void*);
    static const auto real = k15::memory::detail::next_definition<Create>("pthread_create");
    if (real == nullptr) return EAGAIN;
    for (Handoff& handoff : handoffs) {
        Start free = nullptr;
        if (handoff.start.load(std::memory_order_relaxed) != nullptr ||
            !handoff.start.compare_exchange_strong(free, start, std::memory_order_acquire)) {
            continue;
        }
        handoff.argument.store(argument, std::memory_order_relaxed);
        const int result =
            real(thread, attributes, k15::memory::detail::start_in_the_record, &handoff);
        if (result != 0) {
            handoff.argument.store(nullptr, std::memory_order_relaxed);
            handoff.start.store(nullptr, std::memory_order_release);
        }
        return result;
    }
    return real(thread, attributes, start, argument);
}
