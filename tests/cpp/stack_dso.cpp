// A shared library of the test's own, built -O2 -fomit-frame-pointer: allocations made inside
// it, and through a callback it calls, must still show complete stacks.
#include <functional>

struct Widget {
    int id;
    char name[20];
};

Widget* volatile dso_sink;

// Allocated by the library's static constructor, before main, and never freed.
Widget* boot_widget = new Widget{42, "boot"};  // BEFORE MAIN

extern "C" [[gnu::noinline]] void dso_make_widget(int id) {
    dso_sink = new Widget{id, {}};  // DSO ALLOC
}

extern "C" [[gnu::noinline]] void dso_call_back(void (*callback)(int), int id) {
    std::function<void(int)> wrapped = callback;
    wrapped(id);  // DSO CALLBACK
}
