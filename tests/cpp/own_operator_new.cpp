// A program with its own global operator new/delete (as some engines have), run with the
// tracker preloaded: the tracker must leave them alone and say so (tests/preload.rs).
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

void* operator new(std::size_t size) {
    if (void* block = std::malloc(size == 0 ? 1 : size)) return block;
    throw std::bad_alloc();
}
void operator delete(void* block) noexcept { std::free(block); }
void operator delete(void* block, std::size_t) noexcept { std::free(block); }

int main() {
    std::string text(200, 't');
    text += std::string(300, 'u');
    std::printf("own_operator_new: %zu\n", text.size());
    return 0;
}
