// Lost owner-child cycles: an owner whose constructor allocates a child of another size class
// that points back to it, the owner's delete missing. Prints whether each owner lies below its
// child, so the test knows which address order the heap chose.
//
//   cycles small_owner [child_first]   owners of 448 bytes, children of 832
//   cycles big_owner [child_first]     owners of 832 bytes, children of 448
//
// child_first: a block of the child's size is allocated (and freed) before any owner, so a heap
// that keeps each size class in spans of its own made the children's span first.

#include <cstdio>
#include <cstring>

#include "keep.h"

namespace {

template <unsigned OwnerSize, unsigned ChildSize>
struct Owner {
    struct Child {
        Owner* owner;
        char payload[ChildSize - sizeof(Owner*)];
    };
    Child* child;
    char payload[OwnerSize - sizeof(Child*)];

    Owner() : child(keep(new Child{this, {}})) {}
};

template <unsigned OwnerSize, unsigned ChildSize>
void lose_cycles(bool child_first) {
    if (child_first) delete[] keep(new char[ChildSize]);
    static_assert(sizeof(Owner<OwnerSize, ChildSize>) == OwnerSize, "owner size");
    static_assert(sizeof(typename Owner<OwnerSize, ChildSize>::Child) == ChildSize, "child size");
    int below = 0;
    for (int i = 0; i < 4; ++i) {
        auto* owner = keep(new Owner<OwnerSize, ChildSize>());  // LEAK: its delete is missing
        below += static_cast<void*>(owner) < static_cast<void*>(owner->child) ? 1 : 0;
    }
    std::fprintf(stderr, "owners below their children: %d of 4\n", below);
}

}  // namespace

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "";
    const bool child_first = argc > 2 && std::strcmp(argv[2], "child_first") == 0;
    if (std::strcmp(mode, "small_owner") == 0) lose_cycles<448, 832>(child_first);
    if (std::strcmp(mode, "big_owner") == 0) lose_cycles<832, 448>(child_first);
    return 0;
}
