/* The realloc-growth benchmark's workload (benches/realloc_growth.rs): each thread grows one
 * block from `step` bytes to 4 MiB by `step` bytes a call (once to warm up, then timed), timing
 * the calls in three bands of the block's size, then times malloc/free pairs of one size from
 * each band.
 * Usage: realloc_growth THREADS STEP. Prints, per band: "band NAME realloc_ns X pair_ns Y". */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define LARGEST (4u << 20)
#define BANDS 3
static const char* const band_names[BANDS] = {"small(<4KiB)", "medium(4-128KiB)", "large(128KiB-4MiB)"};
static const size_t band_ends[BANDS] = {4u << 10, 128u << 10, LARGEST};
/* The size of the pairs each band's reallocs are compared with: one within the band. */
static const size_t pair_sizes[BANDS] = {256, 16u << 10, 1u << 20};
#define PAIRS 65536

static size_t step;

struct timing {
    double realloc_ns[BANDS];
    size_t reallocs[BANDS];
    double pair_ns[BANDS];
};

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* One block grown from `step` bytes to 4 MiB, its calls timed by band. */
static void grow_once(struct timing* timing) {
    char* block = malloc(step);
    size_t size = step;
    for (int band = 0; band < BANDS; band++) {
        double start = now_ns();
        size_t calls = 0;
        for (; size + step <= band_ends[band]; calls++) {
            size += step;
            block = realloc(block, size);
            block[size - 1] = (char)size; /* the program writes its new bytes */
        }
        timing->realloc_ns[band] = now_ns() - start;
        timing->reallocs[band] = calls;
    }
    free(block);
}

static void* grow(void* arg) {
    struct timing* timing = arg;
    grow_once(timing); /* a warm-up: the tracker's set-up, the heap's first spans */
    grow_once(timing);
    for (int band = 0; band < BANDS; band++) {
        double start = now_ns();
        for (int i = 0; i < PAIRS; i++) {
            char* volatile pair = malloc(pair_sizes[band]);
            pair[0] = 1;
            free(pair);
        }
        timing->pair_ns[band] = now_ns() - start;
    }
    return NULL;
}

int main(int argc, char** argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    step = argc > 2 ? (size_t)atoi(argv[2]) : 16;
    if (threads < 1 || threads > 64 || step == 0) return 2;
    pthread_t ids[64];
    struct timing timings[64] = {0};
    for (int t = 0; t < threads; t++) pthread_create(&ids[t], NULL, grow, &timings[t]);
    for (int t = 0; t < threads; t++) pthread_join(ids[t], NULL);
    for (int band = 0; band < BANDS; band++) {
        double realloc_ns = 0, pair_ns = 0;
        size_t reallocs = 0;
        for (int t = 0; t < threads; t++) {
            realloc_ns += timings[t].realloc_ns[band];
            reallocs += timings[t].reallocs[band];
            pair_ns += timings[t].pair_ns[band];
        }
        printf("band %s realloc_ns %.1f pair_ns %.1f\n", band_names[band], realloc_ns / reallocs,
               pair_ns / ((double)PAIRS * threads));
    }
    return 0;
}
