// The engine allocators through include/k15/engine.h; the mode (argv[1]) picks the scenario.
#include <k15/engine.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

using namespace k15::memory;

namespace game {
struct Particle {
    float position[3];
    int id;
    explicit Particle(int i) : position{0, 0, 0}, id(i) {}
};
}  // namespace game

static int failures = 0;
#define CHECK(cond)                                                   \
    do {                                                              \
        if (!(cond)) {                                                \
            std::printf("CHECK failed line %d: %s\n", __LINE__, #cond); \
            ++failures;                                               \
        }                                                             \
    } while (0)

__attribute__((noinline)) void leak_from_pool(PoolAllocator& pool) { pool.allocate(40, 8); }  // pool leak
__attribute__((noinline)) void leak_from_stack(StackAllocator& stack) { stack.allocate(24, 8); }  // stack leak
__attribute__((noinline)) void leak_from_block(BlockAllocator& block) { block.allocate(300, 16); }  // block leak
__attribute__((noinline)) void leak_from_typed(TypedPool<game::Particle>& particles) {
    particles.create(7);  // typed leak
}
__attribute__((noinline)) void leak_from_dropped() {
    PoolAllocator temporary("temporary");
    temporary.allocate(72, 8);  // retired leak
}

static int leaks() {
    static PoolAllocator pool("pool");
    static StackAllocator stack("frame", 4096);
    static BlockAllocator block("arena", 1 << 16);
    static TypedPool<game::Particle> particles;
    leak_from_pool(pool);
    leak_from_stack(stack);
    leak_from_block(block);
    leak_from_typed(particles);
    leak_from_dropped();
    // Freed blocks are no leaks.
    pool.deallocate(pool.allocate(16, 8));
    particles.destroy(particles.create(1));
    CHECK(pool.stats().live_blocks == 1 && std::strcmp(pool.name(), "pool") == 0);
    CHECK(std::strcmp(particles.name(), "game::Particle") == 0);
    return failures;
}

static int lookups() {
    PoolAllocator pool("pool");
    StackAllocator stack("frame", 4096);
    BlockAllocator block("arena", 1 << 16);
    TypedPool<game::Particle> particles("particles");
    void* in_pool = pool.allocate(40, 8);
    void* in_stack = stack.allocate(24, 8);
    void* in_block = block.allocate(300, 16);
    game::Particle* in_typed = particles.create(3);
    int local = 0;
    const AllocatorIdentity ids[] = {allocator_of(in_pool), allocator_of(in_stack), allocator_of(in_block),
                                     allocator_of(in_typed), allocator_of(&local)};
    for (const AllocatorIdentity& id : ids) std::printf("%s %d %s\n", id.name, int(id.kind), id.type ? id.type : "-");
    CHECK(std::strcmp(type_of(in_typed), "game::Particle") == 0);
    CHECK(std::strcmp(type_of(in_pool), "unknown") == 0);
    CHECK(std::strcmp(type_of(&local), "unknown") == 0);
    particles.destroy(in_typed);
    block.deallocate(in_block);
    stack.deallocate(in_stack);
    pool.deallocate(in_pool);
    return failures;
}

static int bad_frees() {
    PoolAllocator pool("pool");
    StackAllocator stack("frame", 4096);
    BlockAllocator block("arena", 1 << 16);
    TypedPool<game::Particle> particles("particles");
    int local = 0;
    char* p = static_cast<char*>(pool.allocate(40, 8));
    char* b = static_cast<char*>(block.allocate(100, 8));
    char* s1 = static_cast<char*>(stack.allocate(16, 8));
    char* s2 = static_cast<char*>(stack.allocate(16, 8));
    game::Particle* object = particles.create(1);
    const AllocatorStats before[] = {pool.stats(), block.stats(), stack.stats(), particles.stats()};
    pool.deallocate(&local);     // foreign
    block.deallocate(b + 8);     // interior
    stack.deallocate(s1);        // out of order
    particles.destroy(reinterpret_cast<game::Particle*>(&local));  // foreign
    pool.deallocate(p);
    pool.deallocate(p);          // double free
    const AllocatorStats after[] = {pool.stats(), block.stats(), stack.stats(), particles.stats()};
    CHECK(after[0].frees == 1 && after[0].live_blocks == 0);
    for (int i = 1; i < 4; ++i) {
        CHECK(after[i].live_blocks == before[i].live_blocks && after[i].frees == before[i].frees);
    }
    stack.deallocate(s2);
    stack.deallocate(s1);
    block.deallocate(b);
    particles.destroy(object);
    std::printf("survived\n");
    return failures;
}

static int threads() {
    constexpr int per_thread = 20000;
    const ClassSpec classes[] = {{16, 2 * per_thread}, {32, 2 * per_thread}, {64, 2 * per_thread},
                                 {128, 2 * per_thread}, {256, 2 * per_thread}};
    PoolAllocator pool("shared", classes, 5);
    std::vector<void*> handed[2];
    std::atomic<int> ready{0};
    auto work = [&](int self) {
        std::vector<void*>& mine = handed[self];
        for (int i = 0; i < per_thread; ++i) mine.push_back(pool.allocate(16 + (i * 37 + self) % 240, 8));
        ready.fetch_add(1);
        while (ready.load() < 2) std::this_thread::yield();
        for (void* ptr : handed[1 - self]) pool.deallocate(ptr);  // the other thread's blocks
    };
    std::thread a(work, 0), b(work, 1);
    a.join();
    b.join();
    const AllocatorStats s = pool.stats();
    std::printf("allocations %llu frees %llu live %llu failures %llu\n", (unsigned long long)s.allocations,
                (unsigned long long)s.frees, (unsigned long long)s.live_blocks, (unsigned long long)s.failures);
    CHECK(s.allocations == 2 * per_thread && s.frees == 2 * per_thread && s.live_blocks == 0 && s.live_bytes == 0);
    return failures;
}

static int steady() {
    PoolAllocator pool("pool");
    StackAllocator frame("frame", 1 << 16);
    void* level = pool.allocate(128, 8);
    const Checkpoint start = checkpoint();
    memstats(true);
    for (int i = 0; i < 100; ++i) {
        StackScope scope(frame);
        frame.allocate(64, 16);
        pool.deallocate(pool.allocate(100, 8));
    }
    const MemStats loop = memstats(true);
    CHECK(loop.allocations == 200 && loop.frees == 200 && loop.live_blocks == 1);
    for (int i = 0; i < 100; ++i) {
        StackScope scope(frame);  // a frame that allocates nothing
    }
    const MemStats quiet = memstats(false);
    CHECK(quiet.allocations == 0 && quiet.frees == 0 && quiet.live_blocks == 1 && quiet.live_bytes == 128);
    void* late = pool.allocate(48, 8);
    const LeakSummary since = leaks_since(start);
    CHECK(since.blocks == 1 && since.bytes == 48 && since.allocators.size() == 1);
    CHECK(!since.allocators.empty() && std::strcmp(since.allocators[0].name, "pool") == 0);
    pool.deallocate(late);
    pool.deallocate(level);
    CHECK(leaks_since(Checkpoint{0}).blocks == 0);
    return failures;
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "";
    if (std::strcmp(mode, "leaks") == 0) return leaks();
    if (std::strcmp(mode, "lookups") == 0) return lookups();
    if (std::strcmp(mode, "bad_frees") == 0) return bad_frees();
    if (std::strcmp(mode, "threads") == 0) return threads();
    if (std::strcmp(mode, "steady") == 0) return steady();
    return 100;
}
