// A game that quits by calling std::exit from deep inside its loop, its state still held by the
// locals of the functions that called exit (as engines quit on a fatal error or a quit event):
// valgrind scans those live frames, so the state is still reachable; the one block nothing
// holds is the only leak.
//
//   exit_deep          quits with std::exit
//   exit_deep quick    quits with std::quick_exit (no destructors, no atexit handlers)
#include "keep.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Level {
    std::vector<int> tiles = std::vector<int>(2000);  // 8000 bytes
    std::string name = std::string(300, 'l');
};

struct Game {
    std::unique_ptr<Level> level{new Level};
    std::vector<std::unique_ptr<char[]>> assets;
    bool quit_requested = true;
    bool quickly = false;

    __attribute__((noinline)) void quit() {
        keep(new char[8101]);  // LEAK: nothing holds it
        if (quickly) std::quick_exit(quit_requested ? 0 : 1);
        std::exit(quit_requested ? 0 : 1);
    }

    __attribute__((noinline)) void run() {
        for (int i = 0; i < 3; ++i) assets.emplace_back(new char[8200]);
        if (quit_requested) quit();
    }
};

}  // namespace

int main(int argc, char**) {
    Game game;  // in main's frame: live while exit runs
    game.quickly = argc > 1;
    auto* session = new std::vector<int>(1000);  // 4000 bytes, held only by this local
    game.run();
    delete session;
    return 0;
}
