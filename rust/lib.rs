//! k15-memory: leak tracking for C++ `new`/`delete` and Rust allocations.
//!
//! The crate is built in layers; a module imports only from the layers below it (checked by
//! `shared/tools/layers.py`). Where a lower layer must call a higher one at run time, it calls
//! a function the higher one registered ([`tracker::errors::set_printer`],
//! [`tracker::fork::take_part`]), never an import. Bottom to top:
//!
//! 1. [`sys`]: the OS edge (mappings, raw syscalls, fault-safe reads, glibc's allocator).
//! 2. [`options`]: `K15_MEMORY_OPTIONS`, read once at first use, and the value types it owns
//!    (`LeakKind`, `UnwindMode`, `MAX_DEPTH`).
//! 3. [`stack`]: return addresses captured at allocation, the depot that stores each distinct
//!    stack once, and the history of mapped modules that stack ids date.
//! 4. [`tracker`]: the allocation path (the hot path): a header in front of each block, the
//!    small-block heap, per-thread live-list shards, counters, bad frees and heap damage kept
//!    as records, the C family's entry points, the thread registry, and the `fork` protocol.
//! 5. [`symbolize`]: addresses to functions, files and lines, only at report time.
//! 6. [`engine`]: the game-engine allocators (pool, stack, block, typed pools), over the tracker.
//! 7. [`report`]: the leak scan (direct, indirect, reachable), suppressions, the text and JSON
//!    reports, and the printing of memory errors as they happen.
//! 8. [`process`]: process-wide orchestration: start-up (the upper layers join the tracker)
//!    and the report at exit.
//! 9. [`ffi`] and `cpp/`: the C++ glue. Every global `operator new`/`delete` form and the
//!    `K15_NEW` placement forms call [`tracker::allocate`] / [`tracker::deallocate`] through two
//!    plain `extern "C"` entry points (the hot path); the rest of the API through the one cxx
//!    bridge. [`TrackedAlloc`] calls the tracker directly for Rust.

#![warn(clippy::undocumented_unsafe_blocks)]

pub mod engine;
pub mod ffi;
pub mod options;
pub mod process;
pub mod report;
mod rust_alloc;
pub mod stack;
pub mod symbolize;
pub mod sys;
pub mod tracker;

pub use rust_alloc::TrackedAlloc;
pub use tracker::tags::TagStats;
pub use tracker::Stats;

/// Counters of the whole process (live, peak and totals), as C++'s `k15::memory::stats()`.
pub fn stats() -> Stats {
    tracker::stats()
}

/// Every tag's figures now, as C++'s `k15::memory::tag_stats()`: in the order the tags were first
/// seen (a parent before its children), a parent's including its children's.
pub fn tag_stats() -> Vec<TagStats> {
    tracker::tag_stats()
}

/// Ends the frame under way, as C++'s `k15::memory::frame_mark()`: the report gives allocations,
/// frees and bytes per frame, per tag and for the process.
pub fn frame_mark() {
    tracker::frames::mark();
}

/// Opens a tag scope on the calling thread, as C++'s `K15_MEMORY_SCOPE(name)`: every block the
/// thread allocates until the guard drops (through [`TrackedAlloc`], C++'s `new`, `malloc`)
/// carries the tag `name` (`"Physics/Broadphase"`: `/` makes a hierarchy) for life.
pub fn scope(name: &str) -> Scope {
    tracker::guard::open_scope(tracker::tags::intern(name.as_bytes()));
    Scope {
        _on_this_thread: core::marker::PhantomData,
    }
}

/// An open tag scope ([`scope`]); closed when dropped, on the thread that opened it.
#[must_use = "the scope closes when this guard drops"]
pub struct Scope {
    /// Not `Send`: the scope belongs to the opening thread's stack of scopes.
    _on_this_thread: core::marker::PhantomData<*const ()>,
}

impl Drop for Scope {
    fn drop(&mut self) {
        tracker::guard::close_scope();
    }
}

pub use engine::client_pools::PoolHandle;

/// A pool for an arena's sub-blocks, as C++'s `k15::memory::pool_create(name)`: each sub-block the
/// arena reports ([`pool_alloc`]) is a block of its own in the leak report, allocated with `name`,
/// and in the tag figures. 0 if none could be made (called inside the tracker).
pub fn pool_create(name: &'static str) -> PoolHandle {
    engine::client_pools::create(name)
}

/// The arena of `pool` handed out `size` bytes at `ptr` (see C++'s `k15::memory::pool_alloc`);
/// the block's stack starts at the caller.
#[inline(never)]
pub fn pool_alloc(pool: PoolHandle, ptr: *const u8, size: usize) {
    engine::client_pools::alloc(pool, ptr as usize, size, stack::StartFrame::here());
}

/// The arena of `pool` took the sub-block at `ptr` back; anything but a live sub-block of the
/// pool is reported as a memory error.
#[inline(never)]
pub fn pool_free(pool: PoolHandle, ptr: *const u8) {
    engine::client_pools::free(pool, ptr as usize, stack::StartFrame::here());
}

/// The arena of `pool` took every sub-block back at once.
#[inline(never)]
pub fn pool_reset(pool: PoolHandle) {
    engine::client_pools::reset(pool, stack::StartFrame::here());
}

/// Checks every live block now and reports each problem found (see C++'s
/// `k15::memory::check_heap()`); returns how many there were.
#[inline(never)]
pub fn check_heap() -> usize {
    tracker::check_heap(stack::StartFrame::here())
}

/// Writes the text report to `path` and the JSON report to `path` + `.json` now (`None`: the
/// configured `log_path`/`json_path`); false if a file could not be written.
pub fn write_leak_report(path: Option<&str>) -> bool {
    report::write_now(path)
}
