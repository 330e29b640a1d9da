// Test-only shim for rust/stack/tests.rs: Debian's libBullet*.so (no frame pointers) calling
// an allocation hook that passes its frame address on, as k15's Bullet hooks will.
#include <btBulletDynamicsCommon.h>

#include <cstdlib>

using frame_callback = void (*)(void* frame_address);
static frame_callback g_cb;

__attribute__((noinline, optimize("no-omit-frame-pointer"))) static void* hook_alloc(size_t n) {
    if (g_cb) g_cb(__builtin_frame_address(0));
    void* p = std::malloc(n);
    asm volatile("" ::: "memory");
    return p;
}

static void hook_free(void* p) { std::free(p); }

extern "C" void k15_shim_bullet_world(frame_callback cb) {
    btAlignedAllocSetCustom(hook_alloc, hook_free);
    auto* config = new btDefaultCollisionConfiguration();
    auto* dispatcher = new btCollisionDispatcher(config);
    auto* broadphase = new btDbvtBroadphase();
    auto* solver = new btSequentialImpulseConstraintSolver();
    g_cb = cb;  // the world's constructor (libBulletDynamics.so) allocates its parts
    auto* world = new btDiscreteDynamicsWorld(dispatcher, broadphase, solver, config);
    g_cb = nullptr;
    delete world;
    delete solver;
    delete broadphase;
    delete dispatcher;
    delete config;
    asm volatile("" ::: "memory");
}
