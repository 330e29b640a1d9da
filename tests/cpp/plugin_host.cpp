// Loads plugins and unloads them before exit. `replace A B`: A leaks 301 bytes and is
// unloaded, then B is loaded (at the same address, as glibc reuses the range) and leaks 303.
// `reload PATH GEN1 GEN2 GEN3`: each generation is renamed to PATH, loaded, leaks 400 + its
// number, and is unloaded: a game's hot reload. `cycles PATH N`: loads PATH, has it allocate
// and free, and unloads it, N times; prints the resident KiB each cycle added past the first
// tenth (`kib_per_cycle`).
#include <k15/memory.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "resident.h"

namespace {

using Entry = void (*)(int);

void* load(const char* path) {
    void* handle = dlopen(path, RTLD_NOW);
    if (!handle) std::fprintf(stderr, "plugin_host: %s\n", dlerror());
    return handle;
}

// Calls the plugin's entry and returns the plugin's load address.
unsigned long call(void* handle, int size) {
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "plugin_entry"));
    entry(size);
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(entry), &info);
    return reinterpret_cast<unsigned long>(info.dli_fbase);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 4 && std::strcmp(argv[1], "replace") == 0) {
        void* a = load(argv[2]);
        if (!a) return 1;
        const unsigned long base_a = call(a, 301);
        dlclose(a);
        void* b = load(argv[3]);
        if (!b) return 1;
        const unsigned long base_b = call(b, 303);
        dlclose(b);
        std::printf("bases %lx %lx\n", base_a, base_b);
        return 0;
    }
    if (argc == 6 && std::strcmp(argv[1], "reload") == 0) {
        for (int generation = 1; generation <= 3; ++generation) {
            if (std::rename(argv[2 + generation], argv[2]) != 0) return 1;
            void* plugin = load(argv[2]);
            if (!plugin) return 1;
            std::printf("generation %d at %lx\n", generation, call(plugin, 400 + generation));
            dlclose(plugin);
        }
        return 0;
    }
    if (argc == 4 && std::strcmp(argv[1], "cycles") == 0) {
        const long cycles = std::atol(argv[3]);
        long warm_kib = 0;
        for (long cycle = 0; cycle < cycles; ++cycle) {
            if (cycle == cycles / 10) warm_kib = resident_kib();
            void* plugin = load(argv[2]);
            if (!plugin) return 1;
            reinterpret_cast<Entry>(dlsym(plugin, "plugin_churn"))(32);
            dlclose(plugin);
        }
        const double added = static_cast<double>(resident_kib() - warm_kib);
        std::printf("kib_per_cycle %.2f\n", added / static_cast<double>(cycles - cycles / 10));
        return 0;
    }
    return 2;
}
