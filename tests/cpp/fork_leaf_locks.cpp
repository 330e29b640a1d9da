// Forks while other threads keep the tracker's smaller locks busy: one takes checkpoints and asks
// what leaked since, one marks frames, one interns new tag names. Each child does all three
// (an alarm ends a child that waits for a lock its parent's other threads held at the fork),
// allocates, and exits. Prints "healthy children: N".
#include <k15/engine.h>
#include <k15/memory.h>
#include <k15/memory_c.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

std::atomic<bool> stop{false};
constexpr int kForks = 200;

void checkpoints() {
    std::vector<int*> live;
    while (!stop.load()) {
        live.push_back(new int(1));  // a block per thread and checkpoint, so that each has some
        const k15::memory::Checkpoint since = k15::memory::checkpoint();
        static_cast<void>(k15::memory::leaks_since(since));
    }
    for (int* block : live) delete block;
}

void frames() {
    while (!stop.load()) k15::memory::frame_mark();
}

void tags() {
    char name[32];
    for (unsigned i = 0; !stop.load(); ++i) {
        std::snprintf(name, sizeof name, "Fork/Tag%u", i % 100000);
        static_cast<void>(k15_memory_tag(name));
    }
}

}  // namespace

int main() {
    const k15::memory::Checkpoint start = k15::memory::checkpoint();
    std::thread workers[] = {std::thread(checkpoints), std::thread(frames), std::thread(tags)};
    int healthy = 0;
    for (int i = 0; i < kForks; ++i) {
        const pid_t child = fork();
        if (child == 0) {
            alarm(5);
            static_cast<void>(k15::memory::leaks_since(start));
            k15::memory::frame_mark();
            static_cast<void>(k15_memory_tag("Fork/Child"));  // 0 once the table is full
            int* after_fork = new int(1);
            _exit(*after_fork == 1 ? 0 : 1);
        }
        int status = 0;
        waitpid(child, &status, 0);
        healthy += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    stop = true;
    for (std::thread& worker : workers) worker.join();
    std::printf("healthy children: %d\n", healthy);
    return 0;
}
