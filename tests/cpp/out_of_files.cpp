// Uses up its file descriptors, then exits with a reachable chain of blocks and a leaked one:
// the report still has to classify them (and, where the hard limit leaves room, be written to
// its file and symbolized).
//
//   out_of_files
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

namespace {

struct Node {
    void* next;
    char payload[24];
};

Node* kept;            // a root: the chain below it is reachable
std::uintptr_t lost;   // inverted: no root, the chain below it leaks

}  // namespace

int main() {
    kept = new Node{new char[48](), {}};                               // KEPT
    lost = ~reinterpret_cast<std::uintptr_t>(new Node{new char[64](), {}});  // LOST
    int opened = 0;
    while (open("/dev/null", O_RDONLY) >= 0) opened++;
    std::printf("opened %s\n", opened > 0 ? "until refused" : "nothing");
    return 0;
}
