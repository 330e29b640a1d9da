// One program per leak shape the report must classify as valgrind does: each shape allocates
// blocks of sizes no other shape uses, so the test can find them in both reports.
#include "keep.h"
#include <k15/memory.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

// A lost struct that owns two blocks: 1 direct (the struct), 2 indirect.
struct Owner {
    char* name;
    int* values;
};

void lost_owner() {
    Owner* owner = keep(new Owner);
    owner->name = new char[101];
    owner->values = new int[26];  // 104 bytes
    std::strcpy(owner->name, "owner");
}

// Two shared_ptr nodes pointing at each other: nothing outside points in.
struct Node {
    std::shared_ptr<Node> next;
    char payload[200];
};

void shared_ptr_cycle() {
    auto a = std::make_shared<Node>();
    auto b = std::make_shared<Node>();
    a->next = b;
    b->next = a;
}

// A singleton kept in a global pointer on purpose: reachable.
struct Config {
    char settings[300];
};
Config* g_config = nullptr;

// A static container never destroyed: reachable, with everything it holds.
std::vector<std::string>* g_names = nullptr;

void singleton_and_static_container() {
    g_config = new Config;
    g_names = new std::vector<std::string>;
    g_names->reserve(5);  // 5 * 32 = 160 bytes
    for (int i = 0; i < 3; ++i) g_names->push_back(std::string(401, char('a' + i)));  // 402 each
}

// A worker thread that leaks one block and hands another to a global.
char* g_from_thread = nullptr;

void leaks_in_threads() {
    std::thread worker([] {
        keep(new char[501]);
        g_from_thread = new char[503];
    });
    worker.join();
}

// A thread_local whose destructor forgets its block: lost when the thread ends.
struct Forgetful {
    char* block = nullptr;
    ~Forgetful() { block = nullptr; }
};
thread_local Forgetful t_forgetful;

void thread_local_destructor() {
    std::thread worker([] { t_forgetful.block = keep(new char[601]); });
    worker.join();
}

// A raw pointer lost to an exception thrown before the delete.
void throws_after_allocating() {
    char* scratch = keep(new char[701]);
    if (scratch) throw std::runtime_error("load failed");
    delete[] scratch;
}

// Static constructors: one leaks a block, one keeps its block in a global.
char* g_from_static = nullptr;
struct StaticInit {
    StaticInit() {
        keep(new char[801]);
        g_from_static = new char[803];
    }
} s_init;

}  // namespace

int main() {
    lost_owner();
    shared_ptr_cycle();
    singleton_and_static_container();
    leaks_in_threads();
    thread_local_destructor();
    try {
        throws_after_allocating();
    } catch (const std::exception& e) {
        std::printf("leak_kinds: caught %s\n", e.what());
    }
    std::printf("leak_kinds: done\n");
    return 0;
}
