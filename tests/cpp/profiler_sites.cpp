// profile=1: most allocations, temporary allocations and the peak's consumers, compared with
// heaptrack_print on the plain build (tests/profiler_sites.rs). One thread; every allocation
// comes from a function of its own, so that each site's first frame names it.
#include <k15/memory.h>

#include <cstdio>
#include <cstdlib>

namespace {

struct Particle {
    float position[4];
    float velocity[4];
};

// 2000 temporary allocations of 32 bytes: each freed before anything else is allocated.
__attribute__((noinline)) void spawn_particles() {
    for (int i = 0; i < 2000; ++i) {
        Particle* p = new Particle{};  // profiler_sites: particle
        p->position[0] = static_cast<float>(i);
        delete p;
    }
}

char* level_chunks[40];

// 40 blocks of 4096 bytes, live at the peak.
__attribute__((noinline)) void load_level() {
    for (char*& chunk : level_chunks)
        chunk = new char[4096];  // profiler_sites: chunk
}

__attribute__((noinline)) void unload_level() {
    for (char*& chunk : level_chunks) {
        delete[] chunk;
        chunk = nullptr;
    }
}

void* messages[300];

// 300 blocks of 100 bytes, not temporary: each freed only after the next was allocated.
__attribute__((noinline)) void post_messages() {
    for (void*& message : messages)
        message = std::malloc(100);  // profiler_sites: message
}

__attribute__((noinline)) void drain_messages() {
    for (void* message : messages)
        std::free(message);
}

// Three blocks of 512 bytes made at start-up and kept to the end: live at the peak too.
__attribute__((noinline)) char* make_config() {
    K15_MEMORY_SCOPE("Config");
    return K15_NEW char[512];  // profiler_sites: config
}

}  // namespace

int main() {
    char* config[3];
    for (char*& c : config)
        c = make_config();
    post_messages();
    drain_messages();
    load_level();
    spawn_particles();  // the peak: the level and the config live
    unload_level();
    spawn_particles();
    for (char* c : config)
        delete[] c;
    std::fputs("done\n", stderr);  // unbuffered: no stdio buffer allocated
    return 0;
}
