// Two builds of one program for tests/readers.rs: -DNEW_BUILD moves every leak site down (as an
// edit above them would) and adds one more leak site, load_sounds.
#include <cstring>
#include "keep.h"

struct Texture {
    char pixels[256];
};

struct SceneNode {
    SceneNode* child = nullptr;
    char name[40] = {};
};

#ifdef NEW_BUILD
// These lines push every site below to another line number.
static int frames_loaded = 0;
static void count_frame() {
    frames_loaded += 1;
}
#endif

__attribute__((noinline)) void load_textures() {
    keep(new Texture);  // leak: textures
}

__attribute__((noinline)) void load_meshes() {
    for (int i = 0; i < 3; i++) keep(new char[100]);  // leak: meshes
}

// A direct leak holding an indirect one: the tree of the HTML page.
__attribute__((noinline)) SceneNode* make_child() {
    return new SceneNode;  // leak: scene child
}

__attribute__((noinline)) void load_scene() {
    SceneNode* root = keep(new SceneNode);  // leak: scene root
    root->child = make_child();
}

#ifdef NEW_BUILD
__attribute__((noinline)) void load_sounds() {
    keep(new double[32]);  // leak: sounds
}
#endif

int main() {
    load_textures();
    load_meshes();
    load_scene();
#ifdef NEW_BUILD
    count_frame();
    load_sounds();
#endif
    char* freed = keep(new char[16]);
    std::memset(freed, 0, 16);
    delete[] freed;
    return 0;
}
