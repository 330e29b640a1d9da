// A plugin with a 1 MiB writable segment, loaded and unloaded again and again
// (`reload_while_reporting.cpp`): the segment is a root while loaded, and unmapped when not.
static char table[1 << 20] = {1};

extern "C" int plugin_touch(int i) {
    table[static_cast<unsigned>(i) % sizeof table] = static_cast<char>(i);
    return table[0];
}
