// The sample engine: a newcomer's first run. It leaks three blocks on purpose (see LEAK 1..3
// in world.cpp); the leak log written at exit lists exactly those.
#include "world.h"

#include <k15/memory.h>

#include <cstdio>

int main() {
    engine::World world;
    world.load_sky();
    for (int id = 0; id < 10; ++id) world.spawn(id, id % 2 ? "crate" : "barrel");
    for (int frame = 0; frame < 60; ++frame) world.step(1.0f / 60.0f);
    world.despawn(7);
    float jobs = world.run_jobs(8);

    const k15::memory::Stats stats = k15::memory::stats();
    std::printf("engine: %zu entities, jobs %.2f; %llu allocations so far, %llu live\n", world.entity_count(), jobs,
                static_cast<unsigned long long>(stats.total_allocations),
                static_cast<unsigned long long>(stats.live_blocks));
    return 0;
}
