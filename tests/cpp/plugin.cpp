// A plugin that leaks one block per call. Built several times: PLUGIN_NAME names the function
// that allocates, so each build symbolizes differently.
// No k15 header: plain new in a plugin goes to the executable's tracked operator new.

#include "keep.h"
#ifndef PLUGIN_NAME
#define PLUGIN_NAME plugin_allocates
#endif

#ifdef PLUGIN_FRAME
// A frame of PLUGIN_FRAME bytes of locals: built at -O2, its unwind rule (the CFA's distance
// from rsp at the call) changes with the size while its code keeps its length and place.
[[gnu::noinline]] void PLUGIN_NAME(int size) {
    volatile char frame[PLUGIN_FRAME];
    frame[0] = 0;
    keep(new char[size + frame[0]]);
}
#else
[[gnu::noinline]] void PLUGIN_NAME(int size) { keep(new char[size]); }
#endif

extern "C" void plugin_entry(int size) { PLUGIN_NAME(size); }

// Allocates and frees: a call whose stack runs through the plugin and which leaves nothing.
extern "C" void plugin_churn(int size) { delete[] keep(new char[size]); }
