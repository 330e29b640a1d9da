// Forks while another thread loads and unloads a plugin without pause:
//   fork_dlopen PLUGIN CHILDREN   forks CHILDREN children that exit at once (their reports read
//                                 the modules); prints how many did not exit 0 by themselves (a
//                                 child waiting forever for the loader's lock dies of SIGALRM),
//                                 how many times the plugin was loaded, and how many files the
//                                 process has open at the end
// The loader thread's dlopen allocates (through the tracker) while it holds the loader's lock,
// and a child's report calls dl_iterate_phdr, which takes that lock.
#include <dirent.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "stuck_children.h"

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: fork_dlopen PLUGIN CHILDREN\n");
        return 2;
    }
    const char* plugin = argv[1];
    const int children = std::atoi(argv[2]);
    std::atomic<bool> stop{false};
    std::atomic<long> cycles{0};
    std::thread loader([&] {
        while (!stop.load(std::memory_order_relaxed)) {
            void* handle = dlopen(plugin, RTLD_NOW);
            if (handle == nullptr) {
                std::fprintf(stderr, "dlopen: %s\n", dlerror());
                std::abort();
            }
            dlclose(handle);
            cycles.fetch_add(1, std::memory_order_relaxed);
        }
    });
    const int stuck = stuck_children(children, [](int) {});
    stop = true;
    loader.join();
    int open_files = 0;
    if (DIR* fds = opendir("/proc/self/fd")) {
        while (readdir(fds) != nullptr) ++open_files;
        closedir(fds);
    }
    std::printf("stuck children: %d\nplugin cycles: %ld\nopen files: %d\n", stuck, cycles.load(),
                open_files);
    return 0;
}
