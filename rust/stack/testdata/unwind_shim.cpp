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

// A loop that keeps a changing value in rbp (as -O2 code without frame pointers may) around a
// call through code without frame pointers: every capture below it sees another rbp in the
// frames up to the loop's, which saved the caller's rbp and restores it.
extern "C" __attribute__((noinline, optimize("no-omit-frame-pointer"))) void k15_shim_rbp_inner(
    frame_callback cb) {
    cb(__builtin_frame_address(0));
    asm volatile("" ::: "memory");
}

extern "C" __attribute__((noinline, optimize("no-omit-frame-pointer"))) void k15_shim_rbp_inner_b(
    frame_callback cb) {
    cb(__builtin_frame_address(0));
    asm volatile("" ::: "memory");
}

extern "C" __attribute__((noinline)) void k15_shim_rbp_deeper(frame_callback cb) {
    k15_shim_rbp_inner(cb);
    asm volatile("" ::: "memory");
}

// Saves rbp, sets it to a constant and calls k15_shim_rbp_inner: the step from its frame
// restores rbp from the saved copy, which holds whatever the caller had.
extern "C" void k15_shim_rbp_saver(frame_callback cb);

// paths 1: the call chain below changes with `i` (other return addresses, other depths);
// paths 2: through k15_shim_rbp_saver.
extern "C" __attribute__((noinline)) void k15_shim_rbp_middle(frame_callback cb, int i, int paths) {
    if (paths == 2) {
        k15_shim_rbp_saver(cb);
    } else if (paths == 0 || i % 3 == 0) {
        k15_shim_rbp_inner(cb);
    } else if (i % 3 == 1) {
        k15_shim_rbp_inner_b(cb);
    } else {
        k15_shim_rbp_deeper(cb);
    }
    asm volatile("" ::: "memory");
}

// void k15_shim_rbp_loop(frame_callback cb, int n, int paths): calls k15_shim_rbp_middle(cb, i,
// paths) for i = n .. 1 with rbp = 0x40 + 0x10001 * (n - i) around each call.
asm(R"(
    .text
    .globl k15_shim_rbp_saver
    .type k15_shim_rbp_saver, @function
k15_shim_rbp_saver:
    .cfi_startproc
    push %rbp
    .cfi_def_cfa_offset 16
    .cfi_offset %rbp, -16
    mov $0x1234, %ebp
    call k15_shim_rbp_inner@PLT
    pop %rbp
    .cfi_def_cfa_offset 8
    ret
    .cfi_endproc
    .size k15_shim_rbp_saver, .-k15_shim_rbp_saver

    .globl k15_shim_rbp_loop
    .type k15_shim_rbp_loop, @function
k15_shim_rbp_loop:
    .cfi_startproc
    push %rbp
    .cfi_def_cfa_offset 16
    .cfi_offset %rbp, -16
    push %rbx
    .cfi_def_cfa_offset 24
    .cfi_offset %rbx, -24
    push %r12
    .cfi_def_cfa_offset 32
    .cfi_offset %r12, -32
    push %r13
    .cfi_def_cfa_offset 40
    .cfi_offset %r13, -40
    sub $8, %rsp
    .cfi_def_cfa_offset 48
    mov %rdi, %rbx
    mov %esi, %r12d
    mov %edx, %r13d
    mov $0x40, %ebp
1:
    test %r12d, %r12d
    jz 2f
    mov %rbx, %rdi
    mov %r12d, %esi
    mov %r13d, %edx
    call k15_shim_rbp_middle@PLT
    add $0x10001, %rbp
    dec %r12d
    jmp 1b
2:
    add $8, %rsp
    .cfi_def_cfa_offset 40
    pop %r13
    .cfi_def_cfa_offset 32
    pop %r12
    .cfi_def_cfa_offset 24
    pop %rbx
    .cfi_def_cfa_offset 16
    pop %rbp
    .cfi_def_cfa_offset 8
    ret
    .cfi_endproc
    .size k15_shim_rbp_loop, .-k15_shim_rbp_loop
)");
