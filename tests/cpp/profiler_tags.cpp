// A game loop with three subsystems (Physics, Render, Audio) over 300 frames under tag scopes,
// each frame marked, plus blocks handed between threads after the last frame: prints
// k15::memory::tag_stats() for tests/profiler.rs, which checks every figure, and the report's
// per-frame ones, against what this program allocates (the numbers in comments).

#include <k15/memory.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

const int FRAMES = 300;

void* solver_state = nullptr;
char* textures[FRAMES / 10];
int texture_count = 0;

// Physics/Solver: one 100-byte block live across frames (freed before the next is made);
// Physics/Broadphase: four 64-byte pairs made and freed each frame.
void physics() {
    K15_MEMORY_SCOPE("Physics");
    {
        K15_MEMORY_SCOPE("Physics/Solver");
        std::free(solver_state);
        solver_state = std::malloc(100);
    }
    K15_MEMORY_SCOPE("Physics/Broadphase");
    char* pairs[4];
    for (char*& pair : pairs) pair = new char[64];
    for (char* pair : pairs) delete[] pair;
}

// Render: a 32-byte command list each frame (freed); Render/Textures: a 4096-byte texture every
// tenth frame, kept (leaked). Opened through the C API, as a C subsystem would.
void render(int frame) {
    k15_memory_scope_push("Render");
    if (frame % 10 == 0) {
        K15_MEMORY_SCOPE("Render/Textures");
        textures[texture_count++] = K15_NEW char[4096];
    }
    char* commands = new char[32];
    delete[] commands;
    k15_memory_scope_pop();
}

// Audio: two 4-byte voices made and freed each frame (blocks small enough for the compact
// layout, which tagged blocks do not take).
void audio() {
    K15_MEMORY_SCOPE("Audio");
    int* left = new int(1);
    int* right = new int(2);
    delete left;
    delete right;
}

// Loading: 200 blocks of 40 bytes made on this thread, freed by another (untagged) one.
// Jobs: a worker makes 100 blocks of 48 bytes; this thread frees 50 of them after the join.
void threads() {
    static char* loaded[200];
    {
        K15_MEMORY_SCOPE("Loading");
        for (char*& block : loaded) block = new char[40];
    }
    static char* jobs[100];
    std::thread worker([] {
        for (char* block : loaded) delete[] block;
        K15_MEMORY_SCOPE("Jobs");
        for (char*& block : jobs) block = new char[48];
    });
    worker.join();
    for (int i = 0; i < 50; ++i) delete[] jobs[i];
}

}  // namespace

int main() {
    k15::memory::frame_mark();  // start-up ends: frame 1 begins
    for (int frame = 0; frame < FRAMES; ++frame) {
        physics();
        render(frame);
        audio();
        k15::memory::frame_mark();
    }
    threads();
    // Read outside any scope: the vector and its strings are untagged.
    const std::vector<k15::memory::TagStats> tags = k15::memory::tag_stats();
    for (const k15::memory::TagStats& t : tags) {
        std::printf("tag %s %llu %llu %llu %llu %llu %llu\n", t.name.c_str(),
                    static_cast<unsigned long long>(t.live_blocks), static_cast<unsigned long long>(t.live_bytes),
                    static_cast<unsigned long long>(t.peak_bytes),
                    static_cast<unsigned long long>(t.total_allocations),
                    static_cast<unsigned long long>(t.total_bytes), static_cast<unsigned long long>(t.budget_bytes));
    }
    std::printf("tags: %zu\n", tags.size());
    return 0;
}
