// A plugin that tests/cpp/mapped_roots.cpp loads with dlopen and never closes, built without the
// tracker: it keeps one block in a page it maps itself and one in a thread_local (a block the
// dynamic linker allocates for the thread on first use).
#include <sys/mman.h>

#include <cstring>

namespace {
thread_local char* kept_by_thread;
}

extern "C" void keep_in_plugin(char* in_page, char* in_thread_local) {
    void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::memcpy(page, &in_page, sizeof in_page);
    kept_by_thread = in_thread_local;
}
