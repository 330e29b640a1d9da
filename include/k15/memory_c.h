/* k15-memory for C: route an engine's or a library's own allocator callbacks into the tracker
 * (each block in the leak log under the name given, with its call stack) and read the counters.
 * The C family itself (malloc, calloc, realloc, free, ...) needs nothing from this header: the
 * library replaces it process-wide (K15_MEMORY_OPTIONS=malloc=1 tracks it).
 *
 *   gcc -g -I include app.c target/release/libk15_memory.a -lstdc++ -lpthread -ldl -lm -o app
 *
 * -DK15_MEMORY_DISABLED turns it off: the functions fall back to aligned_alloc/malloc/free and
 * the library is not needed. */
#ifndef K15_MEMORY_C_H
#define K15_MEMORY_C_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Counters of the whole process; bytes are the sizes asked for, headers excluded. */
typedef struct k15_memory_stats {
    uint64_t live_blocks;
    uint64_t live_bytes;
    uint64_t peak_bytes;
    uint64_t total_allocations;
    uint64_t total_frees;
} k15_memory_stats;

/* A pool of sub-blocks an arena reports (k15_memory_pool_create): 0 is none. */
typedef uint32_t k15_memory_pool;

#if defined(K15_MEMORY_DISABLED)

static inline void* k15_memory_alloc(size_t size, size_t align, const char* name) {
    (void)name;
    if ((align & (align - 1)) != 0) return NULL; /* not a power of two, as with the library */
    if (align <= 16) return malloc(size);
    return aligned_alloc(align, (size + align - 1) / align * align);
}
static inline void k15_memory_free(void* ptr) { free(ptr); }
static inline k15_memory_stats k15_memory_get_stats(void) {
    k15_memory_stats none = {0, 0, 0, 0, 0};
    return none;
}
static inline int k15_memory_write_leak_report(const char* path) {
    (void)path;
    return 0;
}
static inline void k15_memory_running_on_stack(const void* lowest, size_t size) {
    (void)lowest;
    (void)size;
}
static inline uint32_t k15_memory_tag(const char* name) {
    (void)name;
    return 0;
}
static inline void k15_memory_scope_push_tag(uint32_t tag) { (void)tag; }
static inline void k15_memory_scope_push(const char* name) { (void)name; }
static inline void k15_memory_scope_pop(void) {}
static inline void k15_memory_frame_mark(void) {}
static inline k15_memory_pool k15_memory_pool_create(const char* name) {
    (void)name;
    return 0;
}
static inline void k15_memory_pool_alloc(k15_memory_pool pool, const void* ptr, size_t size) {
    (void)pool;
    (void)ptr;
    (void)size;
}
static inline void k15_memory_pool_free(k15_memory_pool pool, const void* ptr) {
    (void)pool;
    (void)ptr;
}
static inline void k15_memory_pool_reset(k15_memory_pool pool) { (void)pool; }

#else

/* A tracked block of `size` bytes aligned to `align` (0: 16; a power of two), or NULL when
 * memory is exhausted. `name` is the block's "language" in the report ("lua", "recast"): a
 * string that lives as long as the program (a literal), kept by address, not copied. */
void* k15_memory_alloc(size_t size, size_t align, const char* name);

/* Frees a block of k15_memory_alloc; NULL is ignored. A block of another family (malloc, new)
 * is a mismatched_delete, anything else a reported invalid_free or double_free (left alone). */
void k15_memory_free(void* ptr);

k15_memory_stats k15_memory_get_stats(void);

/* The text report to `path` and the JSON one to `path`.json now (NULL: the configured
 * log_path); 0 if a file could not be written. */
int k15_memory_write_leak_report(const char* path);

/* For a job system that runs jobs on fibers of its own: right after each switch, the whole
 * mapped stack the calling thread now runs on (NULL, 0: back on its own). See memory.h. */
void k15_memory_running_on_stack(const void* lowest, size_t size);

/* Tag scopes (see K15_MEMORY_SCOPE in memory.h): every block the calling thread allocates
 * until the matching pop carries the tag `name` ("Physics/Broadphase": '/' makes a hierarchy
 * whose parents include their children's figures); the innermost scope wins. The name is
 * copied the first time it is seen (up to 255 tags a process); opening a scope by name looks
 * it up (a hash of the name, no lock). Pushes and pops pair up on each thread. */
void k15_memory_scope_push(const char* name);
void k15_memory_scope_pop(void);

/* The tag's id for `name` (0: none; an empty part like "a//b", or the table full), for a scope
 * opened often: k15_memory_scope_push_tag(id) takes no look-up at all. */
uint32_t k15_memory_tag(const char* name);
void k15_memory_scope_push_tag(uint32_t tag);

/* Ends the frame under way: per frame and tag, the report gives allocations, frees and bytes
 * allocated (mean, most, and the frame of the most). Frame 1 runs from the first mark to the
 * second. Reads the counters (a few microseconds), allocates nothing. */
void k15_memory_frame_mark(void);

/* Pools, for an arena that carves its own memory into objects (a frame's temp allocator, a
 * free list): the arena tells the tracker of each object it hands out and takes back, and
 * each shows in the leak report and the tag figures as a block of its own, allocated with the
 * pool's name and the stack of its k15_memory_pool_alloc. See k15::memory::pool_alloc in
 * memory.h. `name` is copied; the handle is never 0 unless the pool could not be made. */
k15_memory_pool k15_memory_pool_create(const char* name);
/* The arena handed out `size` bytes at `ptr` (memory of its own: a block it allocated, or any). */
void k15_memory_pool_alloc(k15_memory_pool pool, const void* ptr, size_t size);
/* The arena took the sub-block at `ptr` back. */
void k15_memory_pool_free(k15_memory_pool pool, const void* ptr);
/* The arena took every sub-block back at once (rewound, or about to free its memory). */
void k15_memory_pool_reset(k15_memory_pool pool);

/* Links this header's users to the library (see memory.h): a link line with the library before
 * the sources fails with this name. */
extern const char k15_memory_link_error_put_libk15_memory_a_after_your_sources;
__attribute__((used)) static const char* const k15_memory_c_link_anchor =
    &k15_memory_link_error_put_libk15_memory_a_after_your_sources;

#endif

#ifdef __cplusplus
}
#endif

#endif /* K15_MEMORY_C_H */
