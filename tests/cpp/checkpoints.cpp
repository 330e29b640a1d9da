// checkpoint() and leaks_since() over every tracked block (tests/checkpoints.rs): Unreal Insights'
// A-B-C question, "allocated after loading level 2 and still live after unloading it", asked of
// a game that allocates its levels with plain new and malloc, and one engine pool.
#include <k15/engine.h>
#include <k15/memory.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

struct Level {
    char* meshes[10];   // new[] of 1000 bytes each
    void* scripts[5];   // malloc(200) each
};

// The cache the level 2 code forgets to clear: what the question must find.
char* forgotten_meshes[3];
void* forgotten_script;
int* worker_blocks[2];

__attribute__((noinline)) void load(Level& level) {
    for (char*& mesh : level.meshes)
        mesh = new char[1000];
    for (void*& script : level.scripts)
        script = std::malloc(200);
}

__attribute__((noinline)) void unload(Level& level, bool leaky) {
    for (int i = 0; i < 10; ++i) {
        if (leaky && i < 3)
            forgotten_meshes[i] = level.meshes[i];  // kept past the unload
        else
            delete[] level.meshes[i];
    }
    for (int i = 0; i < 5; ++i) {
        if (leaky && i == 0)
            forgotten_script = level.scripts[i];
        else
            std::free(level.scripts[i]);
    }
}

}  // namespace

int main() {
    std::fputs("start\n", stderr);
    k15::memory::PoolAllocator pool("level pool");
    pool.deallocate(pool.allocate(16, 8));  // the pool's first use on this thread sets up its TLS
    int* kept_from_start = new int(7);  // live throughout: before the checkpoint, not counted
    char* freed_after = new char[64];   // allocated before, freed after: not counted
    Level one{};
    load(one);
    unload(one, false);

    // Started before the checkpoint: glibc's own blocks for a thread (its TLS) are no part of
    // the question.
    std::atomic<int> step{0};
    std::thread worker([&step] {
        step = 1;
        while (step.load() != 2) std::this_thread::yield();
        for (int*& block : worker_blocks)
            block = new int[16];  // another thread's blocks, kept
        step = 3;
        while (step.load() != 4) std::this_thread::yield();
    });
    while (step.load() != 1) std::this_thread::yield();

    const k15::memory::Checkpoint a = k15::memory::checkpoint();  // A: level 2 starts loading
    Level two{};
    load(two);
    void* pooled = pool.allocate(48, 8);  // an engine allocator's block, kept
    step = 2;
    while (step.load() != 3) std::this_thread::yield();
    delete[] freed_after;
    unload(two, true);  // B: level 2 unloaded
    const k15::memory::LeakSummary since = k15::memory::leaks_since(a);  // C: what stayed
    step = 4;
    worker.join();

    for (const k15::memory::AllocatorLeaks& row : since.allocators)
        std::printf("row %s %llu %llu\n", row.name, static_cast<unsigned long long>(row.blocks),
                    static_cast<unsigned long long>(row.bytes));
    std::printf("total %llu %llu\n", static_cast<unsigned long long>(since.blocks),
                static_cast<unsigned long long>(since.bytes));

    for (char* mesh : forgotten_meshes)
        delete[] mesh;
    std::free(forgotten_script);
    for (int* block : worker_blocks)
        delete[] block;
    pool.deallocate(pooled);
    delete kept_from_start;
    return 0;
}
