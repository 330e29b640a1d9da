// Leak-ignore scopes entered without pause, against the report at exit and in forked children.
// Every mode keeps one 100-byte block in a global and drops it (the one leak every report lists)
// and keeps blocks allocated inside `ScopedLeakIgnore` scopes live (never listed):
//   ignore_scopes exit DELAY_US   main enters scopes in a loop and exit(3)s from SIGALRM after
//                                 DELAY_US, maybe inside the tracker's record of a scope
//   ignore_scopes fork CHILDREN   a worker does the same while main forks children, each of
//                                 which leaks 100 bytes of its own and allocates one block
//                                 inside a scope; prints how many children did not exit 0 by
//                                 themselves
//   ignore_scopes count SCOPES    main enters SCOPES scopes one after another, each allocating
//                                 a block; prints the resident KiB they cost
#include <k15/memory.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "exit_timer.h"
#include "resident.h"
#include "stuck_children.h"

namespace {
// Blocks allocated inside scopes, each freed when its slot is reused.
char* volatile kept[64];
char* volatile lost;
std::atomic<bool> stop{false};

void leak_100_bytes() {
    lost = new char[100];
    lost = nullptr;
}

void scoped_allocation(unsigned i) {
    k15::memory::ScopedLeakIgnore scope;
    char*& slot = const_cast<char*&>(kept[i % 64]);
    delete[] slot;
    slot = new char[24];
}

int run_exit(long delay_us) {
    leak_100_bytes();
    exit_after(delay_us);
    for (unsigned i = 0;; ++i) scoped_allocation(i);
}

int run_fork(int children) {
    leak_100_bytes();
    std::thread worker([] {
        for (unsigned i = 0; !stop.load(std::memory_order_relaxed); ++i) scoped_allocation(i);
    });
    const int stuck = stuck_children(children, [](int c) {
        leak_100_bytes();
        k15::memory::ScopedLeakIgnore scope;
        kept[c % 64] = new char[50];
    });
    stop = true;
    worker.join();
    std::printf("stuck children: %d\n", stuck);
    return 0;
}

int run_count(long scopes) {
    leak_100_bytes();
    const long before = resident_kib();
    for (long i = 0; i < scopes; ++i) scoped_allocation(static_cast<unsigned>(i));
    std::printf("scopes_kib %ld\n", resident_kib() - before);
    return 0;
}
}  // namespace

int main(int argc, char** argv) {
    if (argc >= 3 && std::strcmp(argv[1], "exit") == 0) return run_exit(std::atol(argv[2]));
    if (argc >= 3 && std::strcmp(argv[1], "fork") == 0) return run_fork(std::atoi(argv[2]));
    if (argc >= 3 && std::strcmp(argv[1], "count") == 0) return run_count(std::atol(argv[2]));
    std::fprintf(stderr, "usage: ignore_scopes exit DELAY_US | fork CHILDREN | count SCOPES\n");
    return 2;
}
