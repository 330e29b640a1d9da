// A thread forks without pause (each child allocates, frees and _exits; the thread reaps it)
// while main returns after DELAY_US: the program's exit runs while a fork is under way.
//
//   fork_at_exit DELAY_US
#include <k15/memory.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

int main(int argc, char** argv) {
    const int delay_us = argc > 1 ? std::atoi(argv[1]) : 0;
    std::thread([] {
        for (;;) {
            const pid_t child = fork();
            if (child == 0) {
                delete new int(1);
                _exit(0);
            }
            if (child > 0) waitpid(child, nullptr, 0);
        }
    }).detach();
    if (delay_us > 0) usleep(static_cast<useconds_t>(delay_us));
    return 0;
}
