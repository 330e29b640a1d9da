// A launcher that knows nothing of the tracker: it runs the engine library of
// tests/cpp/shared_engine.cpp, linked at start (-DENGINE_LINKED) or loaded with dlopen from
// argv[1] and dlclosed before exit, and has it load the plugin named last on the command line. Its own statics free at exit; it leaks one block before the
// engine runs and one after, on purpose.
#include <dlfcn.h>

#include <cstdio>
#include <string>
#include <vector>

#if defined(ENGINE_LINKED)
extern "C" int engine_run(int frames);
extern "C" int engine_load_plugin(const char* path);
#endif

namespace {

struct LauncherState {
    std::vector<std::string>* history = new std::vector<std::string>(3, std::string(40, 'h'));
    ~LauncherState() {
        delete history;
        std::fputs("launcher: statics destroyed\n", stderr);
    }
};

LauncherState state;
void* volatile sink;

}  // namespace

int main(int argc, char** argv) {
    sink = new int[7];  // LAUNCHER LEAK BEFORE
#if defined(ENGINE_LINKED)
    if (argc < 2) return 2;
    const int meshes = engine_run(10);
    const int plugin = engine_load_plugin(argv[1]);
#else
    if (argc < 3) return 2;
    void* engine = dlopen(argv[1], RTLD_NOW);
    if (engine == nullptr) {
        std::fprintf(stderr, "launcher: %s\n", dlerror());
        return 3;
    }
    auto run = reinterpret_cast<int (*)(int)>(dlsym(engine, "engine_run"));
    const int meshes = run(10);
    const int plugin = reinterpret_cast<int (*)(const char*)>(dlsym(engine, "engine_load_plugin"))(argv[2]);
    dlclose(engine);
    std::fputs("launcher: engine closed\n", stderr);
#endif
    sink = new char[13];  // LAUNCHER LEAK AFTER
    std::printf("launcher: %d meshes, plugin made %d\n", meshes, plugin);
    return 0;
}
