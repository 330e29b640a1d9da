//! The allocation path shared by C++ and Rust: `allocate` and `deallocate` put blocks on and
//! off the live lists, classify bad frees, and keep the counters.
//!
//! Hot-path contract (every `new` and `delete` of the program): no global lock, no syscall, no
//! formatting and no allocation through the tracker itself. Slow paths (memory errors, large
//! blocks, the first call of a thread) are `#[cold]`.

pub mod budget;
pub mod errors;
mod fork;
pub mod guard;
pub mod header;
mod heap;
mod init;
pub mod live_list;
pub mod malloc;
pub mod raw;

use crate::ffi::{BlockKind, Stats};
use crate::stack::{self, StackId, StartFrame};
use core::ffi::c_char;
use errors::{ErrorKind, MemoryError};
use guard::Inside;
use header::{BlockHeader, Lookup, NewBlock, Owner, Placement};
use live_list::{NotHeld, StoppedWorld, SHARDS};

/// A tracked block of `size` bytes aligned to `align` (0 = default), or null when exhausted.
/// `start` gives where the call stack begins; it is only asked for when stacks are captured.
///
/// # Safety
/// `file` is null or a NUL-terminated string that outlives the block (a `__FILE__` literal).
#[inline]
pub unsafe fn allocate(
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
    unsafe { allocate_inside(inside, init::hot(), &block, align, start) }
}

/// [`allocate`] once inside the tracker, with the set-up done (`hot`).
///
/// # Safety
/// `block.file` is null or a NUL-terminated string that outlives the block.
#[inline(always)]
unsafe fn allocate_inside(
    inside: Inside,
    hot: init::Hot,
    new_block: &NewBlock,
    align: usize,
    start: impl FnOnce() -> StartFrame,
) -> *mut u8 {
    let (size, kind) = (new_block.size, new_block.kind);
    let alloc_stack = if hot.stack_depth() > 0 {
        stack::capture(start(), hot.stack_depth())
    } else {
        StackId(0)
    };
    let (me, seq) = inside.next_allocation();
    // None: a signal handler allocating while its thread holds its shard (in a free).
    let Some(mut held) = SHARDS[me.shard.index as usize].hold(me.number, me.shard.owned) else {
        return allocate_untracked(size, align, kind);
    };
    let Some(block) = raw::acquire(size, align, hot.budget(), &mut held) else {
        drop(held);
        if hot.budget() {
            report_budget_exceeded(size, new_block.file, new_block.line, alloc_stack);
        }
        return core::ptr::null_mut();
    };
    let owner = Owner {
        thread: me.number,
        seq,
        shard: me.shard.index,
        alloc_stack,
    };
    // SAFETY: `block` is fresh from acquire; `file` is as the caller guarantees. A heap block
    // is parked on this shard's list already; others are on no list until linked here.
    unsafe {
        let header = BlockHeader::write(&block, new_block, Some(owner));
        if block.placement != Placement::Heap {
            held.link(header);
        }
    }
    held.count_allocation(size);
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
        Lookup::Live(header) => free_live(header, kind, start),
        Lookup::Untracked(header) => {
            // SAFETY: an untracked header is ours, on no list, from glibc or our mappings (not
            // the heap), and freed only here.
            unsafe {
                let raw_offset = (*header).raw_offset();
                (*header).mark_freed();
                raw::release(header, raw_offset);
            }
        }
        Lookup::Freed { size, alloc_stack } => bad_free(|| MemoryError {
            size,
            alloc_stack,
            ..MemoryError::at_free(ErrorKind::DoubleFree, ptr, kind, capture_stack_of(start()))
        }),
        Lookup::Foreign => free_foreign(ptr, kind, start),
    }
}

/// A pointer that is no block of ours: glibc's own blocks given to the C family's `free` go
/// back to glibc (see `malloc`); anything else is reported and left alone (a `delete` of a
/// glibc block included: with `malloc=0` the tracker cannot tell it from a stray pointer).
#[cold]
#[inline(never)]
fn free_foreign(ptr: *mut u8, kind: BlockKind, start: impl Fn() -> StartFrame) {
    if malloc::same_family(kind, BlockKind::Malloc) && malloc::is_glibc_block(ptr) {
        // SAFETY: a glibc block the program frees through the family that allocated it.
        unsafe { crate::sys::raw_free(ptr) };
        return;
    }
    bad_free(|| MemoryError::at_free(ErrorKind::InvalidFree, ptr, kind, capture_stack_of(start())))
}

#[inline]
fn free_live(header: *mut BlockHeader, kind: BlockKind, start: impl Fn() -> StartFrame + Copy) {
    // SAFETY: lookup saw a LIVE cookie; the fields read before holding the shard are only used
    // to find it, and everything is checked again once it is held.
    let (shard, allocated_with) = unsafe { ((*header).shard, (*header).kind) };
    if allocated_with != kind && !malloc::same_family(allocated_with, kind) {
        report_mismatch(header, kind, start());
    }
    let me = guard::me();
    let own = shard == me.shard.index;
    let held = if own {
        // Indexed by the thread's own shard, not the header's: the header may still be on its
        // way from memory, and the shard's loads and stores should not wait for it.
        SHARDS[me.shard.index as usize].hold(me.number, me.shard.owned)
    } else {
        match SHARDS[shard as usize].lock_unowned(me.number) {
            Ok(held) => Some(held),
            Err(NotHeld::Owned) => return free_remote(header, kind, start, me),
            Err(NotHeld::Reentered) => None,
        }
    };
    // None: a signal handler freeing while its thread holds this shard; the block stays live.
    let Some(held) = held else { return };
    // SAFETY: with the shard held, a LIVE cookie and this shard mean the block is on this
    // list; a racing second free of the same pointer sees FREED or CLAIMED here instead.
    unsafe {
        if !(*header).is_live() || (*header).shard != shard {
            drop(held);
            return deallocate_raced(header, kind, start());
        }
        if own {
            free_on_own_list(held, header);
        } else {
            free_off_list(held, header);
        }
    }
}

/// Frees a block on the calling thread's own shard (`held`): a heap block stays on the list,
/// parked (see `heap`), so neither this free nor the allocation that reuses it touches the list.
///
/// # Safety
/// `header` is a live block on the list of `held`, the calling thread's shard, and nobody else
/// frees it.
#[inline(always)]
unsafe fn free_on_own_list(mut held: live_list::HeldShard<'_>, header: *mut BlockHeader) {
    // SAFETY: guaranteed by the caller.
    let h = unsafe { &mut *header };
    held.count_free(h.size);
    if h.placement == Placement::Heap {
        h.mark_freed();
        // SAFETY: a heap block of class `h.class`, freed, on the list of `held`.
        unsafe { heap::park(header as *mut u8, h.class, &mut held) };
        return;
    }
    // SAFETY: guaranteed by the caller.
    unsafe { held.unlink(header) };
    let raw_offset = h.raw_offset();
    h.mark_freed();
    drop(held);
    // SAFETY: the block is off its list and marked freed; this thread owns its memory now.
    unsafe { raw::release(header, raw_offset) };
}

/// Frees a block on another shard's list (`held` by its lock or a stopped world); a heap block
/// goes back to its class (under the class lock, which nobody holds while waiting for a shard,
/// so taking it with the world stopped is safe).
///
/// # Safety
/// `header` is a live or claimed block on the list of `held`, and nobody else frees it.
#[cold]
unsafe fn free_off_list(mut held: live_list::HeldShard<'_>, header: *mut BlockHeader) {
    // SAFETY: guaranteed by the caller.
    let h = unsafe { &mut *header };
    // SAFETY: guaranteed by the caller.
    unsafe { held.unlink(header) };
    held.count_free(h.size);
    let (placement, class, raw_offset) = (h.placement, h.class, h.raw_offset());
    h.mark_freed();
    drop(held);
    // SAFETY: the block is off every list and marked freed; this thread owns its memory now.
    unsafe {
        if placement == Placement::Heap {
            heap::give_back_block(header as *mut u8, class);
        } else {
            raw::release(header, raw_offset);
        }
    }
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
    let own = &SHARDS[me.shard.index as usize];
    let Some(mut held) = own.hold(me.number, me.shard.owned) else {
        return; // a signal handler inside its thread's change of its shard: the block stays live
    };
    // SAFETY: lookup saw a LIVE cookie at this header, which is ours.
    if !unsafe { (*header).claim() } {
        drop(held);
        return deallocate_raced(header, kind, start());
    }
    if me.shard.owned && held.queue_pending(header) {
        return;
    }
    drop(held);
    let world = StoppedWorld::stop(me.number);
    // SAFETY: claimed just above, and not queued.
    unsafe { settle_claimed_block(header, &world) };
}

/// Frees a claimed block, if it still is claimed: a block whose cookie changed since was freed
/// by a racing second free (reported then), and maybe reused.
///
/// # Safety
/// `header` is a header of ours that was claimed ([`BlockHeader::claim`]).
pub(crate) unsafe fn settle_claimed_block(header: *mut BlockHeader, world: &StoppedWorld) {
    // SAFETY: the world is stopped, so nobody changes the block while it is claimed, and a
    // claimed block is still on the list of its shard.
    unsafe {
        if (*header).is_claimed() {
            free_off_list(world.shard((*header).shard), header);
        }
    }
}

/// Another thread freed the same block between our lookup and our lock: a double free.
#[cold]
fn deallocate_raced(header: *mut BlockHeader, kind: BlockKind, start: StartFrame) {
    deallocate(BlockHeader::user_ptr(header), kind, || start);
}

#[cold]
#[inline(never)]
fn report_mismatch(header: *mut BlockHeader, kind: BlockKind, start: StartFrame) {
    // SAFETY: the block is live (LIVE cookie seen by lookup) and stays so until this thread
    // frees it after this report.
    let h = unsafe { &*header };
    let user = BlockHeader::user_ptr(header);
    bad_free(|| MemoryError {
        size: h.size,
        // SAFETY: `file` of a live block is null or a `__FILE__` literal of the program (for
        // `k15::memory::allocate`, the allocator's name, left out here).
        file: unsafe { crate::sys::c_str(h.file) }
            .filter(|_| h.kind != BlockKind::Named)
            .map(str::to_owned),
        line: h.line,
        thread: h.thread,
        allocated_with: Some(h.kind),
        alloc_stack: h.alloc_stack,
        ..MemoryError::at_free(
            ErrorKind::MismatchedDelete,
            user,
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
        allocator: Some(budget::POOL_NAME),
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

/// The stack of the call being reported (a bad free, a refused allocation). Called inside
/// the tracker: the unwinder's cold paths allocate.
fn capture_stack_of(start: StartFrame) -> StackId {
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
fn bad_free(error: impl FnOnce() -> MemoryError) {
    let _inside = Inside::enter();
    errors::report(error());
}

/// Counters of the whole process.
pub fn stats() -> Stats {
    if live_list::any_pending() {
        let _inside = Inside::enter();
        drop(StoppedWorld::stop(guard::thread_number())); // settles them
    }
    let t = live_list::totals();
    Stats {
        live_blocks: t.live_blocks,
        live_bytes: t.live_bytes,
        peak_bytes: t.peak_bytes,
        total_allocations: t.allocations,
        total_frees: t.frees,
    }
}
