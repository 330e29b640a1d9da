// One-byte overruns of blocks whose size fills their size class exactly (`exact_fit <how> <size>`):
// no guard bytes lie behind such a block, only the next block's header (or a span's guard word),
// and the tracker must still catch the byte and blame the block in front.
//
//   delete      the byte lands in a live neighbour's header, found at the neighbour's delete
//   reuse       the byte lands in a free neighbour's header, found when `new` reuses it
//   check_heap  the byte lands in a live neighbour's header, found by check_heap()
//   span_end    the block is the last one of a span: the byte lands in the span's guard word
//
// With a third argument `compact`, the blocks come from a plain `new` (no `K15_NEW` site): blocks
// of up to 16 bytes then take the compact header, 16 bytes in front of the block.
#include <k15/memory.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

// The header in front of every block (README, "Block header"): an exact fit's neighbour starts
// this far behind its last byte. A compact header is 16 bytes.
std::uintptr_t kHeader = 32;
bool compact = false;

void* volatile sink;
volatile std::size_t one = 1;  // an index the compiler cannot see through

[[gnu::noinline]] char* make_without_site(std::size_t size) {
    return new char[size];  // ALLOC no_site
}

[[gnu::noinline]] char* make(std::size_t size) {
    char* block = compact ? make_without_site(size) : K15_NEW char[size];  // ALLOC make
    std::memset(block, 0, size);
    sink = block;
    return block;
}

[[gnu::noinline]] void release(char* block) { delete[] block; }

[[gnu::noinline]] void overrun(char* block, std::size_t size) {
    block[size * one] = 'X';  // WRITE exact_fit
}

std::uintptr_t address(const char* block) { return reinterpret_cast<std::uintptr_t>(block); }

// Two blocks of `size` bytes, the second right behind the first; the rest freed.
std::pair<char*, char*> adjacent_pair(std::size_t size) {
    std::vector<char*> blocks;
    for (int i = 0; i < 256; ++i) blocks.push_back(make(size));
    std::set<std::uintptr_t> at;
    for (char* block : blocks) at.insert(address(block));
    char* front = nullptr;
    char* behind = nullptr;
    for (char* block : blocks) {
        if (at.count(address(block) + size + kHeader) != 0) {
            front = block;
            behind = reinterpret_cast<char*>(address(block) + size + kHeader);
            break;
        }
    }
    for (char* block : blocks) {
        if (block != front && block != behind) release(block);
    }
    return {front, behind};
}

// A block of `size` bytes that is the last one carved from its span: no block of ours lies right
// behind it (nor behind the 64 bytes carving skips at a page start), yet blocks lie further on.
// Every other block stays live (returned in `kept`), so that the span keeps its class.
char* last_of_a_span(std::size_t size, std::vector<char*>& kept) {
    std::vector<char*> blocks;
    for (int i = 0; i < 3 * (1 << 20) / static_cast<int>(size + kHeader); ++i) {
        blocks.push_back(make(size));
    }
    std::sort(blocks.begin(), blocks.end());
    std::set<std::uintptr_t> at;
    for (char* block : blocks) at.insert(address(block));
    char* last = nullptr;
    for (char* block : blocks) {
        const std::uintptr_t next = address(block) + size + kHeader;
        if (block != blocks.back() && at.count(next) == 0 && at.count(next + 64) == 0) {
            last = block;
            break;
        }
    }
    for (char* block : blocks) {
        if (block == last) continue;
        kept.push_back(block);
    }
    return last;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3 && argc != 4) return 2;
    const std::string how = argv[1];
    const std::size_t size = std::strtoul(argv[2], nullptr, 10);
    compact = argc == 4 && std::string(argv[3]) == "compact";
    if (compact && size <= 16) kHeader = 16;
    if (how == "span_end") {
        std::vector<char*> kept;
        char* last = last_of_a_span(size, kept);
        if (last == nullptr) {
            std::printf("no span end found\n");
            return 3;
        }
        std::printf("front %p\n", static_cast<void*>(last));
        overrun(last, size);
        std::printf("check_heap %zu\n", k15::memory::check_heap());
        release(last);
        for (char* block : kept) release(block);
        std::printf("last line\n");
        return 0;
    }
    auto [front, behind] = adjacent_pair(size);
    if (front == nullptr) {
        std::printf("no adjacent blocks\n");
        return 3;
    }
    std::printf("front %p\n", static_cast<void*>(front));
    if (how == "delete") {
        overrun(front, size);
        release(behind);
        release(front);
    } else if (how == "reuse") {
        release(behind);
        overrun(front, size);
        char* again = make(size);
        std::printf("reused %s\n", again == behind ? "yes" : "no");
        std::printf("check_heap %zu\n", k15::memory::check_heap());
        release(again);
        release(front);
    } else if (how == "check_heap") {
        overrun(front, size);
        std::printf("check_heap %zu\n", k15::memory::check_heap());
        release(behind);
        release(front);
    } else {
        return 2;
    }
    std::printf("last line\n");
    return 0;
}
