// A plugin that leaks one block per call. Built several times: PLUGIN_NAME names the function
// that allocates, so each build symbolizes differently.
// No k15 header: plain new in a plugin goes to the executable's tracked operator new.

#include "keep.h"
#ifndef PLUGIN_NAME
#define PLUGIN_NAME plugin_allocates
#endif

[[gnu::noinline]] void PLUGIN_NAME(int size) { keep(new char[size]); }

extern "C" void plugin_entry(int size) { PLUGIN_NAME(size); }
