// Budget mode: a program that allocates until its budget is spent. Throwing forms throw
// bad_alloc, nothrow forms return null, each failure is a budget_exceeded error, and freeing
// makes room again.
#include <k15/memory.h>

#include <cstdio>
#include <new>
#include <string>
#include <vector>

namespace {

[[gnu::noinline]] void fill_the_budget(std::vector<char*>& blocks) {
    try {
        for (;;) blocks.push_back(K15_NEW char[100 * 1024]);  // SPENDS THE BUDGET
    } catch (const std::bad_alloc&) {
        std::printf("bad_alloc after %zu blocks\n", blocks.size());
    }
}

}  // namespace

int main() {
    std::vector<char*> blocks;
    blocks.reserve(1000);
    std::vector<std::string> small;
    for (int i = 0; i < 1000; ++i) small.emplace_back(100, 'x');  // counted, served fine
    fill_the_budget(blocks);
    char* refused = new (std::nothrow) char[100 * 1024];
    std::printf("nothrow: %s\n", refused == nullptr ? "null" : "memory");

    for (char* block : blocks) delete[] block;
    char* again = new char[100 * 1024];
    std::printf("after freeing: %s\n", again != nullptr ? "memory" : "null");
    delete[] again;
    std::puts("survived");
    return 0;
}
