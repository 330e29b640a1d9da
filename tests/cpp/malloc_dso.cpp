// A shared library that allocates with malloc, as Debian's C libraries of an engine do.

#include <cstdlib>

extern "C" [[gnu::noinline]] void* dso_make_buffer(std::size_t size) { return std::malloc(size); }
