// Budget mode with the budget spent to its last byte when main returns: the tracker's own work
// at exit (releasing the runtimes' caches) is not the program's and spends nothing of it.

#include <new>

#include "keep.h"

namespace {

char* g_blocks[1 << 16];

}  // namespace

int main() {
    int count = 0;
    while (count < (1 << 16) && (g_blocks[count] = keep(new (std::nothrow) char[1024])) != nullptr) {
        ++count;  // SPENDS THE BUDGET
    }
    for (int size = 512; size >= 1; size /= 2) {
        while (count < (1 << 16) && (g_blocks[count] = keep(new (std::nothrow) char[size])) != nullptr) ++count;
    }
    return count > 0 ? 0 : 1;
}
