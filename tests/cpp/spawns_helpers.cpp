// A program that spawns short-lived helper processes from four threads (as an engine runs a
// shader compiler or `system`), each helper ending before it does, then leaks 50 blocks of 100
// bytes (`spawns_helpers leaks`) or none (`spawns_helpers clean`). Either way it makes 5,000
// allocations, more than any helper (`/bin/sh` running `ls`).
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <thread>
#include <vector>

#include "keep.h"

extern char** environ;

namespace {

void run_helpers(int count) {
    for (int i = 0; i < count; ++i) {
        char sh[] = "/bin/sh";
        char dash_c[] = "-c";
        char command[] = "ls / > /dev/null";
        char* argv[] = {sh, dash_c, command, nullptr};
        pid_t pid = 0;
        if (posix_spawn(&pid, "/bin/sh", nullptr, nullptr, argv, environ) == 0) {
            waitpid(pid, nullptr, 0);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    bool leaks = argc > 1 && std::strcmp(argv[1], "leaks") == 0;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back(run_helpers, 3);
    }
    for (int i = 0; i < 5000; ++i) {
        delete[] keep(new char[64]);
    }
    for (auto& t : threads) {
        t.join();
    }
    if (leaks) {
        for (int i = 0; i < 50; ++i) {
            keep(new char[100]);
        }
    }
    return 0;
}
