// A block made under one tag and resized under another (in place: the size stays in its class;
// moved: it grows past it) belongs to the tag the realloc ran in, and the first tag's bytes go.
#include <k15/memory.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

void print_tags() {
    for (const k15::memory::TagStats& tag : k15::memory::tag_stats()) {
        std::printf("tag %s %llu %llu %llu\n", tag.name.c_str(), static_cast<unsigned long long>(tag.live_blocks),
                    static_cast<unsigned long long>(tag.live_bytes),
                    static_cast<unsigned long long>(tag.total_allocations));
    }
}

}  // namespace

int main() {
    void* small = nullptr;
    void* large = nullptr;
    {
        K15_MEMORY_SCOPE("Loading");
        small = std::malloc(100);
        large = std::malloc(100);
    }
    void* const small_before = small;
    void* const large_before = large;
    {
        K15_MEMORY_SCOPE("World");
        small = std::realloc(small, 104);   // the same class: in place
        large = std::realloc(large, 5000);  // another class: moved
    }
    std::printf("small in place %d, large moved %d\n", small == small_before, large != large_before);
    print_tags();
    std::free(small);
    std::free(large);
    print_tags();
    return 0;
}
