/* A C program, no C++ at all: the C family tracked (malloc=1), and a Lua-style allocator
 * callback routed through k15_memory_alloc under its own name. */

#include <k15/memory_c.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Lua's lua_Alloc contract: nsize 0 frees, otherwise (re)allocates keeping the old bytes. */
static void* script_alloc(void* user_data, void* ptr, size_t old_size, size_t new_size) {
    (void)user_data;
    if (new_size == 0) {
        k15_memory_free(ptr);
        return NULL;
    }
    void* block = k15_memory_alloc(new_size, 0, "lua");
    if (block != NULL && ptr != NULL) {
        memcpy(block, ptr, old_size < new_size ? old_size : new_size);
        k15_memory_free(ptr);
    }
    return block;
}

static char* load_level_name(const char* name) {
    char* copy = malloc(strlen(name) + 1); /* LEAK malloc */
    strcpy(copy, name);
    return copy;
}

int main(void) {
    k15_memory_stats before = k15_memory_get_stats();
    void* table = script_alloc(NULL, NULL, 0, 24);
    table = script_alloc(NULL, table, 24, 96); /* LEAK lua */
    void* scratch = script_alloc(NULL, NULL, 0, 512);
    script_alloc(NULL, scratch, 512, 0);
    void* aligned = k15_memory_alloc(200, 64, "physics");
    void* bad_alignment = k15_memory_alloc(200, 48, "physics"); /* not a power of two: NULL */
    const int is_aligned = ((size_t)aligned % 64) == 0 && bad_alignment == NULL;
    k15_memory_free(aligned);
    char* name = load_level_name("level-1");
    k15_memory_running_on_stack(NULL, 0); /* a job system back on the thread's own stack */
    k15_memory_stats after = k15_memory_get_stats();
    /* stderr: unbuffered, so stdio keeps no buffer of its own live at exit */
    fprintf(stderr, "aligned: %s\n", is_aligned ? "yes" : "no");
    fprintf(stderr, "live: %llu blocks, %llu bytes\n", (unsigned long long)(after.live_blocks - before.live_blocks),
           (unsigned long long)(after.live_bytes - before.live_bytes));
    free(k15_memory_alloc(8, 0, "lua")); /* MISMATCH */
    fprintf(stderr, "%s %p\n", name, table);
    return 0;
}
