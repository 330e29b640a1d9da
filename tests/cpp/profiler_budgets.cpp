// Tag budgets (tests/profiler.rs writes the budgets file): Render/Textures crossed by a leaf's
// allocation twice (it goes back under in between), Physics crossed by its two children
// together; the program goes on after each.

#include <k15/memory.h>

#include <cstdio>
#include <cstdlib>

namespace {

char* textures[4];

[[gnu::noinline]] char* load_texture() {
    K15_MEMORY_SCOPE("Render/Textures");
    return new char[4096];
}

[[gnu::noinline]] void* solve() {
    K15_MEMORY_SCOPE("Physics/Solver");
    return std::malloc(600);
}

[[gnu::noinline]] void* broadphase() {
    K15_MEMORY_SCOPE("Physics/Broadphase");
    return std::malloc(600);
}

}  // namespace

int main() {
    // 4096, 8192, then 12288 bytes: over the 10K budget (a crossing).
    for (int i = 0; i < 3; ++i) textures[i] = load_texture();
    // Back under (8192), then over again: a second crossing.
    delete[] textures[2];
    textures[2] = load_texture();
    // Still over: no third one.
    textures[3] = load_texture();
    // Physics' budget (1000) counts its children: 600 + 600 crosses it at the second.
    void* solver = solve();
    void* pairs = broadphase();
    std::free(pairs);
    std::free(solver);
    for (char* texture : textures) delete[] texture;
    for (const k15::memory::TagStats& t : k15::memory::tag_stats()) {
        std::printf("budget %s %llu\n", t.name.c_str(), static_cast<unsigned long long>(t.budget_bytes));
    }
    std::printf("went on\n");
    return 0;
}
