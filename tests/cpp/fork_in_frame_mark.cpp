// A timer's signal handler that forks while the main thread marks frames or pushes scopes of new
// tag names: the signal lands inside `frame_mark()` (the frames' lock held, the timeline's too
// with `timeline=`) or inside the interning of a name (its lock held). The child _exits; the
// parent reaps it and arms the timer again, 0.3 ms ahead.
//
//   fork_in_frame_mark frames FORKS   the main thread marks frames until FORKS forks
//   fork_in_frame_mark tags FORKS     the main thread pushes scopes of new names (the tag table
//                                     filled first, so that every new name takes the lock)
//
// Prints "forks: N" (children that exited with status 0).
#include <k15/memory.h>

#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

volatile sig_atomic_t forks = 0;
volatile sig_atomic_t armed = 0;

void fork_in_handler(int) {
    const int saved_errno = errno;
    const pid_t child = fork();
    if (child == 0) _exit(0);
    int status = 0;
    if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
        WEXITSTATUS(status) == 0)
        forks = forks + 1;
    armed = 0;
    errno = saved_errno;
}

}  // namespace

int main(int argc, char** argv) {
    const bool tags = argc >= 3 && std::strcmp(argv[1], "tags") == 0;
    const bool frames = argc >= 3 && std::strcmp(argv[1], "frames") == 0;
    if (!tags && !frames) {
        std::fprintf(stderr, "usage: fork_in_frame_mark frames|tags FORKS\n");
        return 2;
    }
    const long wanted = std::atol(argv[2]);
    struct sigaction action;
    std::memset(&action, 0, sizeof action);
    action.sa_handler = fork_in_handler;
    action.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &action, nullptr);
    char name[32];
    if (tags) {
        for (int i = 0; i < 300; ++i) {
            std::snprintf(name, sizeof name, "Fill%d", i);
            k15_memory_scope_push(name);
            k15_memory_scope_pop();
        }
    }
    for (long n = 0; forks < wanted; ++n) {
        if (!armed) {
            armed = 1;
            const itimerval once{{0, 0}, {0, 300}};
            setitimer(ITIMER_REAL, &once, nullptr);
        }
        if (tags) {
            std::snprintf(name, sizeof name, "New%ld", n);
            k15_memory_scope_push(name);
            k15_memory_scope_pop();
        } else {
            k15::memory::frame_mark();
        }
    }
    const itimerval off{};
    setitimer(ITIMER_REAL, &off, nullptr);
    std::printf("forks: %ld\n", static_cast<long>(forks));
    return 0;
}
