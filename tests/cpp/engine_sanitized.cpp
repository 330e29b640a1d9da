// An engine that uses engine.h, built with -fsanitize=address: memory.h turns k15-memory off
// (AddressSanitizer brings its own operator new) and engine.h falls back to plain allocation, so
// the same code builds, runs, and lets the sanitizer see every block.
#include <k15/engine.h>
#include <cstdio>
struct Enemy { int hp; explicit Enemy(int h) : hp(h) {} };
int main() {
    k15::memory::PoolAllocator pool("particles");
    void* p = pool.allocate(48, 64);
    pool.deallocate(p);
    k15::memory::StackAllocator frame("frame", 1 << 20);
    { k15::memory::StackScope scope(frame); frame.allocate(256); frame.allocate(100); }
    k15::memory::BlockAllocator level("level", 1 << 20);
    level.deallocate(level.allocate(1000));
    k15::memory::TypedPool<Enemy> enemies;
    Enemy* e = enemies.create(5);
    int hp = e->hp;
    enemies.destroy(e);
    std::printf("ok %d %s %s\n", hp, k15::memory::allocator_of(e).name, k15::memory::type_of(e));
    return static_cast<int>(k15::memory::memstats().allocations);
}
