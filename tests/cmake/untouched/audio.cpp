// A shared library of tests/cmake/untouched: its blocks go through the executable's operators.
#include <string>

std::string* make_voice() { return new std::string(64, 'v'); }
