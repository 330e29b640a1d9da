// A plugin that the engine of tests/cpp/shared_engine.cpp loads with dlopen, built without the
// tracker: it leaks one block on purpose and hands the engine a string to free.
#include <string>

namespace {
void* volatile sink;
}

extern "C" std::string* plugin_make() {
    sink = new int[3];  // PLUGIN LEAK
    return new std::string(100, 'p');
}
