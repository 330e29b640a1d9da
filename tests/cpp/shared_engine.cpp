// An engine built as a shared library with the tracker linked into it (tests/shared_engine.rs):
// its statics free their blocks at exit, it leaks one block on purpose, and it loads a plugin.
#include <k15/memory.h>

#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace {

struct Assets {
    std::map<std::string, std::vector<float>*> meshes;
    ~Assets() {
        for (auto& mesh : meshes) delete mesh.second;
        std::fputs("shared_engine: statics destroyed\n", stderr);
    }
};

Assets assets;
int* volatile sink;

}  // namespace

extern "C" int engine_run(int frames) {
    for (int frame = 0; frame < frames; ++frame) {
        const std::string name = "mesh_" + std::to_string(frame) + std::string(40, 'x');
        assets.meshes[name] = K15_NEW std::vector<float>(64, 1.0f);
    }
    sink = K15_NEW int[5];  // ENGINE LEAK
    return static_cast<int>(assets.meshes.size());
}

// The plugin's blocks are tracked even when it is loaded after a take-over: the tracker
// redirects its calls as dlopen returns.
extern "C" int engine_load_plugin(const char* path) {
    void* plugin = dlopen(path, RTLD_NOW);
    if (plugin == nullptr) return -1;
    auto make = reinterpret_cast<std::string* (*)()>(dlsym(plugin, "plugin_make"));
    std::string* made = make();
    const int size = static_cast<int>(made->size());
    delete made;
    return size;
}
