// A leak made inside a chain of always_inline functions, built with -O2: the stack shows each
// inlined function with its own file:line, then the function they were inlined into.
#include <k15/memory.h>

#include <cstdio>

namespace {

struct Particle {
    float position[3];
    float velocity[3];
};

Particle* volatile sink;

[[gnu::always_inline]] inline Particle* emit_one() {
    return K15_NEW Particle{};  // INNERMOST
}

[[gnu::always_inline]] inline Particle* emit_burst() {
    Particle* p = emit_one();  // MIDDLE
    p->velocity[1] = 1.0f;
    return p;
}

}  // namespace

[[gnu::noinline]] void spawn_particles() {
    sink = emit_burst();  // OUTER
}

int main() {
    spawn_particles();
    std::puts("inlined: done");
    return 0;
}
