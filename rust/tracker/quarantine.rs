//! `quarantine=SIZE`: freed blocks are filled with [`FILL`] and held back, first in first out,
//! until they add up to SIZE bytes (headers included); a block whose fill changed when it
//! leaves, at `check_heap()` or at exit was written after it was freed (`use_after_free`), and
//! one whose guard changed was written past its end after it was freed (`overrun`, with both
//! stacks): the guard of a held block is checked as a live block's is.
//! One list for the process behind one lock: quarantine is opt-in, and a debug run that asks for
//! it pays a lock per `delete`.

use super::errors::{self, Damage, ErrorKind, MemoryError};
use super::header::{BlockHeader, Placement, GUARD_BYTE};
use super::integrity::{self, FoundBy};
use super::BlockKind;
use crate::stack::StackId;
use core::sync::atomic::{AtomicUsize, Ordering};
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

/// The fill of a quarantined block's bytes (the CRT debug heap's "dead land").
pub const FILL: u8 = 0xdd;

/// One block held back: its header (freed, on no list, its memory not given back) and the
/// stack of the `delete` that freed it.
#[derive(Clone, Copy)]
struct Held {
    header: *mut BlockHeader,
    free_stack: StackId,
}

struct Quarantine {
    blocks: VecDeque<Held>,
    /// Bytes held, headers included.
    bytes: usize,
}

// SAFETY: the headers are blocks nobody else uses while they are held here.
unsafe impl Send for Quarantine {}

static QUARANTINE: Mutex<Quarantine> = Mutex::new(Quarantine {
    blocks: VecDeque::new(),
    bytes: 0,
});

/// The bytes the quarantine may hold (0: off), from the options.
static LIMIT: AtomicUsize = AtomicUsize::new(0);

fn quarantine() -> MutexGuard<'static, Quarantine> {
    QUARANTINE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Held by `fork` (see `tracker::fork`).
pub(crate) fn lock_for_fork() -> MutexGuard<'static, impl Sized> {
    quarantine()
}

/// Sets the quarantine's size (the tracker's set-up, from the options).
pub fn set_limit(bytes: usize) {
    LIMIT.store(bytes, Ordering::Relaxed);
}

/// What a block costs the quarantine: its bytes and its header.
fn footprint(h: &BlockHeader) -> usize {
    h.size() + super::header::HEADER_SIZE
}

/// Takes a freed block (marked freed, on no list, its free stack in its first bytes when it
/// has room) instead of giving its memory back; with `evict`, gives back the oldest blocks beyond
/// the limit, reporting those written to meanwhile (without, the next `hold` does: the caller
/// may not report now). Called inside the tracker, no shard held but for a stopped world.
///
/// # Safety
/// `header` is a block of ours, freed and off its list, that nobody else uses.
pub unsafe fn hold(header: *mut BlockHeader, evict: bool) {
    // SAFETY: guaranteed by the caller.
    let h = unsafe { &*header };
    let user = BlockHeader::user_ptr(header);
    // SAFETY: the free path recorded the stack in the block's first bytes (`record_free_stack`).
    let free_stack = unsafe { super::recorded_free_stack(user) };
    // The free stack's 4 bytes lie over the first guard bytes of a block of fewer bytes: those
    // are written again (the `delete` checked them before), so that the guard shows only what
    // is written after the free.
    let under_stack = core::mem::size_of::<StackId>()
        .saturating_sub(h.size())
        .min(h.guard_len());
    // SAFETY: the block's user bytes and its guard are ours again.
    unsafe {
        core::ptr::write_bytes(user, FILL, h.size());
        core::ptr::write_bytes(user.wrapping_add(h.size()), GUARD_BYTE, under_stack);
    }
    let leaving = {
        let mut q = quarantine();
        q.bytes += footprint(h);
        q.blocks.push_back(Held { header, free_stack });
        let limit = LIMIT.load(Ordering::Relaxed);
        let mut leaving = Vec::new();
        while evict && q.bytes > limit {
            let Some(oldest) = q.blocks.pop_front() else {
                break;
            };
            // SAFETY: a held block's header is intact unless written in front of its bytes.
            q.bytes -= footprint(unsafe { &*oldest.header });
            leaving.push(oldest);
        }
        leaving
    };
    let mut problems = Vec::new();
    for block in leaving {
        inspect(block, FoundBy::Delete, &mut problems);
        // SAFETY: out of the quarantine, the block is nobody's: its memory goes back.
        unsafe { give_back(block.header, block.free_stack) };
    }
    report(problems, StackId(0));
}

/// Whether `header` is held here, and the stack of its `delete` (for a second `delete` of it).
pub fn free_stack_of(header: *mut BlockHeader) -> Option<StackId> {
    if LIMIT.load(Ordering::Relaxed) == 0 {
        return None;
    }
    quarantine().free_stack_of(header)
}

/// [`free_stack_of`] where the quarantine's lock may be held by a thread stopped with the world
/// (heap checks): `None` when it is held.
pub fn free_stack_of_without_waiting(header: *mut BlockHeader) -> Option<StackId> {
    if LIMIT.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let q = match QUARANTINE.try_lock() {
        Ok(q) => q,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => return None,
    };
    q.free_stack_of(header)
}

impl Quarantine {
    fn free_stack_of(&self, header: *mut BlockHeader) -> Option<StackId> {
        self.blocks
            .iter()
            .find(|held| held.header == header)
            .map(|held| held.free_stack)
    }
}

/// Checks every held block's fill (`check_heap()`, reports): each change is reported with
/// `checked_by`'s stack and filled again. Returns the number found.
pub fn check_all(found_by: FoundBy, checked_by: StackId) -> usize {
    let mut problems = Vec::new();
    {
        let q = quarantine();
        for &block in &q.blocks {
            inspect(block, found_by, &mut problems);
        }
    }
    let count = problems.len();
    report(problems, checked_by);
    count
}

/// The errors of a held block: a `use_after_free` where its fill changed, an `overrun` where
/// the guard behind it did (a write just past the end of a freed block, as valgrind's "0 bytes
/// after a block of size 10 free'd"), each with the block's allocation and free stacks and
/// repaired after, so that it is reported once. A block whose size fills its class has no guard:
/// the next block's header behind it is checked as for a live block.
fn inspect(block: Held, found_by: FoundBy, problems: &mut Vec<MemoryError>) {
    // SAFETY: a held block, whose bytes nobody may use.
    let h = unsafe { &mut *block.header };
    let user = BlockHeader::user_ptr(block.header);
    // SAFETY: as above.
    let bytes = unsafe { core::slice::from_raw_parts_mut(user, h.size()) };
    let allocated_with = h.kind();
    let error = |kind, damage| MemoryError {
        damage,
        detail: Some(match found_by {
            FoundBy::Delete => "found when the block left quarantine",
            _ => found_by.detail().unwrap_or(""),
        }),
        previous_free_stack: block.free_stack,
        ..integrity::block_error(kind, block.header, allocated_with, StackId(0))
    };
    // The common case, in one vectorised pass.
    if !bytes.iter().all(|&b| b == FILL) {
        if let Some(damage) = Damage::against_fill(0, bytes, FILL) {
            bytes.fill(FILL);
            problems.push(error(ErrorKind::UseAfterFree, Some(damage)));
        }
    }
    if !h.guard_intact() {
        let damage = Damage::against_fill(h.size() as isize, &h.guard_bytes(), GUARD_BYTE);
        h.restore_guard();
        problems.push(error(ErrorKind::Overrun, damage));
    }
}

fn report(problems: Vec<MemoryError>, checked_by: StackId) {
    for problem in problems {
        errors::report(MemoryError {
            free_stack: checked_by,
            freed_with: BlockKind::New,
            ..problem
        });
    }
}

/// Gives a block's memory back, as the free path would have.
///
/// # Safety
/// `header` left the quarantine: freed, on no list, nobody's.
unsafe fn give_back(header: *mut BlockHeader, free_stack: StackId) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        let h = &*header;
        // As the free path left it: a second `delete` still finds who freed the block first.
        BlockHeader::user_ptr(header)
            .cast::<StackId>()
            .write_unaligned(free_stack);
        if h.placement() == Placement::Heap {
            super::heap::give_back_block(header.cast(), h.class());
        } else {
            super::raw::release(header, h.raw_offset(), true);
        }
    }
}
