//! The one `#[cxx::bridge]`: what C++ (`cpp/`) calls in Rust, and the types both sides share.
//!
//! The public header `include/k15/memory.h` never includes the generated header; `cpp/api.cpp`
//! converts these types to the public ones.

use crate::engine::{self, AllocatorKind, ClassSpec, PoolConfig, StackMarker, TrackedAllocator};
use crate::stack::StartFrame;
use crate::tracker::guard::{self, Inside};
use crate::tracker::tags;
use crate::tracker::{self, BlockKind};
use core::ffi::{c_char, CStr};

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

    /// One tag's figures (`k15::memory::TagStats`), its children's included.
    pub struct TagStats {
        pub name: String,
        pub live_blocks: u64,
        pub live_bytes: u64,
        pub peak_bytes: u64,
        pub total_allocations: u64,
        pub total_bytes: u64,
        pub budget_bytes: u64,
    }

    /// Which allocation function made a block (`tracker::BlockKind`, mapped by `core_kind`).
    #[repr(u8)]
    #[derive(Debug)]
    pub enum BlockKind {
        New,
        NewArray,
        Rust,
        Bullet,
        Malloc,
        Calloc,
        Realloc,
        AlignedAlloc,
        PosixMemalign,
        Memalign,
        Valloc,
        Pvalloc,
        Named,
    }

    /// An engine allocator's counters (`k15::memory::AllocatorStats`); bytes as requested.
    pub struct EngineStats {
        pub name: *const c_char,
        pub capacity: u64,
        pub live_blocks: u64,
        pub live_bytes: u64,
        pub peak_bytes: u64,
        pub allocations: u64,
        pub frees: u64,
        pub failures: u64,
    }

    /// One size class of a pool: `block_count` blocks of `block_size` bytes.
    pub struct EngineClassSpec {
        pub block_size: usize,
        pub block_count: usize,
    }

    /// A stack allocator's position (`StackMarker`).
    pub struct EngineMarker {
        pub allocator: u32,
        pub top_allocation: u32,
        pub top_serial: u32,
    }

    /// `allocator_of`: `kind` 0 when no engine allocator holds the pointer, then 1 pool, 2 stack, 3 block,
    /// 4 typed pool; `element_type` null unless a typed pool.
    pub struct EngineIdentity {
        pub name: *const c_char,
        pub kind: u8,
        pub element_type: *const c_char,
    }

    /// Blocks one allocator still holds from after a checkpoint.
    pub struct EngineLeaks {
        pub name: *const c_char,
        pub blocks: u64,
        pub bytes: u64,
    }

    /// `memstats`: events since the last reset, and what is live.
    pub struct EngineMemStats {
        pub allocations: u64,
        pub frees: u64,
        pub failures: u64,
        pub live_blocks: u64,
        pub live_bytes: u64,
    }

    extern "Rust" {
        /// An engine allocator behind the tracker (`include/k15/engine.h` holds one per object).
        type TrackedAllocator;

        /// The constructors: names are NUL-terminated and copied. An empty class table means
        /// the default one. Errors (bad configuration, no memory) throw.
        unsafe fn engine_new_pool(
            name: *const c_char,
            classes: &[EngineClassSpec],
        ) -> Result<Box<TrackedAllocator>>;
        unsafe fn engine_new_stack(
            name: *const c_char,
            capacity: usize,
        ) -> Result<Box<TrackedAllocator>>;
        unsafe fn engine_new_block(
            name: *const c_char,
            capacity: usize,
        ) -> Result<Box<TrackedAllocator>>;
        unsafe fn engine_new_typed_pool(
            name: *const c_char,
            element_type: *const c_char,
            size: usize,
            align: usize,
            first_batch: usize,
        ) -> Result<Box<TrackedAllocator>>;
        /// A block, or null when the allocator cannot serve it; `frame_address` as for `allocate`.
        unsafe fn engine_allocate(
            allocator: &TrackedAllocator,
            size: usize,
            align: usize,
            frame_address: usize,
        ) -> *mut u8;
        /// Bad frees are reported and change nothing.
        unsafe fn engine_deallocate(
            allocator: &TrackedAllocator,
            ptr: *mut u8,
            frame_address: usize,
        );
        fn engine_holds_live_object(allocator: &TrackedAllocator, address: usize) -> bool;
        fn engine_stats(allocator: &TrackedAllocator) -> EngineStats;
        /// The stack allocator's top (zeros for other kinds, which `engine_rewind` refuses).
        fn engine_marker(allocator: &TrackedAllocator) -> EngineMarker;
        unsafe fn engine_rewind(
            allocator: &TrackedAllocator,
            marker: EngineMarker,
            frame_address: usize,
        );
        /// By address, so no pointer needs to be valid.
        fn engine_allocator_of(address: usize) -> EngineIdentity;
        fn engine_checkpoint() -> u32;
        fn engine_leaks_since(checkpoint: u32) -> Vec<EngineLeaks>;
        fn engine_memstats(reset: bool) -> EngineMemStats;

        fn stats() -> Stats;
        fn tag_stats() -> Vec<TagStats>;
        /// `check_heap()`: the number of problems found, each reported; `frame_address` is the
        /// frame of the C++ `check_heap`, whose caller the reported stack starts at.
        unsafe fn check_heap(frame_address: usize) -> usize;
        /// Writes the text and JSON reports now; null means the configured `log_path`.
        unsafe fn write_leak_report(path: *const c_char) -> bool;
        /// Called once by the constructor in `cpp/new_delete.cpp`: the upper layers join the
        /// tracker (see `process::start_up`).
        fn start_up();
        /// Called once by the exit hook in `cpp/new_delete.cpp`, after every static destructor.
        fn report_at_exit();
        /// `ignore_leak(ptr)`: any pointer; only a live block's is recorded.
        unsafe fn ignore_leak(ptr: *mut u8);
        /// `running_on_stack(lowest, size)`: the stack the calling thread runs on now.
        fn running_on_stack(lowest: usize, size: usize);
        /// `ScopedLeakIgnore`: the token `begin` returns is given to `end`.
        fn begin_leak_ignore() -> usize;
        fn end_leak_ignore(token: usize);
        /// After a `dlopen` or `dlclose` (`cpp/modules.cpp`): the module set may have changed.
        fn modules_changed();
        /// Around the loader call of a `dlopen` or `dlclose` (`cpp/modules.cpp`), which a
        /// `fork` waits for (see `tracker::fork`).
        fn loader_call_begins();
        fn loader_call_ends();
        /// The program's `mmap`, `munmap` and `mremap` (`cpp/mappings.cpp`), made and recorded:
        /// its anonymous mappings are leak roots. The system call's result, errno as it left it.
        fn program_mmap(
            address: usize,
            len: usize,
            protection: i32,
            flags: i32,
            fd: i32,
            offset: i64,
        ) -> isize;
        fn program_munmap(address: usize, len: usize) -> isize;
        fn program_mremap(
            old_address: usize,
            old_len: usize,
            new_len: usize,
            flags: i32,
            new_address: usize,
        ) -> isize;
        /// A thread the program started (`cpp/threads.cpp`) begins and ends its start routine:
        /// it is in the record of threads that reports scan meanwhile.
        fn thread_starts();
        fn thread_ends();
    }
}

use crate::report::mappings::{
    map as program_mmap, remap as program_mremap, unmap as program_munmap,
};
use bridge::{
    EngineClassSpec, EngineIdentity, EngineLeaks, EngineMarker, EngineMemStats, EngineStats,
};
use bridge::{Stats, TagStats};

// Every `new` and `delete` (`cpp/new_delete.cpp`, `cpp/bullet_hooks.cpp`) calls the two
// functions below directly (and `cpp/take_over.cpp` the third), declared in `cpp/entry.h`, not
// through the bridge: cxx's C++ wrapper and Rust shim add two calls to each, measured at about
// 8% of a tracked new/delete pair. Everything else crosses through the bridge, but for the C
// family's entry points (`rust/tracker/malloc.rs`).

/// The tracker's kind for the bridge's, by name. The values are the same (checked below: the C
/// family's entry point takes the tracker's kind as C++ passes it), so the match compiles to
/// nothing on the hot path.
///
/// # Safety
/// `kind` is one of the bridge's enumerators: `cpp/` passes only those, never a cast integer.
#[inline(always)]
unsafe fn core_kind(kind: bridge::BlockKind) -> BlockKind {
    match kind {
        bridge::BlockKind::New => BlockKind::New,
        bridge::BlockKind::NewArray => BlockKind::NewArray,
        bridge::BlockKind::Rust => BlockKind::Rust,
        bridge::BlockKind::Bullet => BlockKind::Bullet,
        bridge::BlockKind::Malloc => BlockKind::Malloc,
        bridge::BlockKind::Calloc => BlockKind::Calloc,
        bridge::BlockKind::Realloc => BlockKind::Realloc,
        bridge::BlockKind::AlignedAlloc => BlockKind::AlignedAlloc,
        bridge::BlockKind::PosixMemalign => BlockKind::PosixMemalign,
        bridge::BlockKind::Memalign => BlockKind::Memalign,
        bridge::BlockKind::Valloc => BlockKind::Valloc,
        bridge::BlockKind::Pvalloc => BlockKind::Pvalloc,
        bridge::BlockKind::Named => BlockKind::Named,
        // SAFETY: guaranteed by the caller.
        _ => unsafe { core::hint::unreachable_unchecked() },
    }
}

// The same value for each kind on both sides: `k15_memory_c_allocate` receives the bridge's
// kind as the tracker's, unmapped.
const _: () = {
    macro_rules! same_values {
        ($($kind:ident),*) => {
            $(assert!(bridge::BlockKind::$kind.repr == BlockKind::$kind as u8);)*
        };
    }
    same_values!(
        New,
        NewArray,
        Rust,
        Bullet,
        Malloc,
        Calloc,
        Realloc,
        AlignedAlloc,
        PosixMemalign,
        Memalign,
        Valloc,
        Pvalloc,
        Named
    );
};

/// A tracked block, or null when memory is exhausted. `frame_address` is the frame of the
/// calling `operator new`; the call stack starts at its caller.
///
/// # Safety
/// `kind` is one of `BlockKind`'s enumerators; `file` is null or a NUL-terminated string that
/// lives as long as the block (a `__FILE__` literal); `frame_address` is the frame of a live
/// function compiled with frame pointers.
#[no_mangle]
pub unsafe extern "C" fn k15_memory_allocate(
    size: usize,
    align: usize,
    kind: bridge::BlockKind,
    file: *const c_char,
    line: i32,
    frame_address: usize,
) -> *mut u8 {
    // SAFETY: as the caller guarantees.
    unsafe { allocate(size, align, kind, file, line, frame_address) }
}

/// The body of both allocating entries.
///
/// # Safety
/// As [`k15_memory_allocate`].
#[inline(always)]
unsafe fn allocate(
    size: usize,
    align: usize,
    kind: bridge::BlockKind,
    file: *const c_char,
    line: i32,
    frame_address: usize,
) -> *mut u8 {
    // SAFETY: forwarded from the caller's guarantee.
    let start = move || unsafe { StartFrame::caller_of(frame_address) };
    // SAFETY: `kind` and `file` are as the caller guarantees.
    unsafe {
        let kind = core_kind(kind);
        // A negative line (never a `__LINE__`) becomes one past the site table's lines: kept
        // without it, and checked only where a file is given.
        tracker::allocate(size, align, kind, file, line as u32, start)
    }
}

/// [`k15_memory_allocate`] with default alignment and no file: the entry of `operator new` and
/// `new[]`, three arguments to pass instead of six, and the alignment's tests compiled away.
///
/// # Safety
/// As [`k15_memory_allocate`].
#[no_mangle]
pub unsafe extern "C" fn k15_memory_new(
    size: usize,
    kind: bridge::BlockKind,
    frame_address: usize,
) -> *mut u8 {
    // SAFETY: as the caller guarantees; no file.
    unsafe { allocate(size, 0, kind, core::ptr::null(), 0, frame_address) }
}

/// Reports an aligned allocation refused for its alignment (`invalid_alignment`); the C++
/// caller then fails it as libstdc++ or glibc does.
///
/// # Safety
/// As [`k15_memory_allocate`].
#[no_mangle]
#[cold]
pub unsafe extern "C" fn k15_memory_invalid_alignment(
    size: usize,
    align: usize,
    kind: bridge::BlockKind,
    file: *const c_char,
    line: i32,
    frame_address: usize,
) {
    // SAFETY: forwarded from the caller's guarantee.
    let start = move || unsafe { StartFrame::caller_of(frame_address) };
    // SAFETY: `file` is as the caller guarantees.
    unsafe {
        tracker::report_invalid_alignment(size, align, core_kind(kind), file, line as u32, start)
    }
}

/// Frees a block from [`k15_memory_allocate`]; bad frees are reported, never crash.
///
/// # Safety
/// `kind` is one of `BlockKind`'s enumerators; `frame_address` is the frame of a live function
/// compiled with frame pointers; `ptr` may be anything (bad pointers are classified and
/// reported).
#[no_mangle]
pub unsafe extern "C" fn k15_memory_deallocate(
    ptr: *mut u8,
    kind: bridge::BlockKind,
    frame_address: usize,
) {
    // SAFETY: forwarded from the caller's guarantee.
    let start = move || unsafe { StartFrame::caller_of(frame_address) };
    // SAFETY: as the caller guarantees.
    let kind = unsafe { core_kind(kind) };
    tracker::deallocate(ptr, kind, start)
}

/// Called once by `cpp/take_over.cpp` when this tracker has taken `operator new` and `delete`
/// over after the process started: blocks that `original_delete`'s allocator served before are
/// freed by it.
#[no_mangle]
pub extern "C" fn k15_memory_pass_foreign_blocks_to(
    original_delete: unsafe extern "C" fn(*mut u8),
) {
    tracker::pass_foreign_blocks_to(original_delete)
}

/// `pool_create(name)` (`memory.h`, `memory_c.h`): a pool for an arena's sub-blocks
/// (`engine::client_pools`), named `name` (copied; null: "pool"); 0 if none could be made.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn k15_memory_pool_create_named(name: *const c_char) -> u32 {
    let name = if name.is_null() {
        "pool"
    } else {
        let _inside = Inside::enter(); // the name's copy is the tracker's own memory
                                       // SAFETY: as the caller guarantees.
        engine::static_name(unsafe { CStr::from_ptr(name) })
    };
    engine::client_pools::create(name)
}

/// `pool_alloc(pool, ptr, size)`: the arena made a sub-block; its stack starts at the caller of
/// the function whose frame is `frame_address`.
///
/// # Safety
/// `frame_address` is the frame of a live function compiled with frame pointers.
#[no_mangle]
pub unsafe extern "C" fn k15_memory_pool_alloc_from(
    pool: u32,
    ptr: *const u8,
    size: usize,
    frame_address: usize,
) {
    // SAFETY: as the caller guarantees.
    let start = unsafe { StartFrame::caller_of(frame_address) };
    engine::client_pools::alloc(pool, ptr as usize, size, start);
}

/// `pool_free(pool, ptr)`, as [`k15_memory_pool_alloc_from`].
///
/// # Safety
/// As [`k15_memory_pool_alloc_from`].
#[no_mangle]
pub unsafe extern "C" fn k15_memory_pool_free_from(
    pool: u32,
    ptr: *const u8,
    frame_address: usize,
) {
    // SAFETY: as the caller guarantees.
    let start = unsafe { StartFrame::caller_of(frame_address) };
    engine::client_pools::free(pool, ptr as usize, start);
}

/// `pool_reset(pool)`, as [`k15_memory_pool_alloc_from`].
///
/// # Safety
/// As [`k15_memory_pool_alloc_from`].
#[no_mangle]
pub unsafe extern "C" fn k15_memory_pool_reset_from(pool: u32, frame_address: usize) {
    // SAFETY: as the caller guarantees.
    let start = unsafe { StartFrame::caller_of(frame_address) };
    engine::client_pools::reset(pool, start);
}

fn tag_stats() -> Vec<TagStats> {
    tracker::tag_stats()
        .into_iter()
        .map(|t| TagStats {
            name: t.name,
            live_blocks: t.live_blocks,
            live_bytes: t.live_bytes,
            peak_bytes: t.peak_bytes,
            total_allocations: t.total_allocations,
            total_bytes: t.total_bytes,
            budget_bytes: t.budget_bytes,
        })
        .collect()
}

/// `k15_memory_tag(name)` (`memory_c.h`): the tag's id, interned now if new; 0 for none.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn k15_memory_tag(name: *const c_char) -> u32 {
    if name.is_null() {
        return 0;
    }
    // SAFETY: as the caller guarantees.
    let name = unsafe { CStr::from_ptr(name) };
    u32::from(tags::intern(name.to_bytes()))
}

/// `k15_memory_scope_push_tag(tag)`: opens a scope of a tag from `k15_memory_tag` (any other
/// number opens an untagged scope, so that pushes and pops still pair up).
#[no_mangle]
pub extern "C" fn k15_memory_scope_push_tag(tag: u32) {
    guard::open_scope(tags::known(tag));
}

/// `k15_memory_scope_push(name)`: a scope of the tag `name` (see [`k15_memory_tag`]).
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn k15_memory_scope_push(name: *const c_char) {
    // SAFETY: as the caller guarantees.
    k15_memory_scope_push_tag(unsafe { k15_memory_tag(name) });
}

/// `k15_memory_frame_mark()`: ends the frame under way (`tracker::frames`).
#[no_mangle]
pub extern "C" fn k15_memory_frame_mark() {
    tracker::frames::mark();
}

/// `k15_memory_scope_pop()`: closes the thread's innermost scope.
#[no_mangle]
pub extern "C" fn k15_memory_scope_pop() {
    guard::close_scope();
}

fn stats() -> Stats {
    let tracker::Stats {
        live_blocks,
        live_bytes,
        peak_bytes,
        total_allocations,
        total_frees,
    } = tracker::stats();
    Stats {
        live_blocks,
        live_bytes,
        peak_bytes,
        total_allocations,
        total_frees,
    }
}

/// # Safety
/// `frame_address` is the frame of a live function compiled with frame pointers.
unsafe fn check_heap(frame_address: usize) -> usize {
    // SAFETY: forwarded from the caller's guarantee.
    tracker::check_heap(unsafe { StartFrame::caller_of(frame_address) })
}

/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn write_leak_report(path: *const c_char) -> bool {
    // SAFETY: guaranteed by the caller.
    let path = unsafe { crate::sys::c_str(path) };
    crate::report::write_now(path)
}

fn start_up() {
    crate::process::start_up();
}

fn report_at_exit() {
    crate::process::at_exit::run();
}

/// # Safety
/// None beyond cxx's: `ptr` may be anything; it is only looked up, never dereferenced blindly.
unsafe fn ignore_leak(ptr: *mut u8) {
    crate::report::ignore::ignore_leak(ptr);
}

fn running_on_stack(lowest: usize, size: usize) {
    crate::stack::running_on_stack(lowest, size);
}

fn modules_changed() {
    // The module lists are our own memory.
    let _inside = tracker::guard::Inside::enter();
    // Stacks still in rings are interned first: their ids must tell they came before.
    tracker::pending_stacks::settle_all();
    crate::stack::modules_changed();
}

fn thread_starts() {
    tracker::guard::record_thread();
}

fn thread_ends() {
    crate::tracker::threads::unregister();
}

fn loader_call_begins() {
    tracker::fork::loader_call_begins();
}

fn loader_call_ends() {
    tracker::fork::loader_call_ends();
}

fn begin_leak_ignore() -> usize {
    crate::report::ignore::begin_scope()
}

fn end_leak_ignore(token: usize) {
    crate::report::ignore::end_scope(token);
}

/// # Safety
/// `name` is null or a NUL-terminated string.
unsafe fn engine_name(name: *const c_char) -> &'static str {
    // SAFETY: guaranteed by the caller.
    match unsafe { name.as_ref() } {
        // SAFETY: non-null and NUL-terminated, as the caller guarantees.
        Some(_) => engine::static_name(unsafe { CStr::from_ptr(name) }),
        None => "unnamed",
    }
}

fn engine_created(
    made: Result<TrackedAllocator, engine::CreateError>,
) -> Result<Box<TrackedAllocator>, engine::CreateError> {
    made.map(Box::new)
}

/// # Safety
/// `name` is null or a NUL-terminated string.
unsafe fn engine_new_pool(
    name: *const c_char,
    classes: &[EngineClassSpec],
) -> Result<Box<TrackedAllocator>, engine::CreateError> {
    let _inside = Inside::enter(); // the allocator's own memory
    let specs: Vec<ClassSpec> = classes
        .iter()
        .map(|class| ClassSpec {
            block_size: class.block_size,
            block_count: class.block_count,
        })
        .collect();
    let config = match specs.is_empty() {
        true => PoolConfig::default(),
        false => PoolConfig { classes: &specs },
    };
    // SAFETY: as the caller guarantees.
    engine_created(TrackedAllocator::pool(unsafe { engine_name(name) }, config))
}

/// # Safety
/// `name` is null or a NUL-terminated string.
unsafe fn engine_new_stack(
    name: *const c_char,
    capacity: usize,
) -> Result<Box<TrackedAllocator>, engine::CreateError> {
    let _inside = Inside::enter(); // the allocator's own memory
                                   // SAFETY: as the caller guarantees.
    engine_created(TrackedAllocator::stack(
        unsafe { engine_name(name) },
        capacity,
    ))
}

/// # Safety
/// `name` is null or a NUL-terminated string.
unsafe fn engine_new_block(
    name: *const c_char,
    capacity: usize,
) -> Result<Box<TrackedAllocator>, engine::CreateError> {
    let _inside = Inside::enter(); // the allocator's own memory
                                   // SAFETY: as the caller guarantees.
    engine_created(TrackedAllocator::block(
        unsafe { engine_name(name) },
        capacity,
    ))
}

/// # Safety
/// `name` and `element_type` are null or NUL-terminated strings.
unsafe fn engine_new_typed_pool(
    name: *const c_char,
    element_type: *const c_char,
    size: usize,
    align: usize,
    first_batch: usize,
) -> Result<Box<TrackedAllocator>, engine::CreateError> {
    let _inside = Inside::enter(); // the allocator's own memory
                                   // SAFETY: as the caller guarantees.
    let (name, element_type) = unsafe { (engine_name(name), engine_name(element_type)) };
    engine_created(TrackedAllocator::objects(
        name,
        element_type,
        size,
        align,
        first_batch,
    ))
}

/// # Safety
/// `frame_address` is the frame of a live function compiled with frame pointers.
unsafe fn engine_allocate(
    allocator: &TrackedAllocator,
    size: usize,
    align: usize,
    frame_address: usize,
) -> *mut u8 {
    // SAFETY: forwarded from the caller's guarantee.
    let start = unsafe { StartFrame::caller_of(frame_address) };
    allocator
        .alloc(size, align, start)
        .map_or(core::ptr::null_mut(), |block| block.as_ptr())
}

/// # Safety
/// As for [`engine_allocate`]; `ptr` may be anything (bad pointers are reported).
unsafe fn engine_deallocate(allocator: &TrackedAllocator, ptr: *mut u8, frame_address: usize) {
    // SAFETY: forwarded from the caller's guarantee.
    let start = unsafe { StartFrame::caller_of(frame_address) };
    let _ = allocator.free(ptr, start);
}

fn engine_holds_live_object(allocator: &TrackedAllocator, address: usize) -> bool {
    allocator.holds_live_object(address as *const u8)
}

fn engine_stats(allocator: &TrackedAllocator) -> EngineStats {
    let _inside = Inside::enter(); // the tracker's own memory
    let stats = allocator.stats();
    EngineStats {
        name: engine::c_name(stats.name).as_ptr(),
        capacity: stats.capacity,
        live_blocks: stats.live_blocks,
        live_bytes: stats.live_bytes,
        peak_bytes: stats.peak_bytes,
        allocations: stats.allocations,
        frees: stats.frees,
        failures: stats.failures,
    }
}

fn engine_marker(allocator: &TrackedAllocator) -> EngineMarker {
    let marker = allocator.marker().unwrap_or(StackMarker {
        allocator: 0,
        top_allocation: 0,
        top_serial: 0,
    });
    EngineMarker {
        allocator: marker.allocator,
        top_allocation: marker.top_allocation,
        top_serial: marker.top_serial,
    }
}

/// # Safety
/// As for [`engine_allocate`].
unsafe fn engine_rewind(allocator: &TrackedAllocator, marker: EngineMarker, frame_address: usize) {
    // SAFETY: forwarded from the caller's guarantee.
    let start = unsafe { StartFrame::caller_of(frame_address) };
    let marker = StackMarker {
        allocator: marker.allocator,
        top_allocation: marker.top_allocation,
        top_serial: marker.top_serial,
    };
    let _ = allocator.rewind(marker, start);
}

fn engine_allocator_of(address: usize) -> EngineIdentity {
    let _inside = Inside::enter(); // the tracker's own memory
    let unknown = EngineIdentity {
        name: c"unknown".as_ptr(),
        kind: 0,
        element_type: core::ptr::null(),
    };
    engine::allocator_of(address as *const u8).map_or(unknown, |info| EngineIdentity {
        name: engine::c_name(info.name).as_ptr(),
        kind: match info.kind {
            AllocatorKind::Pool => 1,
            AllocatorKind::Stack => 2,
            AllocatorKind::Block => 3,
            AllocatorKind::TypedPool => 4,
        },
        element_type: info
            .element_type
            .map_or(core::ptr::null(), |name| engine::c_name(name).as_ptr()),
    })
}

fn engine_checkpoint() -> u32 {
    let _inside = Inside::enter(); // the tracker's own memory
    let epoch = engine::checkpoint().epoch();
    tracker::checkpoints::take(epoch);
    epoch
}

fn engine_leaks_since(checkpoint: u32) -> Vec<EngineLeaks> {
    let _inside = Inside::enter(); // the tracker's own memory
    let tracked = tracker::checkpoints::live_since(checkpoint).unwrap_or_default();
    engine::leaks_since(engine::Checkpoint::from_epoch(checkpoint))
        .iter()
        .map(|leaks| (leaks.info.name, leaks.blocks, leaks.bytes))
        .chain(tracked.iter().map(|f| (f.family, f.blocks, f.bytes)))
        .map(|(name, blocks, bytes)| EngineLeaks {
            name: engine::c_name(name).as_ptr(),
            blocks,
            bytes,
        })
        .collect()
}

fn engine_memstats(reset: bool) -> EngineMemStats {
    let _inside = Inside::enter(); // the tracker's own memory
    let stats = engine::memstats(reset);
    EngineMemStats {
        allocations: stats.allocations,
        frees: stats.frees,
        failures: stats.failures,
        live_blocks: stats.live_blocks,
        live_bytes: stats.live_bytes,
    }
}
