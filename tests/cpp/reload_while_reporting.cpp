// A thread reloads a plugin (`dlopen`, a call, `dlclose`) without a pause, as an engine's hot
// reload may, while `main` writes 30 reports (snapshot_N.log) of its 10,000 leaked blocks: a
// report reads the loaded modules' writable segments as roots, and the plugin's may be unmapped
// between the moment it lists them and its scan.
//
//   reload_while_reporting PLUGIN
#include <k15/memory.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "keep.h"

namespace {

// In a frame of its own, which a report written from `main` does not read: no copy of the last
// pointer stays in `main`'s.
[[gnu::noinline]] void leak_blocks() {
    for (int i = 0; i < 10000; ++i) {
        void* block = std::malloc(40);
        keep(block);  // LEAK: 10,000 of them
        // Written whole: memory the heap reuses holds what its last blocks left there, which the
        // scan would read as pointers (to a block leaked here: one indirect leak in 90 reports).
        std::memset(block, 1, 40);
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    const char* plugin = argv[1];
    std::atomic<bool> stop{false};
    std::atomic<long> reloads{0};
    std::thread reloader([&] {
        while (!stop.load()) {
            void* handle = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
            if (handle == nullptr) {
                std::fprintf(stderr, "%s\n", dlerror());
                std::abort();
            }
            auto touch = reinterpret_cast<int (*)(int)>(dlsym(handle, "plugin_touch"));
            touch(static_cast<int>(reloads.load()));
            dlclose(handle);
            ++reloads;
        }
    });
    leak_blocks();
    while (reloads.load() < 100) std::this_thread::yield();
    for (int i = 0; i < 30; ++i) {
        char path[64];
        std::snprintf(path, sizeof path, "snapshot_%d.log", i);
        k15::memory::write_leak_report(path);
    }
    stop = true;
    reloader.join();
    std::printf("reloads %ld\n", reloads.load());
}
