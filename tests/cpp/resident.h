// resident_kib(): the process's resident memory now, from /proc/self/statm (0 if unreadable).
#pragma once

#include <cstdio>

inline long resident_kib() {
    long pages_total = 0, pages_resident = 0;
    if (FILE* statm = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(statm, "%ld %ld", &pages_total, &pages_resident) != 2) pages_resident = 0;
        std::fclose(statm);
    }
    return pages_resident * 4;
}
