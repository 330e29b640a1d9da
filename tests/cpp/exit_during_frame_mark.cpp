// The main thread marks frames without a pause while SIGALRM's handler, after DELAY_US, calls
// `exit(3)`, or writes a report, or marks a frame itself, and leaves with `_exit(3)`: the
// handler often lands inside a mark, whose lock its own thread holds.
//
//   exit_during_frame_mark exit|report|mark DELAY_US
#include <k15/memory.h>

#include <sys/time.h>

#include <csignal>
#include <cstdlib>
#include <cstring>

namespace {

const char* mode = "exit";

extern "C" void on_alarm(int) {
    if (std::strcmp(mode, "exit") == 0) std::exit(3);
    if (std::strcmp(mode, "mark") == 0) k15::memory::frame_mark();
    k15::memory::write_leak_report("from_handler.log");
    std::_Exit(3);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) return 2;
    mode = argv[1];
    std::signal(SIGALRM, on_alarm);
    itimerval timer{};
    timer.it_value.tv_usec = std::atoi(argv[2]);
    setitimer(ITIMER_REAL, &timer, nullptr);
    for (;;) k15::memory::frame_mark();
}
