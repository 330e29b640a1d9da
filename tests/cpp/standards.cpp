// One program for every language standard the headers support: tests/standards.rs builds it as
// C++11, 14, 17 and 20 with g++ and clang++ (-Wall -Wextra -pedantic -Werror).
#include <k15/bullet.h>
#include <k15/engine.h>
#include <k15/memory.h>

#include <cstdint>
#include <cstdio>

namespace {

struct Particle {
    explicit Particle(float v) : x(v), y(v), z(v) {}
    float x, y, z;
};

#if defined(__cpp_aligned_new)
struct alignas(64) CacheLine {
    char bytes[64];
};
#endif

void* volatile sink;

}  // namespace

int main() {
    Particle* kept = K15_NEW Particle(1.0f);  // STANDARDS LEAK
    sink = kept;
    int* scratch = K15_NEW int[16];
    sink = scratch;
    delete[] scratch;
#if defined(__cpp_aligned_new)
    const int aligned_new = 1;
    CacheLine* line = K15_NEW CacheLine;
    sink = line;
    const bool aligned = reinterpret_cast<std::uintptr_t>(line) % 64 == 0;
    delete line;
#else
    const int aligned_new = 0;
    const bool aligned = true;
#endif
    k15::memory::PoolAllocator pool("standards_pool");
    void* block = pool.allocate(48);
    sink = block;
    pool.deallocate(block);
    k15::memory::TypedPool<Particle> particles;
    Particle* particle = particles.create(2.0f);
    sink = particle;
    particles.destroy(particle);
    const k15::memory::Stats stats = k15::memory::stats();
    std::printf("standards: __cplusplus %ld, aligned_new %d, aligned %d, live %llu\n", static_cast<long>(__cplusplus),
                aligned_new, aligned ? 1 : 0, static_cast<unsigned long long>(stats.live_blocks));
    return 0;
}
