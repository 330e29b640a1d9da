// Forks while threads allocate: each child allocates and frees a little and exits normally
// (exit handlers and the report included). Prints the median and the slowest fork-to-reaped
// time of a child, and how many children exited cleanly. With REPORT, one more child leaks a
// block of its own and writes its report there.
//
//   fork_exit CHILDREN THREADS [REPORT]
#include <k15/memory.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

std::atomic<bool> stop{false};

// What a child does: allocate, use, free.
bool child_work() {
    std::vector<int> in_child(100, 1);
    int* freed = new int(2);
    const bool ok = in_child[99] == 1 && *freed == 2;
    delete freed;
    return ok;
}

void churn() {
    std::vector<int*> blocks;
    while (!stop.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 64; ++i) blocks.push_back(new int(i));
        for (int* b : blocks) delete b;
        blocks.clear();
    }
}

}  // namespace

int main(int argc, char** argv) {
    const int children = argc > 1 ? std::atoi(argv[1]) : 50;
    const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
    // The parent's leaks: 1000 blocks from one site, inherited by every child.
    std::vector<int*> parents_leaks;
    for (int i = 0; i < 1000; ++i) parents_leaks.push_back(new int(i));
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) workers.emplace_back(churn);
    std::vector<double> ms;
    int clean = 0;
    for (int i = 0; i < children; ++i) {
        const auto start = std::chrono::steady_clock::now();
        const pid_t child = fork();
        if (child == 0) std::exit(child_work() ? 0 : 1);
        int status = 0;
        waitpid(child, &status, 0);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
        clean += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    if (argc > 3 && fork() == 0) {
        int* own_leak = K15_NEW int[7];  // K15_CHILD_LEAK
        own_leak[0] = 1;
        _exit(k15::memory::write_leak_report(argv[3]) ? 0 : 1);
    }
    wait(nullptr);
    stop = true;
    for (auto& w : workers) w.join();
    std::sort(ms.begin(), ms.end());
    std::printf("clean children: %d\nmedian ms: %.2f\nslowest ms: %.2f\n", clean, ms[ms.size() / 2], ms.back());
    return 0;
}
