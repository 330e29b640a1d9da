// Leaks one block after many allocations; writes the report on demand when given a path.
#include <k15/memory.h>

#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    std::vector<std::string> churn;
    for (int i = 0; i < 1000; ++i) churn.emplace_back(64, 'x');
    int* leaked = K15_NEW int[5];
    leaked[0] = 1;
    if (argc > 1) std::printf("write_leak_report: %s\n", k15::memory::write_leak_report(argv[1]) ? "true" : "false");
    return 0;
}
