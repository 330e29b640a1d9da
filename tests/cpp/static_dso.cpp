// A shared library that owns static objects: they allocate in their constructors and free in
// their destructors, which run after the executable's. The exit report must come later still.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace {

struct Registry {
    std::vector<std::string> names;
    std::map<int, int*> values;
    Registry() {
        for (int i = 0; i < 20; ++i) names.push_back("a name long enough to live on the heap #" + std::to_string(i));
        for (int i = 0; i < 20; ++i) values[i] = new int(i);
    }
    ~Registry() {
        for (auto& [key, value] : values) delete value;
        std::fputs("static_dso: statics destroyed\n", stderr);
    }
};

Registry registry;

}  // namespace

extern "C" int static_dso_size() { return static_cast<int>(registry.names.size() + registry.values.size()); }
