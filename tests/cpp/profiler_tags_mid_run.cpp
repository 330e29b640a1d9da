// Mid-run reports while threads churn tagged blocks: the report's tag table must count the
// blocks its leak list has (tests/profiler.rs compares them).
//
//   profiler_tags_mid_run REPORTS    4 threads keep 64 blocks each under Work or Work/Churn,
//                                    replacing one at a time; REPORTS reports are written
//                                    (mid-N.log, 5 ms apart) meanwhile. Frees everything at the end.
#include <k15/memory.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

std::atomic<bool> stop{false};

void churn(int id) {
    long n = 0;
    void* held[64] = {};
    bool from_malloc[64] = {};
    while (!stop.load(std::memory_order_relaxed)) {
        const int k = static_cast<int>((n * 7 + id) % 64);
        const size_t size = 1 + static_cast<size_t>((n * 13 + id) % 4000);
        if (held[k]) {
            if (from_malloc[k]) free(held[k]);
            else delete[] static_cast<char*>(held[k]);
        }
        from_malloc[k] = n & 1;
        if (n & 1) {
            K15_MEMORY_SCOPE("Work/Churn");
            held[k] = malloc(size);
        } else {
            K15_MEMORY_SCOPE("Work");
            held[k] = new char[size];
        }
        ++n;
    }
    for (int k = 0; k < 64; ++k) {
        if (!held[k]) continue;
        if (from_malloc[k]) free(held[k]);
        else delete[] static_cast<char*>(held[k]);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const int reports = argc > 1 ? std::atoi(argv[1]) : 3;
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) threads.emplace_back(churn, i);
    int failed = 0;
    for (int r = 0; r < reports; ++r) {
        usleep(5000);
        const std::string path = "mid-" + std::to_string(r) + ".log";
        if (!k15::memory::write_leak_report(path.c_str())) ++failed;
    }
    stop = true;
    for (auto& thread : threads) thread.join();
    std::printf("failed reports: %d\n", failed);
    return failed == 0 ? 0 : 1;
}
