// The small-object workload of the memory benchmark: 5 million 16-byte and 1 million 200-byte
// blocks live at once (allocated interleaved, five small to one large, each written), then all
// freed. Prints the peak resident memory while they were live and the resident memory after
// the frees, in KiB, from /proc/self/status.
//
//   small_objects [small blocks] [large blocks]
#include <k15/memory.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

// The value of a "VmXXX:" line of /proc/self/status, in KiB.
long status_kib(const char* field) {
    std::FILE* status = std::fopen("/proc/self/status", "r");
    if (!status) return -1;
    char line[256];
    long kib = -1;
    const std::size_t length = std::strlen(field);
    while (std::fgets(line, sizeof line, status)) {
        if (std::strncmp(line, field, length) == 0) {
            kib = std::atol(line + length);
            break;
        }
    }
    std::fclose(status);
    return kib;
}

}  // namespace

int main(int argc, char** argv) {
    const long small = argc > 1 ? std::atol(argv[1]) : 5000000;
    const long large = argc > 2 ? std::atol(argv[2]) : 1000000;
    std::vector<char*> blocks;
    blocks.reserve(static_cast<std::size_t>(small + large));
    const long per_large = large > 0 ? small / large : small;
    long made_small = 0, made_large = 0;
    while (made_small < small || made_large < large) {
        for (long i = 0; i < per_large && made_small < small; ++i, ++made_small) {
            char* block = new char[16];
            block[0] = static_cast<char>(made_small);
            blocks.push_back(block);
        }
        if (made_large < large) {
            char* block = new char[200];
            block[0] = static_cast<char>(made_large++);
            blocks.push_back(block);
        }
    }
    const long live_kib = status_kib("VmRSS:");
    for (char* block : blocks) delete[] block;
    std::vector<char*>().swap(blocks);
    std::printf("live_rss_kib %ld\n", live_kib);
    std::printf("peak_rss_kib %ld\n", status_kib("VmHWM:"));
    std::printf("freed_rss_kib %ld\n", status_kib("VmRSS:"));
    return 0;
}
