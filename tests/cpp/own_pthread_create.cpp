// A program with its own pthread_create (an interposer of its own, as a profiler's), linked with
// the static library: it links, its definition serves the process (the library's is weak), and
// its threads are tracked from their first allocation.
#include "keep.h"
#include <dlfcn.h>
#include <k15/memory.h>
#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <thread>

namespace {
std::atomic<int> created{0};
}

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attributes,
                              void* (*start)(void*), void* argument) noexcept {
    using Create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
    static const auto real = reinterpret_cast<Create>(dlsym(RTLD_NEXT, "pthread_create"));
    ++created;
    return real(thread, attributes, start, argument);
}

int main() {
    for (int i = 0; i < 3; ++i) {
        std::thread([] { keep(new char[5001]); }).join();  // LEAK, three times
    }
    std::printf("created by the program's own pthread_create: %d\n", created.load());
    return 0;
}
