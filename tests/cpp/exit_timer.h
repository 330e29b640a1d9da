// exit(3) from a SIGALRM handler after a delay: the tests' way of exiting from a signal handler
// that strikes wherever the program happens to be (inside new/delete, inside an allocator).
#pragma once

#include <signal.h>
#include <sys/time.h>

#include <cstdlib>
#include <cstring>

inline void exit_from_handler(int) { std::exit(3); }

inline void exit_after(long delay_us) {
    struct sigaction action;
    std::memset(&action, 0, sizeof action);
    action.sa_handler = exit_from_handler;
    sigaction(SIGALRM, &action, nullptr);
    itimerval timer{};
    timer.it_value.tv_sec = delay_us / 1000000;
    timer.it_value.tv_usec = delay_us % 1000000;
    setitimer(ITIMER_REAL, &timer, nullptr);
}
