// Threads cancelled (deferred, the default) while the tracker works on them: each thread has a
// cancellation already pending when it makes a tracker call whose work calls cancellation
// points of libc (the lines of a memory error, a leak report's files, a timeline sample, a heap
// check), then tests for it. Under glibc, `free` and these calls are no cancellation points; the
// thread must end at its own pthread_testcancel, and the program go on.
//
//   cancelled_threads ROUNDS
#include <k15/memory.h>

#include <pthread.h>
#include <semaphore.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

sem_t ready, cancelled;

void* worker(void* which) {
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, nullptr);
    sem_post(&ready);
    sem_wait(&cancelled);  // the cancellation is pending from here
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, nullptr);
    switch (reinterpret_cast<std::uintptr_t>(which) % 4) {
        case 0: {
            char* block = static_cast<char*>(std::malloc(32));
            std::memset(block, 0, 32);
            char* volatile again = block;  // hidden from -Wuse-after-free
            std::free(block);
            std::free(again);  // DOUBLE FREE: reported on stderr
            break;
        }
        case 1: k15::memory::write_leak_report(); break;
        case 2: k15::memory::frame_mark(); break;
        case 3: k15::memory::check_heap(); break;
    }
    pthread_testcancel();
    return nullptr;  // never reached: the cancellation acts just above
}

}  // namespace

int main(int argc, char** argv) {
    const int rounds = argc > 1 ? std::atoi(argv[1]) : 40;
    sem_init(&ready, 0, 0);
    sem_init(&cancelled, 0, 0);
    int ended_cancelled = 0;
    for (int round = 0; round < rounds; round++) {
        pthread_t thread;
        pthread_create(&thread, nullptr, worker, reinterpret_cast<void*>(static_cast<std::uintptr_t>(round)));
        sem_wait(&ready);
        pthread_cancel(thread);
        sem_post(&cancelled);
        void* result = nullptr;
        pthread_join(thread, &result);
        ended_cancelled += result == PTHREAD_CANCELED;
    }
    void* leak = std::malloc(77);  // LEAK
    std::printf("%d of %d threads ended at their own cancellation point; survived %d\n", ended_cancelled, rounds,
                leak != nullptr);
    return 0;
}
