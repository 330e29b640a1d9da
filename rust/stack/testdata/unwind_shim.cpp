// Test-only shim for rust/stack/tests.rs: call back into Rust through code without frame
// pointers (this file is built with -O2 -fomit-frame-pointer) and through libstdc++.so.
#include <algorithm>
#include <ostream>
#include <streambuf>
#include <thread>

using callback = void (*)();

// std::sort instantiated here; the comparator calls `cb` on its first call.
extern "C" void k15_shim_sort(int* v, int n, callback cb) {
    bool called = false;
    std::sort(v, v + n, [&](int a, int b) {
        if (!called) {
            called = true;
            cb();
        }
        return a < b;
    });
    asm volatile("" ::: "memory");  // keep the frame: no tail call
}

// std::ostream::write (compiled into libstdc++.so) -> virtual xsputn below. xsputn keeps a
// frame pointer and passes its frame address on, as k15's operator new does, so the capture
// starts in libstdc++.so, which has no frame pointers.
using frame_callback = void (*)(void* frame_address);

namespace {
struct callback_buf : std::streambuf {
    frame_callback cb;
    explicit callback_buf(frame_callback f) : cb(f) {}
    __attribute__((noinline, optimize("no-omit-frame-pointer"))) std::streamsize xsputn(
        const char*, std::streamsize n) override {
        cb(__builtin_frame_address(0));
        asm volatile("" ::: "memory");
        return n;
    }
};
}  // namespace

extern "C" void k15_shim_ostream_write(frame_callback cb) {
    callback_buf buf(cb);
    std::ostream os(&buf);
    os.write("x", 1);
    asm volatile("" ::: "memory");
}

// A std::thread: its entry point is execute_native_thread_routine in libstdc++.so.
extern "C" void k15_shim_std_thread(callback cb) {
    std::thread t([cb] { cb(); });
    t.join();
}
