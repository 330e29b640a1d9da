// A program whose leak report a user reads: three lost document trees (the culprits), a big
// singleton kept on purpose, a third-party library's leaks, blocks ignored through the API and
// a double free. `thirdparty` as argument: only the third-party leak, the singleton and the
// ignored blocks.
#include "keep.h"
#include <k15/memory.h>

#include <cstdio>
#include <cstring>

namespace {

struct Element {
    Element* children[4] = {};
    char text[48] = {};
};

// A parsed document: a root and four children, of which only the root is a culprit.
[[gnu::noinline]] Element* parse_document() {
    Element* root = new Element;
    for (auto& child : root->children) child = new Element;
    return root;
}

// Kept on purpose for the whole run, and larger than every leak.
struct Registry {
    char table[4096];
};
Registry* g_registry = nullptr;

}  // namespace

// A library we cannot fix: its leaks are suppressed by name.
extern "C" [[gnu::noinline]] void thirdparty_init() { keep(new char[77]); }
extern "C" [[gnu::noinline]] void thirdparty_warm_cache() { keep(new char[79]); }

[[gnu::noinline]] void free_twice() {
    int* p = keep(new int(1));
    delete p;
    delete keep(p);
}

int main(int argc, char** argv) {
    const bool only_thirdparty = argc > 1 && std::strcmp(argv[1], "thirdparty") == 0;
    g_registry = new Registry;
    thirdparty_init();
    thirdparty_warm_cache();
    k15::memory::ignore_leak(keep(new char[91]));
    {
        k15::memory::ScopedLeakIgnore on_purpose;
        keep(new char[93]);
        keep(new char[95]);
    }
    char* after_scope = keep(new char[97]);  // a leak again, unless only_thirdparty frees it
    if (only_thirdparty) {
        delete[] after_scope;
        std::puts("leak_report: third-party leaks only");
        return 0;
    }
    for (int i = 0; i < 3; ++i) keep(parse_document());
    free_twice();
    std::puts("leak_report: done");
    return 0;
}
