// A block freed after the exit report has been written: the free must still work quietly.
// This program's own .preinit_array entry registers its handler before the dynamic linker's
// _dl_fini is registered, so it runs after _dl_fini and after the report (registered inside
// _dl_fini).
#include <k15/memory.h>

#include <cstdio>
#include <cstdlib>

extern "C" int __cxa_atexit(void (*function)(void*), void* argument, void* dso_handle);

namespace {

int* freed_late = nullptr;

void free_after_report(void*) {
    delete[] freed_late;
    std::fputs("late_free: freed after the report\n", stderr);
}

void register_late_free(int, char**, char**) { __cxa_atexit(free_after_report, nullptr, nullptr); }

[[gnu::used, gnu::section(".preinit_array")]] void (*const late_free_entry)(int, char**, char**) = register_late_free;

}  // namespace

int main() {
    freed_late = K15_NEW int[25];
    std::puts("late_free: main done");
    return 0;
}
