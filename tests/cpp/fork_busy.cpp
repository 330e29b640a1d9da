// Forks while another thread keeps the tracker's slower locks busy (the engine registry walked,
// memory errors reported): each child takes all of those locks, and exits.
#include <k15/engine.h>
#include <k15/memory.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

namespace {
std::atomic<bool> stop{false};
std::atomic<bool> ready{false};
int not_from_new;

void busy() {
    // Many live blocks make every walk of the registry (leaks_since) hold its lock a while.
    const k15::memory::ClassSpec classes[] = {{64, 100000}};
    k15::memory::PoolAllocator pool("fork pool", classes, 1);
    for (int i = 0; i < 100000; ++i) pool.allocate(32);
    ready = true;
    for (int i = 0; !stop.load(); ++i) {
        static_cast<void>(k15::memory::leaks_since(k15::memory::Checkpoint{0}));
        if (i % 10 == 0) delete &not_from_new;  // a memory error, reported
    }
}
}  // namespace

int main() {
    std::thread worker(busy);
    while (!ready.load()) std::this_thread::yield();
    int healthy = 0;
    for (int i = 0; i < 100; ++i) {
        pid_t child = fork();
        if (child == 0) {
            // What a report takes: the registry, the error log and its symbolizer, the shards.
            const bool listed = k15::memory::leaks_since(k15::memory::Checkpoint{0}).blocks == 100000;
            delete &not_from_new;
            int* after_fork = new int(1);
            _exit(listed && *after_fork == 1 ? 0 : 1);
        }
        int status = 0;
        waitpid(child, &status, 0);
        healthy += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    stop = true;
    worker.join();
    std::printf("healthy children: %d\n", healthy);
    return 0;
}
