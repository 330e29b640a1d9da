// Leaks through the paths a call stack must cross: a shared library without frame pointers, a
// std::thread, a std::function, and a callback called from inside the shared library.
#include <k15/memory.h>

#include <cstdio>
#include <functional>
#include <thread>

extern "C" void dso_make_widget(int id);
extern "C" void dso_call_back(void (*callback)(int), int id);

namespace {

struct Job {
    long payload[5];
};

Job* volatile sink;

[[gnu::noinline]] void leak_in_callback(int) {
    sink = K15_NEW Job{};  // CALLBACK LEAK
}

[[gnu::noinline]] void worker_body() {
    std::function<void()> task = [] {
        sink = K15_NEW Job{};  // FUNCTION LEAK
    };
    task();
}

}  // namespace

[[gnu::noinline]] void start_worker() {
    std::thread worker(worker_body);
    worker.join();
}

int main() {
    dso_make_widget(7);
    dso_call_back(leak_in_callback, 3);
    start_worker();
    std::puts("stack_paths: done");
    return 0;
}
