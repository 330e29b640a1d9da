// Forks while another thread allocates and frees as fast as it can: every child must be able to
// allocate (no shard lock left held by a thread that does not exist in the child).
#include <k15/memory.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

namespace {
std::atomic<bool> stop{false};
std::atomic<int*> workers_block{nullptr};
void churn() {
    workers_block = new int[8];  // lives in the worker's shard
    while (!stop.load()) {
        std::vector<int*> blocks;
        for (int i = 0; i < 64; ++i) blocks.push_back(new int(i));
        for (int* b : blocks) delete b;
    }
}
}  // namespace

int main() {
    std::thread worker(churn);
    while (workers_block.load() == nullptr) std::this_thread::yield();
    int healthy = 0;
    for (int i = 0; i < 200; ++i) {
        pid_t child = fork();
        if (child == 0) {
            std::vector<int> in_child(1000, 1);
            delete[] workers_block.load();  // needs the worker's shard, whatever it held at fork
            _exit(in_child[999] == 1 ? 0 : 1);
        }
        int status = 0;
        waitpid(child, &status, 0);
        healthy += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    stop = true;
    worker.join();
    delete[] workers_block.load();
    std::printf("healthy children: %d\n", healthy);
    return 0;
}
