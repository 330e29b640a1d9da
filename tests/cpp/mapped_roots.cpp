// Blocks whose only pointers lie in memory the program mapped itself, as an engine's arenas,
// pools and job stacks hold them: valgrind calls them still reachable while the mapping lives,
// and definitely lost once it is gone (unmapped, remapped away, made unreadable or replaced by
// a file). Each shape allocates blocks of sizes no other shape uses.
//
//   mapped_roots           every shape
//   mapped_roots huge      a 256 GiB reservation, mostly untouched, holding one pointer
//   mapped_roots threads   4 threads mapping, storing, remapping and unmapping at once
//   mapped_roots hostile   mappings made and unmapped by a signal handler that interrupts the
//                          same calls, and by forked children while two threads map and unmap
//   mapped_roots plugin SO loads SO (tests/cpp/mapped_plugin.cpp) and keeps it loaded: it holds
//                          one block in a page it mapped and one in a thread_local
#include "keep.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

const std::size_t page = 4096;

void* map(std::size_t bytes, int protection = PROT_READ | PROT_WRITE, int flags = 0) {
    void* memory = mmap(nullptr, bytes, protection, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (memory == MAP_FAILED) {
        std::perror("mmap");
        std::exit(2);
    }
    return memory;
}

void store(void* memory, std::size_t offset, void* pointer) {
    std::memcpy(static_cast<char*>(memory) + offset, &pointer, sizeof pointer);
}

struct Chain {
    Chain* next;
    char payload[1008];  // 1016 bytes with the link
};

void every_shape() {
    // An arena: a block it holds, and a block held only by that block.
    void* arena = map(1 << 20);
    Chain* head = keep(new Chain);
    head->next = nullptr;
    store(arena, 10 * page + 8, keep(new char[1001]));
    store(arena, 20 * page, head);
    char* held = keep(new char[1002]);
    std::memcpy(head->payload, &held, sizeof held);  // 1002 reached through the chain

    // Reserved, then committed in part (mprotect), as virtual-memory arenas grow.
    char* reserved = static_cast<char*>(map(64 << 20, PROT_NONE, MAP_NORESERVE));
    mprotect(reserved, 64 << 10, PROT_READ | PROT_WRITE);
    store(reserved, 100 * 8, keep(new char[1004]));

    // A 1 GiB reservation touched at one page only.
    char* sparse = static_cast<char*>(map(std::size_t(1) << 30, PROT_READ | PROT_WRITE, MAP_NORESERVE));
    store(sparse, std::size_t(700) << 20, keep(new char[1005]));

    // Unmapped with its pointer: lost.
    void* gone = map(8 * page);
    store(gone, 3 * page, keep(new char[1006]));
    munmap(gone, 8 * page);

    // Grown by mremap to a new place; the pointer written in the new part.
    void* grown = map(page);
    void* moved = mremap(grown, page, 64 * page, MREMAP_MAYMOVE);
    store(moved, 63 * page, keep(new char[1007]));

    // Part of a mapping unmapped: the pointer there is lost, the one before it stays.
    char* split = static_cast<char*>(map(4 * page));
    store(split, 3 * page, keep(new char[1008]));
    store(split, 0, keep(new char[1009]));
    munmap(split + 2 * page, 2 * page);

    // Shared anonymous memory (what a forked helper would see too).
    void* shared = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    store(shared, page, keep(new char[1010]));

    // Made unreadable after the pointer was written: nothing can read it.
    void* sealed = map(page);
    store(sealed, 0, keep(new char[1011]));
    mprotect(sealed, page, PROT_NONE);

    // A file mapped over the part of an arena that held a pointer.
    char* covered = static_cast<char*>(map(4 * page));
    store(covered, page, keep(new char[1012]));
    store(covered, 3 * page, keep(new char[1013]));
    char path[] = "/tmp/k15_mapped_roots_XXXXXX";
    int fd = mkstemp(path);
    unlink(path);
    if (fd < 0 || ftruncate(fd, page) != 0) {
        std::exit(3);
    }
    mmap(covered + page, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0);
    close(fd);

    // mmap64, the name _FILE_OFFSET_BITS=64 code calls.
    void* wide = mmap64(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    store(wide, 16, keep(new char[1014]));

    // Nothing anywhere points to it: lost.
    keep(new char[1015]);
}

void huge_reservation() {
    const std::size_t bytes = std::size_t(256) << 30;
    char* huge = static_cast<char*>(map(bytes, PROT_READ | PROT_WRITE, MAP_NORESERVE));
    store(huge, bytes / 2 + 5 * page, keep(new char[2001]));
    keep(new char[2002]);
}

void racing_threads() {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([t] {
            for (int i = 0; i < 2000; ++i) {
                char* memory = static_cast<char*>(map(8 * page));
                char* block = new char[16];
                store(memory, 4 * page, block);
                memory = static_cast<char*>(mremap(memory, 8 * page, 16 * page, MREMAP_MAYMOVE));
                munmap(memory + 8 * page, 8 * page);
                munmap(memory, 8 * page);
                delete[] block;
            }
            // Each thread leaves one arena with one block in it, and one lost block.
            store(map(2 * page), page, keep(new char[3000 + t]));
            keep(new char[3100 + t]);
        });
    }
    for (auto& thread : threads) {
        thread.join();
    }
}

void map_and_unmap(int times) {
    for (int i = 0; i < times; ++i) {
        void* memory = mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (memory == MAP_FAILED) std::_Exit(4);
        munmap(static_cast<char*>(memory) + page, page);  // a hole, then the rest
        munmap(memory, 3 * page);
    }
}

void hostile() {
    // A handler that maps while the interrupted code is inside mmap or munmap itself.
    struct sigaction action = {};
    action.sa_handler = [](int) { map_and_unmap(1); };
    action.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &action, nullptr);
    itimerval every = {{0, 50}, {0, 50}};
    setitimer(ITIMER_REAL, &every, nullptr);
    map_and_unmap(50000);
    every = {};
    setitimer(ITIMER_REAL, &every, nullptr);

    // Forks while two threads map and unmap: every child maps, leaks and exits.
    std::atomic<bool> done{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
        threads.emplace_back([&done] {
            while (!done.load()) map_and_unmap(1);
        });
    }
    for (int i = 0; i < 40; ++i) {
        pid_t child = fork();
        if (child == 0) {
            map_and_unmap(10);
            store(map(page), 8, keep(new char[4001]));
            std::exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::_Exit(5);
    }
    done = true;
    for (auto& thread : threads) thread.join();
    store(map(page), 8, keep(new char[4002]));
    keep(new char[4003]);
}

int load_plugin(const char* path) {
    void* plugin = dlopen(path, RTLD_NOW);
    auto keep_in_plugin = reinterpret_cast<void (*)(char*, char*)>(plugin ? dlsym(plugin, "keep_in_plugin") : nullptr);
    if (keep_in_plugin == nullptr) {
        std::fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    keep_in_plugin(keep(new char[5001]), keep(new char[5002]));
    keep(new char[5003]);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "";
    if (std::strcmp(mode, "huge") == 0) {
        huge_reservation();
    } else if (std::strcmp(mode, "threads") == 0) {
        racing_threads();
    } else if (std::strcmp(mode, "hostile") == 0) {
        hostile();
    } else if (std::strcmp(mode, "plugin") == 0 && argc > 2) {
        return load_plugin(argv[2]);
    } else {
        every_shape();
    }
    return 0;
}
