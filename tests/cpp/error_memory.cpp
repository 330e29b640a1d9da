// A double delete early in a long run: the error is printed, symbolized, when it happens, and
// the program goes on. Prints its resident memory before and after the error.
#include <cstdio>
#include <fstream>
#include <string>

static long resident_kib() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmRSS:", 0) == 0) {
            return std::stol(line.substr(6));
        }
    }
    return -1;
}

int main() {
    long before = resident_kib();
    int* volatile block = new int(1);
    delete block;
    delete block;
    long after = resident_kib();
    std::printf("resident before %ld KiB, after the error %ld KiB\n", before, after);
}
