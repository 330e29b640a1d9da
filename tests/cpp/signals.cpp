// A profiling-timer signal handler that allocates and frees while the program allocates and
// frees as fast as it can: the handler often interrupts the tracker itself, and neither may wait
// for the other.
#include <k15/memory.h>

#include <signal.h>
#include <sys/time.h>

#include <atomic>
#include <cstdio>
#include <vector>

namespace {

std::atomic<int> handled{0};
int* volatile sink;

void on_timer(int) {
    int* block = new int(handled.load());
    sink = block;
    delete block;
    handled.fetch_add(1);
}

}  // namespace

int main() {
    struct sigaction action {};
    action.sa_handler = on_timer;
    sigaction(SIGPROF, &action, nullptr);
    itimerval every{{0, 50}, {0, 50}};  // as often as the kernel allows
    setitimer(ITIMER_PROF, &every, nullptr);
    for (int round = 0; round < 3000 && handled.load() < 300; ++round) {
        std::vector<int*> blocks;
        for (int i = 0; i < 1000; ++i) blocks.push_back(new int(i));
        for (int* b : blocks) delete b;
    }
    itimerval off{};
    setitimer(ITIMER_PROF, &off, nullptr);
    std::printf("done, handled %d\n", handled.load() > 0 ? 1 : 0);
    return 0;
}
