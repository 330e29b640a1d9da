// Reports of many processes: the parent leaks one block and forks; the child leaks another and
// exits normally, printing its pid. `clean`: leaks nothing.
#include "keep.h"
#include <k15/memory.h>

#include <cstdio>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "clean") == 0) {
        delete keep(new int(3));
        return 0;
    }
    keep(new char[111]);
    std::fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
        keep(new char[222]);
        return 0;  // a normal exit: the child writes its own report
    }
    int status = 0;
    waitpid(child, &status, 0);
    std::printf("parent %d child %d\n", static_cast<int>(getpid()), static_cast<int>(child));
    return 0;
}
