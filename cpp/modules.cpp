// dlopen and dlclose, interposed (this object is linked in when the program calls them): after
// each, the tracker records the change of the module set, so stacks captured in a library that
// is later unloaded, or replaced by another at the same address, keep their own symbols.
#include "entry.h"

using k15::memory::detail::next_definition;

extern "C" void* dlopen(const char* file, int mode) noexcept {
    static const auto real = next_definition<void* (*)(const char*, int)>("dlopen");
    k15::memory::detail::loader_call_begins();
    void* handle = real(file, mode);
    k15::memory::detail::loader_call_ends();
    k15::memory::detail::modules_changed();
    return handle;
}

extern "C" int dlclose(void* handle) noexcept {
    static const auto real = next_definition<int (*)(void*)>("dlclose");
    k15::memory::detail::loader_call_begins();
    const int result = real(handle);
    k15::memory::detail::loader_call_ends();
    k15::memory::detail::modules_changed();
    return result;
}
