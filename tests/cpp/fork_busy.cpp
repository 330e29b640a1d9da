// Forks while another thread keeps the tracker's slower locks busy (engine allocators created
// and destroyed, memory errors reported): each child writes a full report, which takes all of
// them, and exits.
#include <k15/engine.h>
#include <k15/memory.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

namespace {
std::atomic<bool> stop{false};
int not_from_new;

void busy() {
    const k15::memory::ClassSpec classes[] = {{64, 64}};
    for (int i = 0; !stop.load(); ++i) {
        k15::memory::PoolAllocator pool("fork pool", classes, 1);
        void* block = pool.allocate(32);
        pool.deallocate(block);
        if (i % 100 == 0) delete &not_from_new;  // a memory error, reported
    }
}
}  // namespace

int main() {
    std::thread worker(busy);
    int healthy = 0;
    for (int i = 0; i < 100; ++i) {
        pid_t child = fork();
        if (child == 0) _exit(k15::memory::write_leak_report("/dev/null") ? 0 : 1);
        int status = 0;
        waitpid(child, &status, 0);
        healthy += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    stop = true;
    worker.join();
    std::printf("healthy children: %d\n", healthy);
    return 0;
}
