// A static library of tests/cmake/untouched: leaks one block on purpose.
int* make_leak() {
    return new int[9];  // ENGINE LEAK
}
