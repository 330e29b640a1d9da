// Heap damage, one kind per run (`heap_damage <kind>`): the program damages its blocks the way
// real bugs do, frees or checks them, and must reach its last line with the tracker's counts
// matching what it really holds. Every damaged block has a size of its own, so that the report
// and valgrind (on the -DK15_MEMORY_DISABLED build) can be compared block by block.
#include <k15/memory.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

namespace {

void* volatile sink;
volatile std::size_t one = 1;  // sizes the compiler cannot see through (no -Wstringop-overflow)

struct Pose {
    double x, y, z;
};

struct Base {
    long base_id = 1;
};
struct Extra {
    long extra_id = 2;
};
struct Both : Base, Extra {
    long both_id = 3;
};

// The program's own idea of what it holds, checked against stats() at the end.
std::uint64_t held_blocks = 0;

[[gnu::noinline]] char* make(std::size_t size) {
    char* block = K15_NEW char[size];  // ALLOC make
    std::memset(block, 0, size);
    sink = block;
    return block;
}

[[gnu::noinline]] void release(char* block) { delete[] block; }  // RELEASE

// Blocks without a site (a plain `new`): those of up to 16 bytes take the compact header, 16
// bytes in front of the block, its first word kept aside.
[[gnu::noinline]] char* make_plain(std::size_t size) {
    char* block = new char[size];  // ALLOC make_plain
    std::memset(block, 0, size);
    sink = block;
    return block;
}

[[gnu::noinline]] void overrun_by_one() {
    char* block = make(24);
    block[24 * one] = 'A';  // WRITE overrun_by_one
    release(block);
}

[[gnu::noinline]] void overrun_by_sixteen() {
    // Made before the damaged block, the neighbour usually lies right behind it (the heap hands
    // out a list's blocks downwards), where the 16 bytes reach its header.
    char* neighbour = make(40);
    char* block = make(40 + one - 1);
    std::memset(block + 40, 'B', 16 * one);  // WRITE overrun_by_sixteen
    release(block);
    release(neighbour);
}

[[gnu::noinline]] void memcpy_overrun() {
    Pose* pose = K15_NEW Pose;  // ALLOC pose
    const char bytes[sizeof(Pose) + 1] = "0123456789abcdefghijklmn";
    std::memcpy(static_cast<void*>(pose), bytes, sizeof(Pose) + one);  // WRITE memcpy_overrun
    sink = pose;
    delete pose;
}

[[gnu::noinline]] void underrun() {
    char* block = make(56);
    block[-static_cast<long>(one)] = 'U';  // WRITE underrun
    release(block);
}

// Blocks from outside the heap: large (a mapping of their own) and aligned over 64 bytes (the
// tracker's own heap, or a mapping for a page), written in front of their start (`far_underruns`).
// Three are freed; the last is left live, for check_heap().
[[gnu::noinline]] char* make_aligned(std::size_t size, std::size_t align) {
    char* block = static_cast<char*>(::operator new[](size, std::align_val_t{align}));  // ALLOC make_aligned
    std::memset(block, 0, size);
    sink = block;
    return block;
}

// Writes `bytes` 'U's in front of `block`.
[[gnu::noinline]] void underrun_by(char* block, std::size_t bytes) {
    std::memset(block - bytes * one, 'U', bytes);  // WRITE underrun
}

// Each written in front of its start by as many bytes as given: 8 cover the check word in front
// of it, 16, 24 and 32 more of its header (32, the whole header: an array's element before the
// first, of a struct of that size). One call each (no loop): valgrind shows one error per call
// stack.
[[gnu::noinline]] void far_underruns(std::size_t large_by, std::size_t aligned_by,
                                     std::size_t page_aligned_by, std::size_t kept_by) {
    char* large = make(200000);
    char* aligned = make_aligned(300, 256);
    char* page_aligned = make_aligned(500, 4096);
    char* kept = make(250000);
    underrun_by(large, large_by);
    underrun_by(aligned, aligned_by);
    underrun_by(page_aligned, page_aligned_by);
    underrun_by(kept, kept_by);
    release(large);
    ::operator delete[](aligned, std::align_val_t{256});
    ::operator delete[](page_aligned, std::align_val_t{4096});
    std::printf("check_heap: %zu\n", k15::memory::check_heap());
    held_blocks += 1;
}

// Further still, over the list links in front of the header (64 bytes), and over the header's
// copy in front of those (96): a block left live each time.
[[gnu::noinline]] void underrun_kept_by(std::size_t bytes) {
    char* kept = make(250000);
    underrun_by(kept, bytes);
    std::printf("block at %p\n", static_cast<void*>(kept));
    held_blocks += 1;
}

// Underruns of 5 to 8 bytes in front of heap blocks whose size fills their class (no guard
// bytes), each with a live neighbour right in front of it (made after it: the heap hands a
// list's blocks out downwards): they leave too little of the check word to name the block, and
// the neighbour's end runs straight into the header. Each is an underrun of its own block,
// freed at its delete, never an overrun of the neighbour.
[[gnu::noinline]] void near_underruns() {
    char* plain = static_cast<char*>(::operator new(32));  // ALLOC near plain
    char* plain_front = static_cast<char*>(::operator new(32));
    char* array = new char[48];  // ALLOC near array
    char* array_front = new char[48];
    char* sited = make(64);
    char* sited_front = make(64);
    char* compact = make_plain(16);
    char* compact_front = make_plain(16);
    char* wide = make_plain(80);
    char* wide_front = make_plain(80);
    underrun_by(plain, 5);
    underrun_by(array, 6);
    underrun_by(sited, 7);
    underrun_by(compact, 8);
    underrun_by(wide, 8);
    ::operator delete(plain);
    delete[] array;
    release(sited);
    release(compact);
    release(wide);
    ::operator delete(plain_front);
    delete[] array_front;
    release(sited_front);
    release(compact_front);
    release(wide_front);
}

// The same underrun in front of blocks of the C family, then `realloc`: each moves as any block
// does, its bytes with it, and the old one is freed (run with `malloc=1`).
[[gnu::noinline]] void* allocate_c(std::size_t size, std::size_t align) {
    void* block = nullptr;
    if (posix_memalign(&block, align, size) != 0) return nullptr;  // ALLOC allocate_c
    std::memset(block, 'k', size);
    return block;
}

[[gnu::noinline]] void far_underruns_realloc() {
    const std::size_t sizes[] = {200000, 300};
    const std::size_t alignments[] = {16, 256};
    int kept = 0;
    const std::uint64_t live_before = k15::memory::stats().live_blocks;
    for (int i = 0; i < 2; ++i) {
        char* block = static_cast<char*>(allocate_c(sizes[i], alignments[i]));
        underrun_by(block, 8);
        char* moved = static_cast<char*>(std::realloc(block, sizes[i] * 2));
        if (moved == nullptr) continue;
        kept += moved[0] == 'k' && moved[sizes[i] - 1] == 'k';
        std::free(moved);
    }
    const std::uint64_t live_after = k15::memory::stats().live_blocks;
    std::printf("moved and kept: %d, live blocks %s\n", kept,
                live_after == live_before ? "as before" : "changed");
}

[[gnu::noinline]] void found_by_check_heap() {
    char* first = make(72);
    char* second = make(88);
    first[72 * one] = 'C';     // WRITE check_heap first
    second[-static_cast<long>(one)] = 'D';  // WRITE check_heap second
    std::printf("check_heap: %zu\n", k15::memory::check_heap());
    std::printf("check_heap again: %zu\n", k15::memory::check_heap());
    release(first);
    release(second);
    char* kept = make(104);  // left live: the report at exit finds its damage
    kept[104 * one + 3] = 'E';  // WRITE check_heap kept
    held_blocks += 1;
}

// An overrun that wipes the whole header of the block behind it (`wipe` bytes past the end of a
// block of `size` bytes from `make_block`, whose blocks lie `stride` bytes apart): the tracker's
// size, check word and, in a full header, links. The program goes on, frees what it can and
// writes its report.
[[gnu::noinline]] void smash_the_header_behind(char* (*make_block)(std::size_t), std::size_t size,
                                               std::size_t wipe, std::size_t stride) {
    char* victim = make_block(size);
    char* block = make_block(size + one - 1);
    std::memset(block + size, 'H', wipe * one);  // WRITE smashed header
    char* after = make_block(size);
    release(block);
    release(after);
    release(victim);
    std::printf("smashed: %s\n", victim == block + stride ? "neighbour" : "elsewhere");
}

[[gnu::noinline]] void interior_delete() {
    char* block = make(120);
    release(block + 8 * one);  // INTERIOR small
    char* large = make(1 << 20);
    release(large + 5000 * one);  // INTERIOR large
    release(block);
    release(large);
}

[[gnu::noinline]] void second_base_delete() {
    Both* both = K15_NEW Both;  // ALLOC both
    Extra* extra = both;
    sink = extra;
    delete static_cast<Extra*>(sink);  // no virtual destructor: a pointer 8 bytes into the block
    delete both;
}

struct alignas(64) Line {
    char bytes[64];
};

[[gnu::noinline]] void first_delete(char* block) { delete[] block; }  // FIRST DELETE
[[gnu::noinline]] void second_delete(char* block) { delete[] block; }  // SECOND DELETE
[[gnu::noinline]] void first_delete_line(Line* line) { delete line; }
[[gnu::noinline]] void second_delete_line(Line* line) { delete line; }

[[gnu::noinline]] void free_twice(std::size_t size) {
    char* block = make(size);
    first_delete(block);
    sink = block;
    second_delete(static_cast<char*>(sink));
}

// Each block is freed twice, nothing allocated in between on the freeing thread (which would
// reuse the block), except that the thread's own allocations come from other size classes.
// One call site per size: valgrind lists an error once per distinct stack.
[[gnu::noinline]] void double_frees() {
    free_twice(24);
    free_twice(64 << 10);
    free_twice(1 << 20);
    Line* line = K15_NEW Line;  // ALLOC line
    first_delete_line(line);
    sink = line;
    second_delete_line(static_cast<Line*>(sink));
    char* shared = make(3000);
    std::thread([shared] { first_delete(shared); }).join();
    sink = shared;
    second_delete(static_cast<char*>(sink));
}

[[gnu::noinline]] void compact_errors() {
    char* under = make_plain(12);
    under[-static_cast<long>(one)] = 'V';  // WRITE compact underrun
    release(under);
    char* over = make_plain(9);
    over[9 * one] = 'W';  // WRITE compact overrun
    release(over);
    char* twice = make_plain(8);
    first_delete(twice);
    sink = twice;
    second_delete(static_cast<char*>(sink));
}

// Writes after delete, run with quarantine=64K: one found by check_heap(), one when it leaves
// the quarantine (pushed out by later frees), one by the report at exit.
[[gnu::noinline]] char* freed(std::size_t size) {
    char* block = make(size);
    release(block);
    sink = block;
    return static_cast<char*>(sink);
}

[[gnu::noinline]] void use_after_free() {
    char* first = freed(40);
    first[5 * one] = 'Z';  // WRITE after free, found by check_heap
    std::printf("uaf check_heap: %zu\n", k15::memory::check_heap());
    char* second = freed(56);
    second[0] = 'Y';  // WRITE after free, found when it leaves quarantine
    for (int i = 0; i < 200; ++i) release(make(1000));
    char* third = freed(72);
    third[71 * one] = 'X';  // WRITE after free, found at exit
}

}  // namespace

int main(int argc, char** argv) {
    const char* kind = argc > 1 ? argv[1] : "";
    const auto is = [kind](const char* name) { return std::strcmp(kind, name) == 0; };
    if (is("overrun_by_one")) overrun_by_one();
    else if (is("overrun_by_sixteen")) overrun_by_sixteen();
    else if (is("memcpy_overrun")) memcpy_overrun();
    else if (is("underrun")) underrun();
    else if (is("far_underruns")) far_underruns(8, 8, 8, 8);
    else if (is("whole_header_underruns")) far_underruns(16, 24, 32, 32);
    else if (is("underrun_over_the_links")) underrun_kept_by(64);
    else if (is("underrun_over_the_copy")) underrun_kept_by(96);
    else if (is("near_underruns")) near_underruns();
    else if (is("far_underruns_realloc")) far_underruns_realloc();
    else if (is("check_heap")) found_by_check_heap();
    else if (is("smashed_header")) smash_the_header_behind(make, 200, 96, 240);
    else if (is("interior_delete")) interior_delete();
    else if (is("second_base_delete")) second_base_delete();
    else if (is("double_frees")) double_frees();
    else if (is("use_after_free")) use_after_free();
    else if (is("compact_errors")) compact_errors();
    // 16-byte blocks: the 16 bytes past the end are the whole compact header behind.
    else if (is("compact_smashed")) smash_the_header_behind(make_plain, 16, 16, 32);
    else {
        std::printf("unknown kind %s\n", kind);
        return 2;
    }
    // The tracker still works: blocks come and go on this thread and another.
    std::thread([] { release(make(32)); }).join();
    release(make(48));
    const k15::memory::Stats stats = k15::memory::stats();
    std::printf("live blocks %llu, held %llu\n", static_cast<unsigned long long>(stats.live_blocks),
                static_cast<unsigned long long>(held_blocks));
    std::printf("last line\n");
    return 0;
}
