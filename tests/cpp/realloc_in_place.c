/* realloc growing and shrinking blocks in place and by moving: contents, counters, guards,
 * stacks and bad frees after an in-place resize (tests/realloc.rs). */
#define _POSIX_C_SOURCE 200809L
#include <k15/memory_c.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static unsigned char pattern(size_t i) { return (unsigned char)(i * 31u + 7u); }

/* The one place each block is allocated and resized, so that the stacks name them. */
__attribute__((noinline)) static void* allocate_block(size_t size) { return malloc(size); }
__attribute__((noinline)) static void* resize_block(void* p, size_t size) { return realloc(p, size); }

/* Every size up to 600 bytes (each heap class of 16-byte steps and the first of the coarse ones),
 * then steps of 3% up to 2 MiB (every coarser class, the largest heap block, mapped blocks),
 * grown and then shrunk back: the bytes kept are checked at each step, and the counters. */
static int contents(void) {
    size_t sizes[1200], n = 0;
    for (size_t s = 1; s <= 600; s++) sizes[n++] = s;
    for (size_t s = 600; s <= (2u << 20); s += s / 33) sizes[n++] = s;
    k15_memory_stats before = k15_memory_get_stats();
    unsigned char* p = allocate_block(sizes[0]);
    p[0] = pattern(0);
    size_t size = sizes[0], in_place = 0, moved = 0, calls = 0, bad = 0, bad_stats = 0;
    for (size_t step = 1; step < 2 * n - 1; step++) {
        size_t next = step < n ? sizes[step] : sizes[2 * n - 2 - step];
        unsigned char* q = resize_block(p, next);
        calls++;
        if (q == p) in_place++; else moved++;
        size_t kept = size < next ? size : next;
        for (size_t i = 0; i < kept; i++) bad += q[i] != pattern(i);
        for (size_t i = kept; i < next; i++) q[i] = pattern(i);
        p = q;
        size = next;
        k15_memory_stats now = k15_memory_get_stats();
        bad_stats += now.live_bytes - before.live_bytes != size ||
                     now.live_blocks - before.live_blocks != 1 ||
                     now.total_allocations - before.total_allocations != calls + 1 ||
                     now.total_frees - before.total_frees != calls;
    }
    free(p);
    k15_memory_stats after = k15_memory_get_stats();
    printf("steps %zu, in place %zu, moved %zu\n", calls, in_place, moved);
    printf("bytes changed: %zu\nstats wrong: %zu\n", bad, bad_stats);
    printf("live after: %llu bytes\n", (unsigned long long)(after.live_bytes - before.live_bytes));
    return 0;
}

/* A write past the new end of a block grown in place (heap) and grown by remapping (mapped). */
static int overrun(void) {
    char* small = allocate_block(100);
    char* grown = resize_block(small, 104);
    printf("heap in place: %s\n", grown == small ? "yes" : "no");
    grown[104] = 'X'; /* OVERRUN heap */
    free(grown);
    char* large = allocate_block(300000);
    large = resize_block(large, 400000);
    large[400000] = 'X'; /* OVERRUN mapped */
    free(large);
    return 0;
}

/* Blocks left live after an in-place resize: the leak names the realloc. */
static int leak(void) {
    char* small = allocate_block(100);
    char* grown = resize_block(small, 110);
    printf("heap in place: %s\n", grown == small ? "yes" : "no");
    char* large = resize_block(allocate_block(300000), 500000);
    printf("leaking %p %p\n", (void*)grown, (void*)large);
    return 0;
}

/* A second free, and a free by another family, of blocks resized in place. */
static int bad_frees(void) {
    char* small = allocate_block(100);
    char* grown = resize_block(small, 104);
    printf("heap in place: %s\n", grown == small ? "yes" : "no");
    free(grown);
    free(grown); /* DOUBLE FREE */
    char* other = resize_block(allocate_block(100), 90);
    k15_memory_free(other); /* MISMATCH */
    return 0;
}

/* 65,536 reallocs growing one block by 16 bytes: quadratic when each one copies. */
static int growth(void) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char* p = NULL;
    for (size_t i = 1; i <= 65536; i++) {
        p = realloc(p, i * 16);
        p[i * 16 - 1] = 1;
    }
    free(p);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("seconds %.3f\n", (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}

/* A block grown by 16 bytes a call through the heap's sizes: it moves once per doubling (to a
 * class with room to grow), still as large as asked for, its guard right behind that size. */
static int steps(void) {
    size_t moves = 0, size = 16;
    unsigned char* p = allocate_block(size);
    for (; size + 16 <= 100000; size += 16) {
        unsigned char* q = resize_block(p, size + 16);
        moves += q != p;
        p = q;
    }
    printf("moves %zu\n", moves);
    printf("usable %zu of %zu\n", malloc_usable_size(p), size);
    p[size] = 'X'; /* OVERRUN steps */
    free(p);
    return 0;
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "";
    int status = !strcmp(mode, "contents")    ? contents()
                 : !strcmp(mode, "overrun")   ? overrun()
                 : !strcmp(mode, "leak")      ? leak()
                 : !strcmp(mode, "bad_frees") ? bad_frees()
                 : !strcmp(mode, "growth")    ? growth()
                 : !strcmp(mode, "steps")     ? steps()
                                              : 2;
    printf("survived\n");
    return status;
}
