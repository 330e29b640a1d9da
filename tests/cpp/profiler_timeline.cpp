// A game loop under tag scopes for timeline= (tests/timeline.rs parses the file and checks it
// against what this program did), ended in the ways a game ends:
//   profiler_timeline frames N     marks N frames; frame i keeps 1000 more bytes under Level
//                                  and frees a 64-byte Particles block; returns from main with
//                                  everything still live (nothing closed)
//   profiler_timeline timer MS     marks no frame: allocates for MS ms (the tracker's timer samples)
//   profiler_timeline signal SIG N marks N frames, then raises SIG (TERM or INT), whose handler
//                                  calls exit(0)
//   profiler_timeline fork         marks 3 frames, forks; the child marks 2 and _exits, the
//                                  parent waits and marks 1 more
//   profiler_timeline threads T N  T threads mark N frames each, at once

#include <k15/memory.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

std::vector<char*> level;

// Frame i: Level grows by 1000 bytes (kept), Particles makes and frees 64 bytes.
void frame() {
    {
        K15_MEMORY_SCOPE("Level");
        level.push_back(new char[1000]);
    }
    {
        K15_MEMORY_SCOPE("Particles");
        char* p = new char[64];
        std::memset(p, 1, 64);
        delete[] p;
    }
    k15::memory::frame_mark();
}

void run_frames(int n) {
    level.reserve(64);
    for (int i = 0; i < n; ++i) frame();
}

extern "C" void exit_on_signal(int) { std::exit(0); }

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    if (!std::strcmp(argv[1], "frames")) {
        run_frames(std::atoi(argv[2]));
    } else if (!std::strcmp(argv[1], "timer")) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::atoi(argv[2]));
        level.reserve(4096);  // outside the scope: Level counts the 100-byte blocks only
        while (std::chrono::steady_clock::now() < until && level.size() < 4096) {
            K15_MEMORY_SCOPE("Level");
            level.push_back(new char[100]);
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    } else if (!std::strcmp(argv[1], "signal")) {
        const int sig = !std::strcmp(argv[2], "INT") ? SIGINT : SIGTERM;
        std::signal(sig, exit_on_signal);
        run_frames(std::atoi(argv[3]));
        std::raise(sig);
        return 3;  // not reached: the handler exits
    } else if (!std::strcmp(argv[1], "threads")) {
        const int marks = std::atoi(argv[3]);
        std::vector<std::thread> threads;
        for (int t = std::atoi(argv[2]); t > 0; --t) {
            threads.emplace_back([marks] {
                for (int i = 0; i < marks; ++i) k15::memory::frame_mark();
            });
        }
        for (auto& thread : threads) thread.join();
    } else if (!std::strcmp(argv[1], "fork")) {
        run_frames(3);
        const pid_t child = fork();
        if (child == 0) {
            frame();
            frame();
            _exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        frame();
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 4;
    }
    return 0;
}
