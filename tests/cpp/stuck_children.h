// Forks `children` children that each run `in_child` and exit(0), one at a time: how many did
// not exit 0 by themselves (a child stuck for 10 s, waiting for a lock no thread of it will let
// go, dies of SIGALRM).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

template <class InChild>
int stuck_children(int children, InChild in_child) {
    int stuck = 0;
    for (int c = 0; c < children; ++c) {
        const pid_t pid = fork();
        if (pid == 0) {
            alarm(10);
            in_child(c);
            std::exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++stuck;
    }
    return stuck;
}
