// What memory a program gets back, plain and under the tracker (`benches/memory_back.rs` and
// `tests/memory_back.rs` run it). Each mode prints `key value` lines:
//   free_all        5M x 16 B and 1M x 200 B live, then all freed: resident KiB at the peak and after
//   threads N       N threads alive at once, each allocating and freeing a mix of sizes, then all
//                   gone: resident KiB while they live and after they are gone
//   fill SIZE BYTES blocks of SIZE bytes (0: a mix) until bad_alloc: the fraction of BYTES (the
//                   budget) they hold; then again once another thread has freed them
//   phases          three sizes take turns, 100,000 blocks of one allocated and all freed at a
//                   time, 20 rounds: the page faults and CPU milliseconds it took
//   levels          a level of 4 MiB of small blocks, freed, then one of 16 large blocks (256 KiB,
//                   each mapped alone): resident KiB at the start and with the large blocks live
#include <sys/resource.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>
#include "../../tests/cpp/resident.h"

namespace {

void free_all() {
    const long before = resident_kib();
    std::vector<char*> small(5000000), medium(1000000);
    for (char*& block : small) {
        block = new char[16];
        block[0] = 1;
    }
    for (char*& block : medium) {
        block = new char[200];
        block[0] = 1;
    }
    const long peak = resident_kib();
    for (char* block : small) delete[] block;
    for (char* block : medium) delete[] block;
    std::vector<char*>().swap(small);
    std::vector<char*>().swap(medium);
    std::printf("start_kib %ld\npeak_kib %ld\nafter_kib %ld\n", before, peak, resident_kib());
}

// All threads allocate, then wait until every one of them has (so that they are alive at once),
// free, and leave.
struct Gate {
    std::mutex lock;
    std::condition_variable opened;
    int waiting = 0;
    int expected;
    explicit Gate(int threads) : expected(threads) {}
    void pass() {
        std::unique_lock<std::mutex> guard(lock);
        if (++waiting == expected) opened.notify_all();
        opened.wait(guard, [this] { return waiting >= expected; });
    }
};

void threads(int count) {
    const long before = resident_kib();
    Gate all_allocated(count + 1);
    Gate all_freed(count + 1);
    std::vector<std::thread> workers;
    for (int t = 0; t < count; ++t) {
        workers.emplace_back([&, t] {
            std::vector<char*> blocks;
            blocks.reserve(400);
            for (int i = 0; i < 400; ++i) {
                const std::size_t size = 16 + static_cast<std::size_t>((i * 97 + t * 13) % 1000);
                char* block = new char[size];
                std::memset(block, i, size);
                blocks.push_back(block);
            }
            all_allocated.pass();
            for (char* block : blocks) delete[] block;
            std::vector<char*>().swap(blocks);
            all_freed.pass();
        });
    }
    all_allocated.pass();
    const long alive = resident_kib();
    all_freed.pass();
    for (std::thread& worker : workers) worker.join();
    std::printf("start_kib %ld\nalive_kib %ld\nafter_kib %ld\n", before, alive, resident_kib());
}

// Kept out of the heap, which the budget counts.
char* filled[1 << 20];

// Blocks of `size` bytes (0: a mix) until the budget refuses one: how many, and their bytes.
std::size_t fill_until_refused(std::size_t size, std::size_t& held) {
    std::size_t count = 0;
    held = 0;
    for (std::size_t i = 0; count < sizeof filled / sizeof filled[0]; ++i) {
        const std::size_t bytes = size != 0 ? size : std::size_t{16} << (i % 9);  // 16 B .. 4 KiB
        char* block = new (std::nothrow) char[bytes];
        if (block == nullptr) break;
        filled[count++] = block;
        held += bytes;
    }
    return count;
}

// Fills the budget, frees it all on another thread (started first: starting a thread allocates),
// fills it again: the second fill shows that blocks freed off their own thread gave their bytes
// back at once.
void fill(std::size_t size, double budget) {
    std::mutex lock;
    std::condition_variable changed;
    std::size_t to_free = 0;
    bool freed = false;
    std::thread freer([&] {
        std::unique_lock<std::mutex> guard(lock);
        changed.wait(guard, [&] { return to_free != 0; });
        for (std::size_t i = 0; i < to_free; ++i) delete[] filled[i];
        freed = true;
        changed.notify_all();
    });
    std::size_t held = 0;
    std::size_t count = fill_until_refused(size, held);
    std::printf("blocks %zu\nfill %.3f\n", count, static_cast<double>(held) / budget);
    {
        std::unique_lock<std::mutex> guard(lock);
        to_free = count;
        changed.notify_all();
        changed.wait(guard, [&] { return freed; });
    }
    count = fill_until_refused(size, held);
    std::printf("refill %.3f\n", static_cast<double>(held) / budget);
    for (std::size_t i = 0; i < count; ++i) delete[] filled[i];
    freer.join();
}

// A program whose phases take turns between classes (a level's objects, then another's): what
// memory kept between phases saves in page faults.
void phases() {
    const auto cpu_ms = [](const rusage& usage) {
        return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e3 +
               (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e3;
    };
    rusage before{};
    getrusage(RUSAGE_SELF, &before);
    std::vector<char*> blocks(100000);
    for (int round = 0; round < 20; ++round) {
        for (int size : {48, 112, 200}) {
            for (char*& block : blocks) {
                block = new char[size];
                block[0] = 1;
            }
            for (char* block : blocks) delete[] block;
        }
    }
    rusage after{};
    getrusage(RUSAGE_SELF, &after);
    std::printf("faults %ld\ncpu_ms %.0f\n", after.ru_minflt - before.ru_minflt,
                cpu_ms(after) - cpu_ms(before));
}

// A program whose levels move from small blocks to large ones (a physics scene's bodies, then
// the next scene's buffers): what the small blocks' memory still holds at the second's peak.
void levels() {
    const long before = resident_kib();
    std::vector<char*> small(65536);
    for (char*& block : small) {
        block = new char[64];
        std::memset(block, 1, 64);
    }
    for (char* block : small) delete[] block;
    std::vector<char*> large(16);
    for (char*& block : large) {
        block = new char[256 * 1024];
        std::memset(block, 1, 256 * 1024);
    }
    std::printf("start_kib %ld\nlarge_kib %ld\n", before, resident_kib());
    for (char* block : large) delete[] block;
}

}  // namespace

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "free_all";
    if (std::strcmp(mode, "free_all") == 0) {
        free_all();
    } else if (std::strcmp(mode, "threads") == 0) {
        threads(argc > 2 ? std::atoi(argv[2]) : 500);
    } else if (std::strcmp(mode, "fill") == 0 && argc > 3) {
        fill(std::strtoull(argv[2], nullptr, 10), std::strtod(argv[3], nullptr));
    } else if (std::strcmp(mode, "phases") == 0) {
        phases();
    } else if (std::strcmp(mode, "levels") == 0) {
        levels();
    } else {
        std::fprintf(stderr,
                     "usage: %s free_all | threads N | fill SIZE BUDGET_BYTES | phases | levels\n",
                     argv[0]);
        return 2;
    }
    return 0;
}
