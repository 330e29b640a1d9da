//! The one `#[cxx::bridge]`: what C++ (`cpp/`) calls in Rust, and the types both sides share.
//!
//! The public header `include/k15/memory.h` never includes the generated header; `cpp/api.cpp`
//! converts these types to the public ones.

use crate::stack::StartFrame;
use crate::tracker;
use core::ffi::c_char;

#[cxx::bridge(namespace = "k15::memory::detail")]
pub mod bridge {
    /// Counters of the whole process; bytes are user-requested sizes, headers excluded.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Stats {
        pub live_blocks: u64,
        pub live_bytes: u64,
        pub peak_bytes: u64,
        pub total_allocations: u64,
        pub total_frees: u64,
    }

    /// Which allocation function made a block; a free through another family is a mismatch.
    #[repr(u8)]
    #[derive(Debug)]
    pub enum BlockKind {
        New,
        NewArray,
        Rust,
        Bullet,
    }

    extern "Rust" {
        /// A tracked block, or null when memory is exhausted. `frame_address` is the frame of
        /// the calling `operator new`; the call stack starts at its caller.
        unsafe fn allocate(
            size: usize,
            align: usize,
            kind: BlockKind,
            file: *const c_char,
            line: i32,
            frame_address: usize,
        ) -> *mut u8;
        /// Frees a block from `allocate`; bad frees are reported, never crash.
        unsafe fn deallocate(ptr: *mut u8, kind: BlockKind, frame_address: usize);
        fn stats() -> Stats;
        /// Writes the text and JSON reports now; null means the configured `log_path`.
        unsafe fn write_leak_report(path: *const c_char) -> bool;
        /// Called once by the exit hook in `cpp/new_delete.cpp`, after every static destructor.
        fn report_at_exit();
    }
}

pub use bridge::{BlockKind, Stats};

/// # Safety
/// `file` is null or a NUL-terminated string that lives as long as the block (a `__FILE__`
/// literal); `frame_address` is the frame of a live function compiled with frame pointers.
unsafe fn allocate(
    size: usize,
    align: usize,
    kind: BlockKind,
    file: *const c_char,
    line: i32,
    frame_address: usize,
) -> *mut u8 {
    // SAFETY: forwarded from the caller's guarantee.
    let start = unsafe { StartFrame::caller_of(frame_address) };
    // SAFETY: `file` is as the caller guarantees.
    unsafe { tracker::allocate(size, align, kind, file, line.max(0) as u32, start) }
}

/// # Safety
/// `frame_address` is the frame of a live function compiled with frame pointers; `ptr` may be
/// anything (bad pointers are classified and reported).
unsafe fn deallocate(ptr: *mut u8, kind: BlockKind, frame_address: usize) {
    // SAFETY: forwarded from the caller's guarantee.
    let start = unsafe { StartFrame::caller_of(frame_address) };
    tracker::deallocate(ptr, kind, start)
}

fn stats() -> Stats {
    tracker::stats()
}

/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn write_leak_report(path: *const c_char) -> bool {
    // SAFETY: guaranteed by the caller.
    let path = unsafe { crate::sys::c_str(path) };
    crate::report::write_now(path)
}

fn report_at_exit() {
    crate::report::at_exit::run();
}
