// Engine allocator locks that are never let go, against the report at exit:
//   engine_locks fork CHILDREN   a worker allocates and frees from a block allocator and a typed
//                                pool without pause while main forks children, each of which
//                                uses both allocators once and exits; prints how many children
//                                did not exit 0 by themselves (a child waiting on a lock the
//                                worker held at the fork dies of SIGALRM)
//   engine_locks exit DELAY_US   main does the same itself and exit(3)s from SIGALRM after
//                                DELAY_US, maybe inside an allocator's lock
//   engine_locks names CHILDREN  a worker creates allocators under names never seen before
//                                (each copied once into the table of names) without pause while
//                                main forks children, each of which creates one too; prints
//                                the stuck children as `fork` does
// Both keep one 100-byte block of the block allocator live: the engine leak every report lists
// unless that allocator's lock was held.
#include <k15/engine.h>
#include <k15/memory.h>


#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "exit_timer.h"
#include "stuck_children.h"

namespace {
struct Particle {
    double x, y, z;
};

std::atomic<bool> stop{false};

// One round of what keeps both allocators' locks busy.
void churn(k15::memory::BlockAllocator& arena, k15::memory::TypedPool<Particle>& particles, unsigned i) {
    void* block = arena.allocate(16 + i % 512);
    Particle* p = particles.create();
    particles.destroy(p);
    arena.deallocate(block);
}

int run_fork(int children) {
    k15::memory::BlockAllocator arena("locks arena", 1 << 20);
    k15::memory::TypedPool<Particle> particles("locks particles", 4);
    arena.allocate(100);
    std::thread worker([&] {
        for (unsigned i = 0; !stop.load(std::memory_order_relaxed); ++i) churn(arena, particles, i);
    });
    const int stuck = stuck_children(
        children, [&](int c) { churn(arena, particles, static_cast<unsigned>(c)); });
    stop = true;
    worker.join();
    std::printf("stuck children: %d\n", stuck);
    return 0;
}

// A block allocator under a name of its own, used once.
void named_arena(const char* prefix, unsigned i) {
    char name[64];
    std::snprintf(name, sizeof name, "%s %u", prefix, i);
    k15::memory::BlockAllocator arena(name, 4096);
    arena.deallocate(arena.allocate(16));
}

int run_names(int children) {
    k15::memory::BlockAllocator arena("locks arena", 1 << 20);
    arena.allocate(100);
    std::thread worker([&] {
        for (unsigned i = 0; !stop.load(std::memory_order_relaxed); ++i) named_arena("worker", i);
    });
    const int stuck = stuck_children(children, [&](int c) { named_arena("child", static_cast<unsigned>(c)); });
    stop = true;
    worker.join();
    std::printf("stuck children: %d\n", stuck);
    return 0;
}

int run_exit(long delay_us) {
    k15::memory::BlockAllocator arena("locks arena", 1 << 20);
    k15::memory::TypedPool<Particle> particles("locks particles", 4);
    arena.allocate(100);
    exit_after(delay_us);
    for (unsigned i = 0;; ++i) churn(arena, particles, i);
}
}  // namespace

int main(int argc, char** argv) {
    if (argc >= 3 && std::strcmp(argv[1], "fork") == 0) return run_fork(std::atoi(argv[2]));
    if (argc >= 3 && std::strcmp(argv[1], "exit") == 0) return run_exit(std::atol(argv[2]));
    if (argc >= 3 && std::strcmp(argv[1], "names") == 0) return run_names(std::atoi(argv[2]));
    std::fprintf(stderr, "usage: engine_locks fork CHILDREN | exit DELAY_US | names CHILDREN\n");
    return 2;
}
