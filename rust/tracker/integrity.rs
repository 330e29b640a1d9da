//! Heap integrity: the guard behind each block and the check word in front of it, verified at
//! `delete`, by `check_heap()` and by every report; damage is reported with the block's stacks
//! and the bytes found, then repaired so that it is reported once and the program goes on.

use super::errors::{self, Damage, ErrorKind, MemoryError};
use super::guard::{self, Inside};
use super::header::{BlockHeader, GUARD_BYTE, GUARD_SIZE};
use super::live_list::{HeldShard, StoppedWorld};
use crate::ffi::BlockKind;
use crate::stack::{StackId, StartFrame};

/// Who found a problem: says so in the report, beside the stack of that call.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum FoundBy {
    /// The `delete` of the block (its stack is the free stack).
    Delete,
    /// `check_heap()` (its stack is the free stack).
    CheckHeap,
    /// The heap check of a report (at exit, or `write_leak_report`).
    Report,
}

impl FoundBy {
    /// The error's `detail`: none for a `delete`, whose stack says it all.
    pub fn detail(self) -> Option<&'static str> {
        match self {
            FoundBy::Delete => None,
            FoundBy::CheckHeap => Some(CHECK_HEAP_DETAIL),
            FoundBy::Report => Some(REPORT_DETAIL),
        }
    }
}

pub const CHECK_HEAP_DETAIL: &str = "found by check_heap()";
pub const REPORT_DETAIL: &str = "found by the report's heap check";

/// The error about the live block at `header`, with what its header tells.
pub fn block_error(
    kind: ErrorKind,
    header: *mut BlockHeader,
    freed_with: BlockKind,
    free_stack: StackId,
) -> MemoryError {
    // SAFETY: callers pass a header of ours that stays unchanged while this runs (the block is
    // live and being freed by this thread, or the world is stopped).
    let h = unsafe { &*header };
    MemoryError {
        size: h.size,
        // SAFETY: `file` of a live block is null or a `__FILE__` literal of the program.
        file: unsafe { crate::sys::c_str(h.file) }.map(str::to_owned),
        line: h.line,
        thread: h.thread,
        allocated_with: Some(h.kind),
        alloc_stack: h.alloc_stack,
        ..MemoryError::at_free(kind, BlockHeader::user_ptr(header), freed_with, free_stack)
    }
}

/// What is wrong with the guard and check word of a live block (a damaged check word of a
/// block that is still recognisable, see [`BlockHeader::underrun_bytes`]), repaired as it is
/// found: the errors carry no stacks yet.
fn inspect(header: *mut BlockHeader, found_by: FoundBy, problems: &mut Vec<MemoryError>) {
    // SAFETY: as in block_error; repairing the guard and cookie changes only bytes the tracker
    // owns.
    let h = unsafe { &mut *header };
    if let Some(damaged) = h.underrun_bytes() {
        let found = h.cookie_bytes();
        h.restore_live_cookie();
        let damage = Damage::between(-8, &found, &h.cookie_bytes());
        debug_assert!(damaged > 0 && damage.is_some());
        problems.push(MemoryError {
            damage,
            detail: found_by.detail(),
            ..block_error(ErrorKind::Underrun, header, h.kind, StackId(0))
        });
    }
    if !h.guard_intact() {
        let damage = Damage::between(h.size as isize, &h.guard_bytes(), &[GUARD_BYTE; GUARD_SIZE]);
        h.restore_guard();
        problems.push(MemoryError {
            damage,
            detail: found_by.detail(),
            ..block_error(ErrorKind::Overrun, header, h.kind, StackId(0))
        });
    }
}

/// Reports the damage around a live block being freed by `freed_with` (cold: only when the
/// fast check saw some), and repairs it so that the free goes on.
#[cold]
#[inline(never)]
pub fn report_at_delete(header: *mut BlockHeader, freed_with: BlockKind, start: StartFrame) {
    let _inside = Inside::enter();
    let mut problems = Vec::new();
    inspect(header, FoundBy::Delete, &mut problems);
    report_all(problems, Some(start), freed_with);
}

/// Every live block of `held`'s list, checked (and repaired) on the way; `visit` sees each.
pub fn check_list(
    held: &HeldShard<'_>,
    found_by: FoundBy,
    problems: &mut Vec<MemoryError>,
    mut visit: impl FnMut(*mut BlockHeader),
) {
    for header in held.blocks() {
        // SAFETY: a header on a held list, which nobody else changes meanwhile.
        let h = unsafe { &*header };
        if h.is_live() || h.underrun_bytes().is_some() {
            inspect(header, found_by, problems);
            visit(header);
        }
    }
}

/// Reports problems found with no stack yet: each gets `start`'s stack (the `delete` or the
/// `check_heap()` call), none for a report's check. Called inside the tracker, no shard held.
pub fn report_all(problems: Vec<MemoryError>, start: Option<StartFrame>, freed_with: BlockKind) {
    if problems.is_empty() {
        return;
    }
    let stack = start.map_or(StackId(0), super::capture_stack_of);
    for problem in problems {
        errors::report(MemoryError {
            free_stack: stack,
            freed_with,
            ..problem
        });
    }
}

/// `check_heap()`: every live block's guard and check word, with the world stopped; each problem
/// is reported (with `start`'s stack) and repaired. Returns how many were found.
pub fn check_heap(start: StartFrame) -> usize {
    let _inside = Inside::enter();
    let mut problems = Vec::new();
    {
        let world = StoppedWorld::stop(guard::thread_number());
        for held in world.shards() {
            check_list(&held, FoundBy::CheckHeap, &mut problems, |_| {});
        }
    }
    let count = problems.len();
    report_all(problems, Some(start), BlockKind::New);
    count
}
