//! The allocation path shared by C++ and Rust: `allocate` and `deallocate` put blocks on and
//! off the live lists, classify bad frees, and keep the counters.
//!
//! Hot-path contract (every `new` and `delete` of the program): no global lock, no syscall, no
//! formatting and no allocation through the tracker itself. Slow paths (memory errors, large
//! blocks, the first call of a thread) are `#[cold]`.

pub mod budget;
pub mod checkpoints;
pub mod errors;
pub mod fork;
pub mod frames;
pub mod guard;
pub mod header;
mod heap;
mod init;
pub(crate) mod integrity;
mod kept_mappings;
mod kind;
pub mod live_list;
pub mod malloc;
mod mapped_blocks;
mod overrun_reach;
pub(crate) mod pending_stacks;
pub mod profile;
mod quarantine;
pub mod raw;
mod resize;
mod site;
mod spans;
pub mod suspend;
pub mod tag_budgets;
pub mod tags;
pub mod threads;
pub mod timeline;
pub mod told;

pub use heap::thread_heap_range;
pub use kind::BlockKind;

use crate::stack::{self, StackId, StartFrame};
use core::ffi::c_char;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use errors::{ErrorKind, MemoryError};
use guard::Inside;
use header::{BlockHeader, GuardCheck, Lookup, NewBlock, Owner, Placement};
use live_list::{NotHeld, StoppedWorld, SHARDS};

/// Where the tracker's largest tables of numbers and text lie (per-tag counters, the
/// timeline's text): no pointers of the program, and mostly pages never touched, which a leak
/// scan reading them would fault in.
pub fn statistics_ranges() -> [core::ops::Range<usize>; 2] {
    [tags::counters_range(), timeline::events_range()]
}

/// Where the tracker's tables of large blocks' addresses lie (live, kept and unmapped ones):
/// not the program's pointers, so a leak scan skips them.
pub fn large_block_tables_ranges() -> [core::ops::Range<usize>; 3] {
    [
        mapped_blocks::table_range(),
        kept_mappings::kept_list_range(),
        raw::unmapped_record_range(),
    ]
}

/// Whether the pages `[start, end)` hold a live large block's mapping or pages kept for the next
/// one: the tracker's, which the program's `munmap`, `mremap` and `mmap(MAP_FIXED)` must leave
/// alone (see `report::mappings`).
pub fn holds_large_block_pages(start: usize, end: usize) -> bool {
    mapped_blocks::overlaps(start, end) || kept_mappings::overlaps(start, end)
}

/// A tracked block of `size` bytes aligned to `align` (0 = default), or null when exhausted.
/// `start` gives where the call stack begins; it is only asked for when stacks are captured.
///
/// # Safety
/// `file` is null or a NUL-terminated string that outlives the block (a `__FILE__` literal).
#[inline(always)]
pub unsafe fn allocate(
    size: usize,
    align: usize,
    kind: BlockKind,
    file: *const c_char,
    line: u32,
    start: impl FnOnce() -> StartFrame,
) -> *mut u8 {
    // Three paths, each an `extern "C"` function of its own: such a function cannot unwind, so
    // the entries (which must abort on unwind) jump to it instead of calling it, and the quick
    // path keeps its values in registers without the general one's stack frame (churn with
    // stacks off: 194 instructions an allocation before, 146 now).
    if !file.is_null() {
        // SAFETY: as the caller guarantees.
        return unsafe { allocate_with_file(size, align, kind, file, line, start) };
    }
    if align <= 16 && init::peek().is_some_and(init::Hot::allows_quick_allocation) {
        return allocate_quickly(size, align, kind, start);
    }
    allocate_without_file(size, align, kind, start)
}

/// The common allocation, with stacks off and none of the rare options: a block without a file
/// from the thread's active list of its class. Calls nothing else it comes back from, so that
/// it keeps what it needs in registers; hands anything else over to the general path
/// ([`allocate_without_file`]) with nothing changed.
#[inline(never)]
extern "C" fn allocate_quickly(
    size: usize,
    align: usize,
    kind: BlockKind,
    start: impl FnOnce() -> StartFrame,
) -> *mut u8 {
    let taken = heap::class_for(size.max(1), align, true).and_then(|class| {
        let inside = Inside::enter()?;
        let Some(user) = place_quickly(&inside, size, kind, class) else {
            inside.leave(); // frees deferred meanwhile are applied when the general path leaves
            return None;
        };
        Some(if inside.leave() {
            apply_deferred_frees_then(user)
        } else {
            user
        })
    });
    match taken {
        Some(user) => crate::sys::returned_alone(user),
        None => allocate_without_file(size, align, kind, start),
    }
}

/// [`allocate_generally`] of a block without a file (`operator new`, `malloc`), compiled for it:
/// the tests of the file fall away.
#[inline(never)]
extern "C" fn allocate_without_file(
    size: usize,
    align: usize,
    kind: BlockKind,
    start: impl FnOnce() -> StartFrame,
) -> *mut u8 {
    // SAFETY: no file.
    let user = unsafe { allocate_generally(size, align, kind, core::ptr::null(), 0, start) };
    crate::sys::returned_alone(user)
}

/// The block of [`allocate_quickly`], inside the tracker.
#[inline(always)]
fn place_quickly(inside: &Inside, size: usize, kind: BlockKind, class: u8) -> Option<*mut u8> {
    if inside.tag() != 0 {
        return None; // counted against its tag on the general path
    }
    let me = inside.me_on_own_shard()?;
    let mut held = SHARDS[me.shard.index as usize].hold_as_owner()?;
    if !held.counts_unflushed(size) {
        return None;
    }
    let block = raw::acquire_from_active_list(class, &mut held)?;
    let seq = inside.next_seq();
    let new_block = NewBlock {
        size,
        kind,
        file: core::ptr::null(),
        line: 0,
    };
    // SAFETY: `block` is fresh from the heap (on no list: the heap's walk finds it); no file.
    unsafe { BlockHeader::write(&block, &new_block, Some(owner(me, seq, StackId(0), 0))) };
    held.count_allocation_unflushed(size);
    Some(block.user)
}

/// The end of [`allocate_quickly`] when a signal handler deferred frees meanwhile.
#[cold]
#[inline(never)]
fn apply_deferred_frees_then(user: *mut u8) -> *mut u8 {
    apply_deferred_frees();
    // Opaque: a caller that knew it gets `user` back would keep it across the call, in a
    // register its prologue saves on every allocation.
    core::hint::black_box(user)
}

/// [`allocate_generally`] of a block with a file (`K15_NEW`).
///
/// # Safety
/// As [`allocate`].
#[inline(never)]
unsafe extern "C" fn allocate_with_file(
    size: usize,
    align: usize,
    kind: BlockKind,
    file: *const c_char,
    line: u32,
    start: impl FnOnce() -> StartFrame,
) -> *mut u8 {
    // SAFETY: as the caller guarantees.
    let user = unsafe { allocate_generally(size, align, kind, file, line, start) };
    crate::sys::returned_alone(user)
}

/// [`allocate`] where [`allocate_quickly`] does not serve.
///
/// # Safety
/// As [`allocate`].
#[inline(always)]
unsafe fn allocate_generally(
    size: usize,
    align: usize,
    kind: BlockKind,
    file: *const c_char,
    line: u32,
    start: impl FnOnce() -> StartFrame,
) -> *mut u8 {
    let Some(inside) = Inside::enter() else {
        return allocate_untracked(size, align, kind);
    };
    let block = NewBlock {
        size,
        kind,
        file,
        line,
    };
    // SAFETY: `file` is as the caller guarantees.
    unsafe { allocate_inside(inside, init::hot(), &block, align, size, start) }
}

/// [`allocate`] once inside the tracker, with the set-up done (`hot`). A block the heap serves
/// takes the class of `room` bytes (at least the block's size): `realloc` leaves a growing
/// block room to grow in place; every other caller passes the size.
///
/// # Safety
/// `block.file` is null or a NUL-terminated string that outlives the block.
#[inline(always)]
unsafe fn allocate_inside(
    inside: Inside,
    hot: init::Hot,
    new_block: &NewBlock,
    align: usize,
    room: usize,
    start: impl FnOnce() -> StartFrame,
) -> *mut u8 {
    // One test of the thread's tag, and the common path is compiled for tag 0, as it was before
    // tags: their steps on it (the header's tag, the compact test, the count) and the registers
    // they held took 18 instructions of churn's 851 a pair. A path of its own, not a branch of
    // this one: inlined here, the tagged copy cost the untagged one 16 in spills.
    if inside.tag() != 0 {
        // SAFETY: as the caller guarantees.
        return unsafe { allocate_tagged(inside, hot, *new_block, align, room, start) };
    }
    // SAFETY: as the caller guarantees.
    unsafe { allocate_inside_as::<false>(inside, hot, new_block, align, room, start) }
}

/// [`allocate_inside`] with a tag scope open on the calling thread. Takes the new block by
/// value: by reference, the common path stored it for this call (5 instructions a pair).
///
/// # Safety
/// As [`allocate_inside`].
#[cold]
#[inline(never)]
unsafe fn allocate_tagged(
    inside: Inside,
    hot: init::Hot,
    new_block: NewBlock,
    align: usize,
    room: usize,
    start: impl FnOnce() -> StartFrame,
) -> *mut u8 {
    // SAFETY: as the caller guarantees.
    unsafe { allocate_inside_as::<true>(inside, hot, &new_block, align, room, start) }
}

/// The rest of [`allocate_inside`]: `TAGGED` says whether the block may carry the thread's tag
/// (without, it carries none).
///
/// # Safety
/// As [`allocate_inside`].
#[inline(always)]
unsafe fn allocate_inside_as<const TAGGED: bool>(
    inside: Inside,
    hot: init::Hot,
    new_block: &NewBlock,
    align: usize,
    room: usize,
    start: impl FnOnce() -> StartFrame,
) -> *mut u8 {
    let (size, kind) = (new_block.size, new_block.kind);
    let (me, seq) = inside.next_allocation();
    let tag = if TAGGED { inside.tag() } else { 0 };
    let alloc_stack = capture_allocation_stack(hot, me, start);
    // None: a signal handler allocating while its thread holds its shard (in a free).
    let Some(mut held) = SHARDS[me.shard.index as usize].hold(me.number, me.shard.owned) else {
        return allocate_untracked(size, align, kind);
    };
    // A compact header has no room for a site or a tag.
    let compact = new_block.file.is_null() && tag == 0;
    let from_heap = if hot.rare_allocation_options() {
        None
    } else {
        raw::acquire_from_heap(room, align, compact, &mut held)
    };
    let Some(block) = from_heap else {
        // Built here and again below: built once above, it went through memory on the common
        // path as well (9 instructions a pair).
        let owner = owner(me, seq, alloc_stack, tag);
        return allocate_elsewhere(held, *new_block, align, hot, owner);
    };
    let owner = owner(me, seq, alloc_stack, tag);
    // SAFETY: `block` is fresh from the heap (on no list: the heap's walk finds it); `file` is
    // as the caller guarantees.
    let header = unsafe { BlockHeader::write(&block, new_block, Some(owner)) };
    pending_stacks::attach(alloc_stack, header, block.placement);
    held.count_allocation(size);
    if tag != 0 {
        // A return of its own: `held` then needs no drop flag on the common path.
        return count_tagged_then(held, owner, size, block.user);
    }
    block.user
}

/// Counts a tagged block against its tag and the tag's parents; reports each budget it
/// crossed, with the shard let go; returns `user`. Inlined: its callers are tagged paths.
#[inline(always)]
fn count_tagged_then(
    held: live_list::HeldShard<'_>,
    owner: Owner,
    size: usize,
    user: *mut u8,
) -> *mut u8 {
    let crossed = tags::count_allocation(owner.shard, owner.tag, size);
    drop(held);
    for &(tag, live_bytes) in crossed.tags() {
        report_over_budget(tag, live_bytes, size, owner.alloc_stack);
    }
    user
}

/// A `tag_over_budget` error: the allocation of `size` bytes at `alloc_stack` took `tag` over
/// its budget, to `live_bytes` (it was served all the same).
#[cold]
fn report_over_budget(tag: tags::TagId, live_bytes: u64, size: usize, alloc_stack: StackId) {
    let alloc_stack = pending_stacks::settled(alloc_stack);
    bad_free(|| MemoryError {
        size,
        alloc_stack,
        over_budget: Some(errors::OverBudget {
            tag,
            budget_bytes: tag_budgets::budget_of(tag),
            live_bytes,
        }),
        ..MemoryError::at_free(
            ErrorKind::TagOverBudget,
            core::ptr::null_mut(),
            BlockKind::New,
            StackId(0),
        )
    });
}

/// The stack of an allocation by `me` (into its shard's ring where it owns one), or none with
/// stacks off.
#[inline(always)]
fn capture_allocation_stack(
    hot: init::Hot,
    me: guard::Me,
    start: impl FnOnce() -> StartFrame,
) -> StackId {
    match hot.stack_depth() {
        0 => StackId(0),
        depth if me.shard.owned => pending_stacks::capture(me.shard.index, start(), depth),
        depth => stack::capture(start(), depth),
    }
}

#[inline(always)]
fn owner(me: guard::Me, seq: u32, alloc_stack: StackId, tag: tags::TagId) -> Owner {
    Owner {
        thread: me.number,
        seq,
        shard: me.shard.index,
        alloc_stack,
        tag,
    }
}

/// The rest of [`allocate_inside`] off its common path: with `budget` or `break_on` set, or for
/// a block the heap does not serve (large, over-aligned, or the heap out of memory), which is
/// linked on `held` here. Takes the new block by value, so that the common path never stores
/// it in memory for this call.
///
/// # Safety
/// As [`allocate_inside`].
#[cold]
#[inline(never)]
unsafe fn allocate_elsewhere(
    mut held: live_list::HeldShard<'_>,
    new_block: NewBlock,
    align: usize,
    hot: init::Hot,
    owner: Owner,
) -> *mut u8 {
    let size = new_block.size;
    let compact = new_block.file.is_null() && owner.tag == 0;
    let block = if hot.budget() {
        raw::acquire_budgeted(size, align, compact, &mut held)
    } else {
        raw::acquire_anywhere(size, align, compact, &mut held)
    };
    let Some(block) = block else {
        drop(held);
        if hot.budget() {
            let alloc_stack = pending_stacks::settled(owner.alloc_stack);
            report_budget_exceeded(size, new_block.file, new_block.line, alloc_stack);
        }
        return core::ptr::null_mut();
    };
    // SAFETY: `block` is fresh and on no list; `file` is as the caller guarantees.
    unsafe {
        let header = BlockHeader::write(&block, &new_block, Some(owner));
        pending_stacks::attach(owner.alloc_stack, header, block.placement);
        if block.placement != Placement::Heap {
            held.link(header);
        }
        if hot.profile() {
            profile::count_allocation(&*header, block.user);
        }
    }
    held.count_allocation(size);
    if hot.break_on() {
        integrity::break_if_asked(owner.thread, owner.seq, size);
    }
    if owner.tag != 0 {
        return count_tagged_then(held, owner, size, block.user);
    }
    block.user
}

/// The tracker's own memory (nested calls while it is busy): headered, so any free function
/// releases it, but on no list and in no counter.
#[cold]
fn allocate_untracked(size: usize, align: usize, kind: BlockKind) -> *mut u8 {
    let Some(block) = raw::acquire_system(size, align) else {
        return core::ptr::null_mut();
    };
    let new_block = NewBlock {
        size,
        kind,
        file: core::ptr::null(),
        line: 0,
    };
    // SAFETY: `block` is fresh from acquire_system.
    unsafe { BlockHeader::write(&block, &new_block, None) };
    block.user
}

/// Frees `ptr` if it is a live block of ours; reports (and survives) anything else. `start`
/// gives where the call stack begins, asked for only when an error is reported.
#[inline]
pub fn deallocate(ptr: *mut u8, kind: BlockKind, start: impl Fn() -> StartFrame + Copy) {
    if ptr.is_null() {
        return;
    }
    match BlockHeader::lookup(ptr) {
        Lookup::Live(header, cookie) => free_live(header, cookie, kind, start),
        Lookup::Untracked(header) => {
            // SAFETY: an untracked header is ours, on no list, from the own heap or our mappings
            // (not the heap), and freed only here.
            unsafe {
                let raw_offset = (*header).raw_offset();
                (*header).mark_freed();
                raw::release(header, raw_offset, false);
            }
        }
        Lookup::Damaged => {} // reported when the damage was found; the block is left alone
        Lookup::Underrun { header, .. } => {
            integrity::report_at_delete(header, kind, start());
            // SAFETY: the header is ours (its cookie was repaired just above).
            free_live(header, unsafe { (*header).live_cookie() }, kind, start)
        }
        Lookup::Freed { .. } | Lookup::Foreign if guard::inside() => defer_free(ptr, kind, None),
        Lookup::Freed {
            size,
            alloc_stack,
            previous_free_stack,
        } => bad_free(|| MemoryError {
            size,
            alloc_stack,
            previous_free_stack: quarantine::free_stack_of(BlockHeader::of(ptr))
                .unwrap_or(previous_free_stack),
            detail: (alloc_stack == StackId(0) && heap::block_of_free_span(ptr as usize).is_some())
                .then_some(SPAN_RETURNED),
            ..MemoryError::at_free(ErrorKind::DoubleFree, ptr, kind, capture_stack_of(start()))
        }),
        Lookup::Foreign => free_foreign(ptr, kind, start),
    }
}

/// Why a double free names no allocation: its header went back to the OS with its span's pages.
const SPAN_RETURNED: &str =
    "its memory went back to the OS with its span's: size is its size class's room, stacks unknown";

type ForeignDelete = unsafe extern "C" fn(*mut u8);

/// The `operator delete` the tracker took over from after the process had started (an engine
/// library loaded by `dlopen`: `cpp/take_over.cpp`), or 0. Blocks its allocator served before
/// are handed back to it: they cannot be told from bad frees, which then go to it as well.
static FOREIGN_DELETE: AtomicUsize = AtomicUsize::new(0);

pub fn pass_foreign_blocks_to(delete: ForeignDelete) {
    FOREIGN_DELETE.store(delete as usize, Ordering::Release);
}

/// Whether `ptr`, which the tracker never served, went to the allocator it took over from.
#[cold]
fn handed_back(ptr: *mut u8) -> bool {
    match FOREIGN_DELETE.load(Ordering::Acquire) {
        0 => false,
        _ if integrity::lies_in_tracked_block(ptr as usize) => false, // a bad free of ours
        delete => {
            // SAFETY: stored by `pass_foreign_blocks_to` from a function of this very type; that
            // allocator's delete takes any pointer the program passes to `delete`.
            unsafe { core::mem::transmute::<usize, ForeignDelete>(delete)(ptr) };
            true
        }
    }
}

/// A pointer that is no block of ours: glibc's own blocks given to the C family's `free` go
/// back to glibc (see `malloc`); anything else is reported and left alone (a `delete` of a
/// glibc block included: with `malloc=0` the tracker cannot tell it from a stray pointer).
#[cold]
#[inline(never)]
fn free_foreign(ptr: *mut u8, kind: BlockKind, start: impl Fn() -> StartFrame + Copy) {
    // Never a pointer into one of the heap's blocks (one compare): glibc would take it for its own.
    if heap::block_containing(ptr as usize).is_none()
        && malloc::same_family(kind, BlockKind::Malloc)
        && malloc::is_glibc_block(ptr)
    {
        // SAFETY: a glibc block the program frees through the family that allocated it.
        unsafe { crate::sys::glibc::free(ptr.cast()) };
        return;
    }
    if handed_back(ptr) {
        return;
    }
    if let Some((header, cookie)) = report_foreign(ptr, kind, start) {
        free_live(header, cookie, kind, start);
    }
}

/// Reports `ptr`, which names no live block of ours as its header reads, as a bad free; the
/// block it names once the report repaired its header (rebuilt from its block's record, or an
/// underrun of a large or aligned block found on its shard's list), else `None`.
#[cold]
pub(super) fn report_foreign(
    ptr: *mut u8,
    kind: BlockKind,
    start: impl Fn() -> StartFrame,
) -> Option<(*mut BlockHeader, usize)> {
    bad_free(|| integrity::foreign_free_error(ptr, kind, capture_stack_of(start())));
    match BlockHeader::lookup(ptr) {
        Lookup::Live(header, cookie) => Some((header, cookie)),
        _ => None,
    }
}

#[inline(always)]
fn free_live(
    header: *mut BlockHeader,
    cookie: usize,
    kind: BlockKind,
    start: impl Fn() -> StartFrame + Copy,
) {
    // A signal handler that interrupted its thread inside the tracker: the thread may hold what
    // this free needs (a lock, its shard's list), so the free waits for the thread to leave.
    if guard::inside() {
        return defer_free(BlockHeader::user_ptr(header), kind, Some(header));
    }
    // SAFETY: lookup saw a LIVE cookie; the fields read before holding the shard are only used
    // to find it, and everything is checked again once it is held.
    let shard = unsafe { (*header).shard() };
    // SAFETY: as above; only this thread frees the block it was given.
    match unsafe { (*header).guard_check() } {
        GuardCheck::Intact => {}
        GuardCheck::Damaged => integrity::report_at_delete(header, kind, start()),
        GuardCheck::NoGuard => integrity::look_behind_exact_fit(header, start),
    }
    let hot = init::set_up_hot();
    // The option bits are tested once on the common path (none of them set); the path with
    // any of them is the same code with their steps compiled in.
    if hot.free_stacks() || hot.quarantine() || hot.budget() || hot.profile() {
        free_live_with_options(header, cookie, shard, kind, start, hot)
    } else {
        free_live_as_asked::<false>(header, cookie, shard, kind, start, hot)
    }
}

/// [`free_live`] with `free_stacks`, `quarantine`, `budget` or `profile` set.
#[cold]
#[inline(never)]
fn free_live_with_options(
    header: *mut BlockHeader,
    cookie: usize,
    shard: u8,
    kind: BlockKind,
    start: impl Fn() -> StartFrame + Copy,
    hot: init::Hot,
) {
    free_live_as_asked::<true>(header, cookie, shard, kind, start, hot)
}

/// The rest of [`free_live`], once the guard is checked: `OPTIONS` says whether `hot` may ask
/// for free stacks, quarantine, the budget or the profile.
#[inline(always)]
fn free_live_as_asked<const OPTIONS: bool>(
    header: *mut BlockHeader,
    cookie: usize,
    shard: u8,
    kind: BlockKind,
    start: impl Fn() -> StartFrame + Copy,
    hot: init::Hot,
) {
    if OPTIONS && hot.free_stacks() {
        record_free_stack(header, start());
    }
    // SAFETY: as above.
    if unsafe { !(*header).freed_by_its_family(kind) } {
        report_mismatch(header, kind, start());
    }
    if OPTIONS && hot.profile() {
        profile::count_free(header);
    }
    let me = guard::me();
    if shard != me.shard.index {
        return free_on_other_list(header, cookie, shard, kind, start, me);
    }
    // Indexed by the thread's own shard, not the header's: the header may still be on its way
    // from memory, and the shard's loads and stores should not wait for it.
    let Some(held) = SHARDS[me.shard.index as usize].hold(me.number, me.shard.owned) else {
        // A signal handler freeing while its thread changes this shard.
        return defer_free(BlockHeader::user_ptr(header), kind, Some(header));
    };
    // SAFETY: with the shard held, the LIVE cookie seen at the lookup (which covers the shard)
    // means the block is on this list; a racing second free of the same pointer sees FREED or
    // CLAIMED here instead.
    unsafe {
        if !(*header).cookie_is(cookie) {
            drop(held);
            return deallocate_raced(header, kind, start());
        }
        if OPTIONS && hot.budget() {
            budget::credit_block((*header).size());
        }
        free_on_own_list(held, header, OPTIONS && hot.quarantine(), hot.tags());
    }
}

/// Frees a block of another shard: under that shard's lock when nobody owns it, else claimed
/// and queued. Inside the tracker, since the locks it takes are not reentrant.
#[cold]
#[inline(never)]
fn free_on_other_list(
    header: *mut BlockHeader,
    cookie: usize,
    shard: u8,
    kind: BlockKind,
    start: impl Fn() -> StartFrame + Copy,
    me: guard::Me,
) {
    // Not inside (free_live checked), but maybe interrupted in the middle of a change of its
    // own shard, which may hold a heap class lock.
    if in_tracker(me) {
        return defer_free(BlockHeader::user_ptr(header), kind, Some(header));
    }
    let _inside = Inside::enter();
    let held = match SHARDS[shard as usize].lock_unowned(me.number) {
        Ok(held) => held,
        Err(NotHeld::Owned) => return free_remote(header, kind, start, me),
        Err(NotHeld::Reentered) => {
            return defer_free(BlockHeader::user_ptr(header), kind, Some(header))
        }
    };
    // SAFETY: as in free_live: checked again with the shard held.
    unsafe {
        if !(*header).cookie_is(cookie) {
            drop(held);
            return deallocate_raced(header, kind, start());
        }
        free_off_list(held, header, Settling::No);
    }
}

/// Frees that could not be applied, counted and said in the report: deferred by a signal
/// handler beyond what its thread's record holds (see [`guard::DeferredFree`]), or claimed
/// blocks of a shard that stopping the world had to give up on.
static UNRECORDED_FREES: AtomicU64 = AtomicU64::new(0);

/// How many frees could not be applied (their blocks stay claimed and counted live).
pub fn unrecorded_frees() -> u64 {
    UNRECORDED_FREES.load(Ordering::Relaxed)
}

/// Whether the calling thread is in the tracker: inside it, or in the middle of a change of
/// its own shard. Seen from a signal handler, its thread may then hold locks and lists.
pub fn in_tracker(me: guard::Me) -> bool {
    guard::inside() || live_list::is_changing(me.number, me.shard)
}

/// Keeps a free for the thread to apply when it leaves the tracker. A live block (`header`) is
/// claimed now; one that cannot be was freed by someone else since the lookup (a double free,
/// reported when this free is applied).
#[cold]
#[inline(never)]
fn defer_free(ptr: *mut u8, kind: BlockKind, header: Option<*mut BlockHeader>) {
    let free = match header {
        // SAFETY: `header` was seen LIVE by lookup and is ours; claiming is one compare-and-swap.
        Some(header) if unsafe { claim(header) } => guard::DeferredFree::Claimed(header),
        _ => guard::DeferredFree::Free { ptr, kind },
    };
    record_deferred(free);
}

fn record_deferred(free: guard::DeferredFree) {
    if !guard::defer(free) {
        UNRECORDED_FREES.fetch_add(1, Ordering::Relaxed);
    }
}

/// Before the exit report: the calling thread's cached free blocks go back to their classes
/// and every free span's pages and kept mapping to the OS, so that symbolizing runs in memory
/// the heap gave up and adds little or nothing to the process's peak (yaml-cpp's suite: 8 MiB
/// of free spans).
pub fn release_free_memory() {
    guard::give_back_own_lists();
    spans::return_kept_spans();
    kept_mappings::unmap_all();
}

/// Applies the calling thread's deferred frees: when it leaves the tracker, at its exit, and
/// before `stats()` and the reports.
#[cold]
#[inline(never)]
pub fn apply_deferred_frees() {
    if in_tracker(guard::me()) || crate::sys::in_glibc_allocator() {
        return; // not left yet (a signal handler's call): applied when the thread leaves
    }
    while let Some(free) = guard::take_deferred() {
        match free {
            guard::DeferredFree::Claimed(header) => apply_claimed(header),
            guard::DeferredFree::Free { ptr, kind } => deallocate(ptr, kind, StartFrame::here),
        }
    }
    // After the record: a block is chained only while the record is full.
    apply_chained();
}

/// Applies a claimed block's deferred free: queued for settling.
fn apply_claimed(header: *mut BlockHeader) {
    let _inside = Inside::enter();
    queue_claimed(header, guard::me());
}

/// Applies the claimed blocks chained on the thread ([`guard::take_chained`]): queued while its
/// shard's queue has room, the rest settled under one stop of the world. A signal storm chains
/// thousands at a time, and a stop for each kept the thread applying them for as long as the
/// storm went on.
fn apply_chained() {
    let mut chained = guard::take_chained().peekable();
    if chained.peek().is_none() {
        return;
    }
    let _inside = Inside::enter();
    let me = guard::me();
    while let Some(header) = chained.next() {
        if !queued(header, me) {
            return settle_now(core::iter::once(header).chain(chained), me);
        }
    }
}

/// Frees a block on the calling thread's own shard (`held`): a heap block goes to the thread's
/// lists (see `heap`), unless freed blocks go into `quarantine`; another block leaves the
/// shard's list. `tags`: whether the block may carry a tag ([`init::Hot::tags`]).
///
/// # Safety
/// `header` is a live block on the list of `held`, the calling thread's shard, and nobody else
/// frees it.
#[inline(always)]
unsafe fn free_on_own_list(
    mut held: live_list::HeldShard<'_>,
    header: *mut BlockHeader,
    quarantine: bool,
    tags: bool,
) {
    // SAFETY: guaranteed by the caller.
    let h = unsafe { &mut *header };
    count_free(&mut held, h, tags);
    let in_heap = h.placement() == Placement::Heap;
    if in_heap && !quarantine {
        // SAFETY: a heap block of class `h.class` of this thread, which park marks freed.
        unsafe { heap::park(header as *mut u8, h.class(), &mut held) };
        return;
    }
    if !in_heap {
        // SAFETY: guaranteed by the caller.
        unsafe { held.unlink(header) };
    }
    h.mark_freed();
    drop(held);
    // SAFETY: the block is off its list and marked freed; this thread owns its memory now.
    unsafe { release_freed(header, init::set_up_hot(), Settling::No) };
}

/// Counts the free of `h`, a block on the list of `held`, process-wide and against its tag if
/// it `may_be_tagged`.
#[inline(always)]
fn count_free(held: &mut live_list::HeldShard<'_>, h: &BlockHeader, may_be_tagged: bool) {
    let size = h.size();
    held.count_free(size);
    if may_be_tagged {
        let tag = h.tag();
        if tag != 0 {
            tags::count_free(h.shard(), tag, size);
        }
    }
}

/// Whether a free runs while settling queued frees with the world stopped (`live_list`): the
/// error log and the quarantine's lock may then be held by this very thread (`fork`), so
/// nothing is reported and nothing leaves the quarantine.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Settling {
    No,
    WorldStopped,
}

/// The memory of a freed block on no list goes back (to the heap's class, or to where `raw`
/// got it), or into quarantine.
///
/// # Safety
/// `header` is a block of ours, marked freed, off its list, that nobody else uses.
unsafe fn release_freed(header: *mut BlockHeader, hot: init::Hot, settling: Settling) {
    if settling == Settling::No {
        integrity::report_found();
    }
    // SAFETY: guaranteed by the caller.
    unsafe {
        let h = &*header;
        if hot.quarantine() {
            let _inside = Inside::enter(); // the quarantine's list is the tracker's own memory
            quarantine::hold(header, settling == Settling::No);
        } else if h.placement() == Placement::Heap {
            heap::give_back_block(header as *mut u8, h.class());
        } else {
            // Inside the tracker: the budget and the record of unmapped blocks take locks.
            let _inside = Inside::enter();
            raw::release(header, h.raw_offset(), true);
        }
    }
}

/// Frees a block on another shard's list (`held` by its lock or a stopped world); a heap block
/// goes back to its class (under the class lock, which nobody holds while waiting for a shard,
/// so taking it with the world stopped is safe).
///
/// # Safety
/// `header` is a live or claimed block on the list of `held`, and nobody else frees it.
#[cold]
unsafe fn free_off_list(
    mut held: live_list::HeldShard<'_>,
    header: *mut BlockHeader,
    settling: Settling,
) {
    // SAFETY: guaranteed by the caller.
    let h = unsafe { &mut *header };
    if h.placement() != Placement::Heap {
        // SAFETY: guaranteed by the caller.
        unsafe { held.unlink(header) };
    }
    count_free(&mut held, h, tags::any());
    if !h.is_claimed() {
        budget::credit_block(h.size()); // a claimed block's bytes went back when it was claimed
    }
    h.mark_freed();
    drop(held);
    // SAFETY: the block is off every list and marked freed; this thread owns its memory now.
    unsafe { release_freed(header, init::set_up_hot(), settling) };
}

/// A free of a block on a shard another thread owns: the block is claimed now (so a second
/// free is a double free at once) and queued on this thread's shard, to be taken off its list
/// when the queue is settled (see `live_list`).
#[cold]
#[inline(never)]
fn free_remote(
    header: *mut BlockHeader,
    kind: BlockKind,
    start: impl Fn() -> StartFrame + Copy,
    me: guard::Me,
) {
    // SAFETY: lookup saw a LIVE cookie at this header, which is ours.
    if !unsafe { claim(header) } {
        return deallocate_raced(header, kind, start());
    }
    queue_claimed(header, me);
}

/// Claims a live block for a free applied later; its bytes go back to the budget now, since the
/// program is done with them.
///
/// # Safety
/// `header` is a header of ours that lookup saw LIVE.
unsafe fn claim(header: *mut BlockHeader) -> bool {
    // SAFETY: guaranteed by the caller.
    let h = unsafe { &*header };
    let claimed = h.claim();
    if claimed {
        budget::credit_block(h.size());
    }
    claimed
}

/// Queues a claimed block on the calling thread's shard, or settles it at once when the queue
/// is full or the thread has no shard of its own.
fn queue_claimed(header: *mut BlockHeader, me: guard::Me) {
    if !queued(header, me) {
        settle_now(core::iter::once(header), me);
    }
}

/// Queues a claimed block on the calling thread's shard; false when the queue is full or the
/// thread has no shard of its own (the caller settles it).
fn queued(header: *mut BlockHeader, me: guard::Me) -> bool {
    let Some(mut held) = SHARDS[me.shard.index as usize].hold(me.number, me.shard.owned) else {
        // A signal handler in the middle of its thread's change of its shard: deferred again.
        record_deferred(guard::DeferredFree::Claimed(header));
        return true;
    };
    me.shard.owned && held.queue_pending(header)
}

/// Settles claimed blocks, none of them queued, under one stop of the world.
fn settle_now(headers: impl Iterator<Item = *mut BlockHeader>, me: guard::Me) {
    if live_list::settling_stopped() {
        // An exit from a signal handler is under way: nothing is settled any more, and a stop
        // of the world per free would only keep its report waiting. Left claimed.
        return;
    }
    let world = StoppedWorld::stop(me.number);
    for header in headers {
        // SAFETY: claimed, and not queued.
        unsafe { settle_claimed_block(header, &world) };
    }
}

/// Frees a claimed block, if it still is claimed: a block whose cookie changed since was freed
/// by a racing second free (reported then), and maybe reused.
///
/// # Safety
/// `header` is a header of ours that was claimed ([`BlockHeader::claim`]).
pub(crate) unsafe fn settle_claimed_block(header: *mut BlockHeader, world: &StoppedWorld) {
    // SAFETY: the world is stopped, so nobody changes the block while it is claimed, and a
    // claimed block is still on the list of its shard. A block on a shard the world could not
    // settle stays claimed: listed by no report, but left in the counters.
    unsafe {
        if !(*header).is_claimed() {
            return;
        }
        if world.can_settle((*header).shard()) {
            free_off_list(
                world.shard((*header).shard()),
                header,
                Settling::WorldStopped,
            );
        } else if !live_list::settling_stopped() {
            UNRECORDED_FREES.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Keeps the stack of this `delete` in the block's first user bytes, which a free block of the
/// heap (or a large block until it is unmapped, or any block the quarantine holds) does not use
/// otherwise: a second `delete` or a write after it then names the first. Blocks of glibc and of
/// the budget are reused by them at once: not kept there but by the quarantine, which reads the
/// stack of every block it holds (else the program's own first bytes, taken for a stack).
#[cold]
#[inline(never)]
fn record_free_stack(header: *mut BlockHeader, start: StartFrame) {
    let user = BlockHeader::user_ptr(header);
    // SAFETY: the block is live and being freed by this thread.
    let placement = unsafe { (*header).placement() };
    if matches!(placement, Placement::Heap | Placement::Mapped) || init::hot().quarantine() {
        let _inside = Inside::enter();
        let stack = capture_stack_of(start);
        // SAFETY: every block has room for at least 4 bytes at its user pointer (a heap block
        // of 0 bytes gets a class with room).
        unsafe { user.cast::<StackId>().write_unaligned(stack) };
    }
}

/// The stack of the `delete` that freed the block at `user` (see [`record_free_stack`]), when
/// free stacks are kept.
///
/// # Safety
/// `user` is a freed block of the heap, or a large block being unmapped.
unsafe fn recorded_free_stack(user: *mut u8) -> StackId {
    if !init::hot().free_stacks() {
        return StackId(0);
    }
    // SAFETY: guaranteed by the caller: such blocks hold the stack recorded above.
    unsafe { user.cast::<StackId>().read_unaligned() }
}

/// Another thread freed the same block between our lookup and our lock: a double free.
#[cold]
fn deallocate_raced(header: *mut BlockHeader, kind: BlockKind, start: StartFrame) {
    deallocate(BlockHeader::user_ptr(header), kind, || start);
}

#[cold]
#[inline(never)]
fn report_mismatch(header: *mut BlockHeader, kind: BlockKind, start: StartFrame) {
    // The block is live (LIVE cookie seen by lookup) and stays so until this thread frees it
    // after this report.
    bad_free(|| {
        integrity::block_error(
            ErrorKind::MismatchedDelete,
            header,
            kind,
            capture_stack_of(start),
        )
    });
}

#[cold]
#[inline(never)]
fn report_budget_exceeded(size: usize, file: *const c_char, line: u32, alloc_stack: StackId) {
    bad_free(|| MemoryError {
        size,
        // SAFETY: `file` is null or a `__FILE__` literal (allocate's contract).
        file: unsafe { crate::sys::c_str(file) }.map(str::to_owned),
        line,
        allocator: Some(budget::NAME),
        detail: Some("the memory budget is spent"),
        alloc_stack,
        ..MemoryError::at_free(
            ErrorKind::BudgetExceeded,
            core::ptr::null_mut(),
            BlockKind::New,
            StackId(0),
        )
    });
}

/// An `invalid_alignment` error: an aligned allocation of `size` bytes through `kind` asked for
/// `align`, which its function refuses (the caller then fails the call as the library it
/// replaces does). Only the aligned forms' refusal comes here, never a served allocation.
///
/// # Safety
/// `file` is null or a NUL-terminated string (a `__FILE__` literal).
#[cold]
#[inline(never)]
pub unsafe fn report_invalid_alignment(
    size: usize,
    align: usize,
    kind: BlockKind,
    file: *const c_char,
    line: u32,
    start: impl FnOnce() -> StartFrame,
) {
    bad_free(|| MemoryError {
        size,
        // SAFETY: as the caller guarantees.
        file: unsafe { crate::sys::c_str(file) }.map(str::to_owned),
        line,
        allocated_with: Some(kind),
        alignment: Some(align),
        alloc_stack: capture_stack_of(start()),
        ..MemoryError::at_free(
            ErrorKind::InvalidAlignment,
            core::ptr::null_mut(),
            kind,
            StackId(0),
        )
    });
}

/// The stack of the call being reported (a bad free, a refused allocation). Called inside
/// the tracker: the unwinder's cold paths allocate.
pub(crate) fn capture_stack_of(start: StartFrame) -> StackId {
    stack::capture(start, init::hot().stack_depth())
}

/// The call stack from `start` at the configured depth, setting the tracker up on first use; for
/// allocators built on the tracker (`rust/engine`). `_inside` proves the guard is held: the
/// unwinder may allocate through Rust's global allocator on cold paths.
pub fn capture_stack(_inside: &Inside, start: StartFrame) -> StackId {
    capture_stack_of(start)
}

/// Builds and reports a memory error inside the tracker, so that what the capture and the
/// report allocate stays out of the lists (an error inside the tracker is reported as is).
#[cold]
#[inline(never)]
fn bad_free<E: Into<Option<MemoryError>>>(error: impl FnOnce() -> E) {
    let _inside = Inside::enter();
    integrity::report_found();
    // None: reported already (the header of a block that an overrun reported reached).
    if let Some(error) = error().into() {
        errors::report(error);
    }
}

/// `check_heap()`: see [`integrity::check_heap`].
pub fn check_heap(start: StartFrame) -> usize {
    integrity::check_heap(start)
}

/// Counters of the whole process; bytes are user-requested sizes, headers excluded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub live_blocks: u64,
    pub live_bytes: u64,
    pub peak_bytes: u64,
    pub total_allocations: u64,
    pub total_frees: u64,
}

/// Applies the frees deferred or queued so far, so that the counters read next hold them.
fn settle_frees() {
    apply_deferred_frees();
    integrity::report_found();
    if live_list::any_pending() && !live_list::settling_stopped() {
        let _inside = Inside::enter();
        drop(StoppedWorld::stop(guard::thread_number())); // settles them
    }
}

/// Every tag's figures now (`k15::memory::tag_stats()`), in the order the tags were first seen.
pub fn tag_stats() -> Vec<tags::TagStats> {
    settle_frees();
    tags::all_stats()
}

/// Counters of the whole process.
pub fn stats() -> Stats {
    settle_frees();
    stats_as_they_stand()
}

/// [`stats`] without settling the frees queued first: for a caller that stopped the world,
/// which settled them (a report reads them with the live lists it walks).
pub fn stats_as_they_stand() -> Stats {
    let t = live_list::totals();
    Stats {
        live_blocks: t.live_blocks,
        live_bytes: t.live_bytes,
        peak_bytes: t.peak_bytes,
        total_allocations: t.allocations,
        total_frees: t.frees,
    }
}
