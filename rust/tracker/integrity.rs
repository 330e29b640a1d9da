//! Heap integrity: the guard behind each block and the check word in front of it, verified at
//! `delete`, by `check_heap()` and by every report; damage is reported with the block's stacks
//! and the bytes found, then repaired so that it is reported once and the program goes on.

use super::errors::{self, Damage, ErrorKind, MemoryError};
use super::guard::{self, Inside};
use super::header::{
    far_links, far_prefix, BlockHeader, FirstWordDamage, Layout, GUARD, GUARD_BYTE, GUARD_SIZE,
    HEADER_SIZE,
};
use super::heap::HeapBlock;
use super::live_list::{HeldShard, StoppedWorld};
use super::overrun_reach::{self, REACH};
use super::BlockKind;
use crate::stack::{StackId, StartFrame};
use core::fmt::Write;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

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
/// An overrun found where it landed, in the header of the next block, when that block was freed
/// or handed out again (or carved: a span's guard word).
const FOUND_BEHIND_DETAIL: &str =
    "found in the header behind the block, when the block there was freed or handed out; repaired";

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
        size: h.size(),
        file: file_of(h),
        line: h.line(),
        thread: h.thread(),
        allocated_with: Some(h.kind()),
        alloc_stack: h.alloc_stack(),
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
    if h.underrun_bytes().is_some() {
        problems.push(underrun_repaired(header, found_by));
    }
    if !h.guard_intact() {
        let found = h.guard_bytes();
        let damage = Damage::against_fill(h.size() as isize, &found, GUARD_BYTE);
        let user = BlockHeader::user_ptr(header) as usize;
        let block = super::heap::block_containing(user).filter(|b| b.user() == user);
        let shown = damage.is_some_and(|d| {
            let at = user.wrapping_add_signed(d.offset);
            found_log_within().is_some_and(|mut log| {
                let shown = log.shown_in_block(at, d.bytes(), block);
                if !shown {
                    // Reaches of blocks this memory held before: the one reported now replaces them.
                    log.forget_reaches_in(block);
                }
                shown
            })
        });
        let reach = (!shown).then(|| reach_past_guard(user, h.size())).flatten();
        h.restore_guard();
        if !shown {
            problems.push(MemoryError {
                damage: reach.as_ref().map_or(damage, |(shown, _)| Some(*shown)),
                victim: reach.and_then(|(_, victim)| victim),
                detail: found_by.detail(),
                ..block_error(ErrorKind::Overrun, header, h.kind(), StackId(0))
            });
        }
    }
}

/// The `underrun` of the block at `header`, whose cookie (the bytes in front of its user pointer)
/// was changed and is written back as a live block's, so that it is reported once.
fn underrun_repaired(header: *mut BlockHeader, found_by: FoundBy) -> MemoryError {
    // SAFETY: as in inspect.
    let h = unsafe { &mut *header };
    let found = h.cookie_bytes();
    h.restore_live_cookie();
    underrun_error(header, &found, found_by)
}

/// The `underrun` of the block at `header`, repaired already, whose last `found.len()` bytes in
/// front of its user pointer were `found`: the bytes that differ from those there now.
fn underrun_error(header: *mut BlockHeader, found: &[u8], found_by: FoundBy) -> MemoryError {
    let user = BlockHeader::user_ptr(header);
    // SAFETY: as in inspect; `found` is at most the header's bytes in front of the user pointer.
    let (now, kind) = unsafe {
        (
            core::slice::from_raw_parts(user.wrapping_sub(found.len()), found.len()),
            (*header).kind(),
        )
    };
    MemoryError {
        damage: Damage::between(-(found.len() as isize), found, now),
        detail: found_by.detail(),
        ..block_error(ErrorKind::Underrun, header, kind, StackId(0))
    }
}

/// The `underrun` of a block from outside the heap reached on the list of `held` (the world
/// stopped), repaired: on the list, so ours, a check word an underrun replaced whole is written
/// again, and a header it replaced further is put back from its copy
/// ([`BlockHeader::restore_far_copy`]). `None` where its header shows no such damage, or where
/// the block's links no longer tie it into the list (a list repair, made on the way there, cut
/// it out: made live again, it would lead to neighbours that may go).
fn listed_block_repaired(
    held: &HeldShard<'_>,
    header: *mut BlockHeader,
    found_by: FoundBy,
) -> Option<MemoryError> {
    // SAFETY: a header reached on a held list, readable with its prefix, the world stopped.
    let h = unsafe { &*header };
    // SAFETY: as above, the shard held.
    if !held.may_repair() || h.cookie_valid(Layout::Full) || unsafe { !held.links_agree(header) } {
        return None;
    }
    if h.underrun_bytes_of_listed().is_some() {
        return Some(underrun_repaired(header, found_by));
    }
    // SAFETY: as above.
    let found = unsafe { BlockHeader::restore_far_copy(header, held.index()) }?;
    Some(underrun_error(header, &found, found_by))
}

/// Where the damaged guard of the live heap block at `user` runs on into the headers behind it:
/// the whole overrun's bytes (remembered as shown, so that the damage behind is not reported
/// again when it is found) and the first block whose header it reached.
fn reach_past_guard(user: usize, size: usize) -> Option<(Damage, Option<usize>)> {
    let block = super::heap::block_containing(user).filter(|b| b.user() == user)?;
    let end = block.start + block.size;
    let reach = overrun_reach::reach_behind(block, size).filter(|r| r.range.end > end)?;
    let shown = remember_reach(reach.range.start, &reach.bytes(), user);
    repair_behind_if_alone(block, reach.range.end);
    Some((shown, reach.victim))
}

/// Puts back the headers behind the heap block `front` up to `end` that a write past its end
/// damaged (shown already), where no other thread can be changing them: a first word from its
/// check word, a live block's header from its record. Those left damaged (a free block's whole
/// header) are found again where they are next read, and shown there as part of this overrun
/// while it is remembered.
fn repair_behind_if_alone(front: HeapBlock, end: usize) {
    if !super::threads::alone() {
        return;
    }
    let mut at = front.start + front.size;
    while at < end {
        let Some(super::spans::Found::Block(header, layout)) =
            super::spans::behind(at, front.class as usize)
        else {
            break;
        };
        // SAFETY: a header carved in a span, which no other thread uses (alone): read, and put
        // back where its check word or record vouches for what it was.
        let repaired = unsafe {
            (*header).cookie_valid(layout) || BlockHeader::front_overrun(header, layout).is_some()
        };
        if !repaired {
            rebuilt_from_record(header);
        }
        at += front.size;
    }
}

/// `bytes`, found from `start` on past the block at `user`, as an overrun shows them;
/// remembered as shown.
fn remember_reach(start: usize, bytes: &[u8], user: usize) -> Damage {
    let shown = Damage::as_found((start - user) as isize, bytes);
    if let Some(mut log) = found_log_within() {
        let slot = log.next_reach % SHOWN_REACHES;
        let reach = Some(ShownReach { start, shown });
        if slot < log.reaches.len() {
            log.reaches[slot] = reach;
        } else {
            log.reaches.push(reach);
        }
        log.next_reach = slot + 1;
    }
    shown
}

/// Whether `found`, seen at `at`, lies within the bytes of an overrun reported already.
fn shown_already(at: usize, found: &[u8]) -> bool {
    found_log_within().is_some_and(|log| log.shown_already(at, found))
}

/// Reports the damage around a live block being freed by `freed_with` (cold: only when the
/// fast check saw some), and repairs it so that the free goes on.
#[cold]
#[inline(never)]
pub fn report_at_delete(header: *mut BlockHeader, freed_with: BlockKind, start: StartFrame) {
    let _inside = Inside::enter();
    let mut problems = Vec::new();
    inspect(header, FoundBy::Delete, &mut problems);
    report_all(problems, super::capture_stack_of(start), freed_with);
}

/// At the `delete` of a heap block whose class leaves it no guard bytes: the word behind its last
/// byte is the next block's header (or a span's guard word), where a write past its end lands.
/// Another thread may be changing that header right now, so damage seen there is only noted, as
/// a suspect, with this block's allocation and this `delete`'s stack; it is reported once it is
/// found for certain where that header or word is next read by whoever holds it (the next
/// block's `delete` or reuse, `check_heap()`, its span emptying, the report), as an overrun of
/// this block. A suspect that is never confirmed (a header caught mid-change) is never reported.
#[inline(always)]
pub fn look_behind_exact_fit(header: *mut BlockHeader, start: impl Fn() -> StartFrame) {
    // SAFETY: the live block being freed by this thread: its header is its own.
    let h = unsafe { &*header };
    let at = BlockHeader::user_ptr(header) as usize + h.size();
    // Nearly always a block of the class lies there, its header whole: one check of its cookie
    // (read only; whatever lies there, a valid cookie rules damage out). Else, where the block is
    // the last one carved from its span (the first a thread's new list hands out), the span's
    // guard word, whole. Only a heap block has no guard, so both lie in the heap.
    let layout = Layout::of_class(h.class() as usize);
    let next = (at - (HEADER_SIZE - layout.front())) as *mut BlockHeader;
    let intact_behind = super::spans::span_holds(at, layout.front())
        // SAFETY: the header's part in the block lies within the span (checked first), readable,
        // and holds the 8 bytes at `at` (a header's part is at least 16 bytes).
        && unsafe {
            (*next).cookie_valid_where(layout, true) || (at as *const u64).read_volatile() == GUARD
        };
    if !intact_behind {
        look_closer_behind(header, at, start);
    }
}

/// [`look_behind_exact_fit`] where the cookie there did not hold: a guard word, damage, or a
/// header changing under another thread's hands.
#[cold]
#[inline(never)]
fn look_closer_behind(header: *mut BlockHeader, at: usize, start: impl Fn() -> StartFrame) {
    // SAFETY: as in look_behind_exact_fit.
    let h = unsafe { &*header };
    let Some((_, class)) = super::spans::serving_span(at - 1) else {
        return;
    };
    let behind = super::spans::behind(at, class);
    let damaged = match behind {
        // SAFETY: a guard word inside the span, readable (another thread may be carving a block
        // over it: then it reads otherwise, and nothing confirms the suspect).
        Some(super::spans::Found::GuardWord(word)) => (unsafe { word.read_volatile() }) != GUARD,
        // SAFETY: a header carved in the span, readable; only read (as above if it changes).
        Some(super::spans::Found::Block(next, layout)) => unsafe { !(*next).cookie_valid(layout) },
        None => false,
    };
    if !damaged {
        return;
    }
    let _inside = Inside::enter();
    if let Some(super::spans::Found::Block(next, layout)) = behind {
        if is_left_alone(next) {
            return report_into_left_alone(header, next, layout, super::capture_stack_of(start()));
        }
    }
    // SAFETY: as for the guard word above.
    let found = unsafe { (at as *const u64).read_volatile() }.to_ne_bytes();
    let suspect = Suspect {
        at,
        found,
        block: Culprit::of(h, header, super::capture_stack_of(start())),
    };
    let mut log = found_log();
    // Seen before: an earlier block here wrote it (this one reused its memory since).
    if log
        .suspects
        .iter()
        .any(|s| s.is_some_and(|s| s.at == at && s.found == found))
    {
        return;
    }
    let slot = log.next_suspect % SUSPECTS;
    log.suspects[slot] = Some(suspect);
    log.next_suspect = slot + 1;
    drop(log);
    confirm_if_alone(behind);
}

/// Where no other thread has used the tracker, nobody can be changing what lies behind a block
/// being deleted: the damage seen there (and just noted as a suspect) is found for certain now,
/// as it would be where that header or word is next read, unless it is a write in front of the
/// block behind's own bytes (an underrun, which changes its check word's top bytes first).
fn confirm_if_alone(behind: Option<super::spans::Found>) {
    use super::spans::Found;
    let error = match behind {
        Some(Found::Block(next, layout)) if super::threads::alone() => {
            // SAFETY: a header carved in a span, which no other thread uses (alone): read, and
            // put back where its check word or record vouches for what it was.
            unsafe {
                if (*next).underrun_bytes().is_some() {
                    return;
                }
                match BlockHeader::front_overrun(next, layout) {
                    Some(damage) => {
                        front_overrun_error(BlockHeader::exposed_word_at(next, layout), damage)
                    }
                    None => damaged_beyond_repair(
                        next,
                        layout,
                        Corrupted::Header,
                        BlockKind::New,
                        StackId(0),
                    ),
                }
            }
        }
        Some(Found::GuardWord(word)) if super::threads::alone() => {
            // SAFETY: a guard word inside a span, which no other thread uses (alone).
            let found = unsafe { word.read() };
            // SAFETY: as above.
            unsafe { word.write(GUARD) };
            let damage = FirstWordDamage {
                found: found.to_ne_bytes(),
                was: GUARD.to_ne_bytes(),
            };
            front_overrun_error(word as usize, damage)
        }
        _ => None,
    };
    if let Some(error) = error {
        errors::report(error);
    }
}

/// At the `delete` of the exact fit at `header` (its stack `stack`): damage in the header behind
/// it, `next`, of a block left alone since its own header was found damaged beyond repair
/// (nobody else reads or writes it), is this block's overrun for certain: reported now, with all
/// its bytes, and `next` marked again, so that a later overrun into it is seen too (a suspect
/// would be confirmed only by the report's walk, by which time a later overrun may have written
/// over this one).
fn report_into_left_alone(
    header: *mut BlockHeader,
    next: *mut BlockHeader,
    layout: Layout,
    stack: StackId,
) {
    // SAFETY: the live block being freed by this thread: its header is its own.
    let h = unsafe { &*header };
    let user = BlockHeader::user_ptr(header) as usize;
    let Some(reach) = super::heap::block_containing(user)
        .filter(|b| b.user() == user)
        .and_then(|block| overrun_reach::reach_behind(block, h.size()))
    else {
        return;
    };
    let bytes = reach.bytes();
    // Reported already where another header it reached was found first.
    let reported = shown_already(reach.range.start, &bytes);
    // SAFETY: a header of the heap that only the tracker reads or writes (left alone).
    unsafe { (*next).mark_damaged(layout) };
    if reported {
        return;
    }
    // Remembered, so that the free list through `next`, when it is next walked, finds this
    // damage shown.
    let shown = remember_reach(reach.range.start, &bytes, user);
    errors::report(MemoryError {
        victim: reach.victim,
        ..Culprit::of(h, header, stack).overrun_showing(Some(shown), None)
    });
}

/// Whether `header` is that of a block left alone since its header was found damaged beyond
/// repair ([`damaged_beyond_repair`]), as far as the log remembers.
fn is_left_alone(header: *mut BlockHeader) -> bool {
    found_log_within()
        .is_some_and(|log| log.left_alone[..log.left_alone_count].contains(&(header as usize)))
}

/// Every live block (on the shards' lists and in the heap), checked and repaired on the way;
/// `visit` sees each.
pub fn check_live_blocks(
    world: &StoppedWorld,
    found_by: FoundBy,
    problems: &mut Vec<MemoryError>,
    mut visit: impl FnMut(*mut BlockHeader),
) {
    for held in world.shards() {
        check_list(&held, found_by, problems, &mut visit);
    }
    check_heap_blocks(world, found_by, problems, visit);
}

/// Every live block of the heap, checked (and repaired) on the way, and the headers and guard
/// words between them; `visit` sees each live block. Damage beside the blocks (a header that
/// is no state of ours, a changed guard word) is looked for only where nobody can be writing
/// one: every shard settled (a thread the world could not stop may be in the middle of a new
/// header) and the span's class lock held (blocks given back to a class are relinked).
fn check_heap_blocks(
    world: &StoppedWorld,
    found_by: FoundBy,
    problems: &mut Vec<MemoryError>,
    mut visit: impl FnMut(*mut BlockHeader),
) {
    let settled = world.all_settled() && !super::live_list::settling_stopped();
    super::spans::for_each_block(settled, |found, still| match found {
        super::spans::Found::Block(header, layout) => {
            // SAFETY: a block carved from a span, which nobody changes but by a claim while the
            // world is stopped and its class lock held (see `for_each_block`).
            let h = unsafe { &mut *header };
            if h.is_live() || h.underrun_bytes().is_some() {
                inspect(header, found_by, problems);
                visit(header);
            } else if settled && still && !h.cookie_valid(layout) {
                problems.extend(damaged_heap_header(header, layout, found_by));
                if h.is_live() {
                    visit(header); // rebuilt from its record
                }
            }
        }
        super::spans::Found::GuardWord(word) => {
            // SAFETY: a guard word inside a span, readable.
            let found = unsafe { word.read() };
            if settled && still && found != GUARD {
                // SAFETY: under its class lock, nobody else writes it.
                unsafe { word.write(GUARD) };
                let damage = FirstWordDamage {
                    found: found.to_ne_bytes(),
                    was: GUARD.to_ne_bytes(),
                };
                problems.extend(front_overrun_error(word as usize, damage).map(|error| {
                    MemoryError {
                        detail: found_by
                            .detail()
                            .or(Some(Corrupted::OverrunFromFront.detail())),
                        ..error
                    }
                }));
            }
        }
    });
}

/// The error for a heap header found damaged by a walk: repaired when only its first word went
/// (a write past the end of the block in front), else marked damaged and left alone (and the
/// block in front named, where it can be: [`blame_in_front`]). `None` where the damage is part
/// of an overrun reported already.
fn damaged_heap_header(
    header: *mut BlockHeader,
    layout: Layout,
    found_by: FoundBy,
) -> Option<MemoryError> {
    // SAFETY: a block of the heap, which nobody changes meanwhile (see check_heap_blocks).
    let error = match unsafe { BlockHeader::front_overrun(header, layout) } {
        Some(damage) => front_overrun_error(BlockHeader::exposed_word_at(header, layout), damage)?,
        None => damaged_beyond_repair(
            header,
            layout,
            Corrupted::Header,
            BlockKind::New,
            StackId(0),
        )?,
    };
    Some(MemoryError {
        detail: error.detail.or(found_by.detail()),
        ..error
    })
}

/// The error for the heap header at `header`, damaged beyond repair, found by a `delete` through
/// `freed_with` (its stack `free_stack`) or a walk: an overrun of the block in front where it can
/// be named ([`blame_in_front`]; `None` where that overrun was reported already), else
/// `heap_corruption` (saying `what` was damaged). The header is marked damaged: its block is left
/// alone from now on.
fn damaged_beyond_repair(
    header: *mut BlockHeader,
    layout: Layout,
    what: Corrupted,
    freed_with: BlockKind,
    free_stack: StackId,
) -> Option<MemoryError> {
    let blame = blame_in_front(BlockHeader::exposed_word_at(header, layout), None);
    // Read before the mark, which a compact header's bytes shown include.
    let found = header_bytes(header);
    let mut log = found_log_within();
    // Under the log, so that two threads freeing the same pointer do not both rebuild it.
    let rebuilt = log.is_some() && rebuilt_from_record(header);
    if !rebuilt {
        // SAFETY: a heap block's header (the caller's to check, or found by a walk with the
        // world stopped); marked so that it is reported once.
        unsafe { (*header).mark_damaged(layout) };
        if let Some(log) = log.as_mut() {
            let count = log.left_alone_count;
            if count < LEFT_ALONE && !log.left_alone[..count].contains(&(header as usize)) {
                log.left_alone[count] = header as usize;
                log.left_alone_count = count + 1;
            }
        }
    }
    drop(log);
    let detail = |error: &MemoryError| match error.detail {
        Some(RECORD_LOST_DETAIL) if rebuilt => Some(RECORD_KEPT_DETAIL),
        detail => detail,
    };
    match blame {
        Blame::Overrun(error) if error.free_stack == StackId(0) => Some(MemoryError {
            free_stack,
            freed_with,
            detail: detail(&error),
            ..*error
        }),
        Blame::Overrun(error) => Some(MemoryError {
            detail: detail(&error),
            ..*error
        }),
        Blame::Shown => None,
        Blame::Nobody => Some(corruption_error(
            header, what, found, freed_with, free_stack,
        )),
    }
}

/// What a heap header found damaged beyond repair is reported as.
enum Blame {
    /// An `overrun` of a block in front of it, named.
    Overrun(Box<MemoryError>),
    /// Nothing: the damage is part of an overrun reported already, its bytes shown there.
    Shown,
    /// Nobody to name: `heap_corruption`.
    Nobody,
}

/// The overrun that damaged the heap header whose exposed word lies at `at`: of the block in
/// front of it, or, where that block's header is damaged too, of the nearest one within
/// [`REACH`] bytes whose header holds, when the damage runs on from that block's end to here
/// ([`overrun_reach::reach_behind`]). The header is damaged beyond repair, or (`repaired`, its
/// exposed word as found) repaired already, behind a block whose own header is damaged. The
/// block named is the one seen at its `delete` with this damage behind it (a suspect, confirmed
/// now: its memory may serve another block since), else the live block there (its fields read,
/// then its cookie again, as its owner may free it meanwhile), else the freed one the quarantine
/// holds; nobody else (a block freed since it wrote, or never live, would be named on its
/// memory's word alone).
fn blame_in_front(at: usize, repaired: Option<[u8; 8]>) -> Blame {
    // SAFETY: a header of the heap, readable.
    let found =
        repaired.unwrap_or_else(|| unsafe { (at as *const u64).read_volatile() }.to_ne_bytes());
    if shown_already(at, &found) {
        return Blame::Shown;
    }
    let Some(front) = intact_in_front_of(at) else {
        return Blame::Nobody;
    };
    let end = front.start + front.size;
    // SAFETY: the block behind `front`, in the same span (its damaged header, or one between).
    let found_at_end = unsafe { (end as *const u64).read_volatile() }.to_ne_bytes();
    let suspect = found_log_within().and_then(|mut log| log.confirm_suspect(end, found_at_end));
    let (culprit, previous_free_stack, detail) = if let Some(suspect) = suspect {
        (suspect.block, StackId(0), SEEN_AT_DELETE)
    } else if let Some(live) = Culprit::live_in_front_of(end) {
        (live, StackId(0), RECORD_LOST_DETAIL)
    } else if let Some((held, free_stack)) = Culprit::held_in_front_of(end) {
        (held, free_stack, HELD_DETAIL)
    } else {
        return Blame::Nobody;
    };
    let Some(reach) = overrun_reach::reach_behind(front, culprit.size) else {
        return Blame::Nobody;
    };
    let shown = match repaired {
        None if reach.range.contains(&at) => {
            remember_reach(reach.range.start, &reach.bytes(), culprit.user)
        }
        // The damaged header right in front of `at` is the reach's last: the write crossed that
        // block's bytes to reach the word repaired at `at`.
        Some(found)
            if super::heap::block_containing(at - 1)
                .is_some_and(|adjacent| reach.range.end >= adjacent.user()) =>
        {
            let crossed = overrun_reach::bytes_at(reach.range.start..at);
            let bytes = [crossed.as_slice(), &found].concat();
            remember_reach(reach.range.start, &bytes, culprit.user)
        }
        _ => return Blame::Nobody,
    };
    Blame::Overrun(Box::new(MemoryError {
        previous_free_stack,
        victim: reach.victim,
        ..culprit.overrun_showing(Some(shown), Some(detail))
    }))
}

/// The nearest heap block in front of `at` (a block's start) whose header holds (in any state),
/// every block between them damaged, within [`REACH`] bytes of `at`.
fn intact_in_front_of(at: usize) -> Option<HeapBlock> {
    let mut end = at;
    while at - end < REACH {
        let front = super::heap::block_containing(end - 1).filter(|b| b.start + b.size == end)?;
        // SAFETY: a header carved in a span, readable; only read.
        if unsafe { (*front.header()).cookie_valid(front.layout()) } {
            return Some(front);
        }
        end = front.start;
    }
    None
}

/// Rebuilds the heap header at `header`, damaged beyond repair, from its block's record (a live
/// full block keeps one beside the heap: `BlockHeader::rebuild`); true when the block is
/// tracked again as it was allocated.
fn rebuilt_from_record(header: *mut BlockHeader) -> bool {
    let user = BlockHeader::user_ptr(header) as usize;
    super::heap::block_containing(user)
        .filter(|block| block.user() == user)
        // SAFETY: the header of a block carved in a span of that class; the caller holds the
        // found log or has stopped the world.
        .is_some_and(|block| unsafe { BlockHeader::rebuild(header, block.class) })
}

/// The detail of an overrun found where it damaged the header behind the block beyond repair,
/// rebuilt from the record kept beside the heap.
const RECORD_KEPT_DETAIL: &str = "found in the header behind the block, overwritten beyond repair: the block there (victim) is still tracked, its header rebuilt from the record kept beside the heap (its thread, sequence number and K15_NEW site are lost)";

/// The detail of an overrun found where it damaged the header behind the block beyond repair.
const RECORD_LOST_DETAIL: &str = "found in the header behind the block, overwritten beyond repair: the block there (victim) is no longer tracked";

/// The error for damage that a write past the end of the block in front of `at` did (to the
/// first word of the header there, or to a guard word of a span): an overrun of that block when
/// it is live or was seen so at its `delete` ([`look_behind_exact_fit`]), else heap corruption
/// at `at`. Has no stack yet unless it was seen at a `delete`. `None` where the damage is part of
/// an overrun reported already.
pub fn front_overrun_error(at: usize, damage: FirstWordDamage) -> Option<MemoryError> {
    if shown_already(at, &damage.found) {
        return None;
    }
    if let Some(suspect) =
        found_log_within().and_then(|mut log| log.confirm_suspect(at, damage.found))
    {
        return Some(suspect.block.overrun(at, damage, Some(SEEN_AT_DELETE)));
    }
    if let Some(front) = Culprit::live_in_front_of(at) {
        return Some(front.overrun(at, damage, None));
    }
    if let Some((held, free_stack)) = Culprit::held_in_front_of(at) {
        return Some(MemoryError {
            previous_free_stack: free_stack,
            ..held.overrun(at, damage, Some(HELD_DETAIL))
        });
    }
    // Behind a block whose header the same write damaged further.
    match blame_in_front(at, Some(damage.found)) {
        Blame::Overrun(error) => return Some(*error),
        Blame::Shown => return None,
        Blame::Nobody => {}
    }
    // The block behind, whose header's exposed word lies at `at` (none behind a span's last).
    let user = super::heap::block_containing(at)
        .filter(|b| b.start == at)
        .map_or(at + HEADER_SIZE, |b| b.user());
    Some(MemoryError {
        detail: Some(Corrupted::OverrunFromFront.detail()),
        damage: Damage::between(-((user - at) as isize), &damage.found, &damage.was),
        ..MemoryError::at_free(
            ErrorKind::HeapCorruption,
            user as *mut u8,
            BlockKind::New,
            StackId(0),
        )
    })
}

/// The detail of an overrun of a freed block held by the quarantine (a write just past its end
/// after its `delete`), found in the header behind.
const HELD_DETAIL: &str =
    "written after its delete: found in the header behind it, while in quarantine; repaired";

/// The link of the free heap block `block` once a write past the end of the block in front,
/// which changed it, is undone from its cookie (and recorded for the report); `None` when the
/// header holds no such damage.
#[cold]
#[inline(never)]
pub fn repair_free_link(block: *mut u8, layout: Layout) -> Option<*mut u8> {
    let header = block.cast::<BlockHeader>();
    if !super::heap::contains(block as usize) {
        return None;
    }
    // SAFETY: a block of the heap that the caller holds (a free block of its lists).
    let damage = unsafe { BlockHeader::front_overrun(header, layout) }?;
    found_front_overrun(BlockHeader::exposed_word_at(header, layout), damage);
    // SAFETY: as above.
    unsafe { BlockHeader::free_link(header, layout) }
}

/// Every live block of `held`'s list, checked (and repaired) on the way; `visit` sees each.
fn check_list(
    held: &HeldShard<'_>,
    found_by: FoundBy,
    problems: &mut Vec<MemoryError>,
    mut visit: impl FnMut(*mut BlockHeader),
) {
    for header in held.blocks() {
        // SAFETY: a header on a held list, which nobody else changes meanwhile.
        let h = unsafe { &*header };
        problems.extend(listed_block_repaired(held, header, found_by));
        if h.is_live() || h.underrun_bytes().is_some() {
            inspect(header, found_by, problems);
            visit(header);
        }
    }
}

/// Reports problems found with no stack yet: each gets `stack` (of the `delete` or the
/// `check_heap()` call; none for a report's check). Called inside the tracker, no shard held.
pub fn report_all(problems: Vec<MemoryError>, stack: StackId, freed_with: BlockKind) {
    for problem in problems {
        // An overrun seen at its block's `delete` keeps that `delete`'s stack and kind.
        let (free_stack, freed_with) = match problem.free_stack {
            StackId(0) => (stack, freed_with),
            own => (own, problem.freed_with),
        };
        errors::report(MemoryError {
            free_stack,
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
        check_live_blocks(&world, FoundBy::CheckHeap, &mut problems, |_| {});
    }
    let count = problems.len() + found_count();
    report_found();
    let stack = super::capture_stack_of(start);
    report_all(problems, stack, BlockKind::New);
    count + super::quarantine::check_all(FoundBy::CheckHeap, stack)
}

/// Damaged records found and not yet reported.
fn found_count() -> usize {
    let log = found_log();
    log.entries.iter().flatten().count() + log.dropped
}

/// What of the tracker's own records was found damaged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corrupted {
    /// A block's list links (the 16 bytes in front of its header); the list was rebuilt around it.
    Links,
    /// The list links of blocks beside this one; the blocks between them are no longer listed.
    LostBlocks,
    /// A link of a free list of the heap; the blocks behind it stay unused.
    FreeList,
    /// A block's whole header (size, stack, check word), seen when it was freed.
    Header,
    /// The first bytes of a heap header (or a span's guard word) behind a block that is no
    /// longer live: written past its end; repaired.
    OverrunFromFront,
    /// A free block's header, found when every block of its span had come back.
    FreeSpanHeader,
}

impl Corrupted {
    fn detail(self) -> &'static str {
        match self {
            Corrupted::Links => "the list links in front of this block's header were overwritten (by an overrun of the block in front of it in memory?); the tracker's list was repaired",
            Corrupted::LostBlocks => "the list links of the blocks next to this one were overwritten; blocks between them are no longer listed in reports",
            Corrupted::FreeList => "a free block's header was overwritten (by an overrun of the block in front of it in memory?); the heap leaves it and the blocks listed behind it unused",
            Corrupted::Header => "this block's header (size, stack, check word) was overwritten (by an overrun of the block in front of it in memory?); the block is no longer tracked and is left alone",
            Corrupted::OverrunFromFront => "the bytes in front of this address were overwritten past the end of the block in front of them, which is no longer live (a write after its delete?); restored",
            Corrupted::FreeSpanHeader => "a free block's header was overwritten (by an overrun of the block in front of it in memory?); found when every block of its span had been freed",
        }
    }
}

/// One damaged record, kept without allocating (it is found with a shard held) until it is
/// reported.
#[derive(Clone, Copy)]
struct Corruption {
    header: usize,
    what: Corrupted,
    found: Option<[u8; 16]>,
    /// For [`Corrupted::OverrunFromFront`]: the word as found and as it was, and the block that
    /// wrote it as it was known then: seen at its `delete` (`true`), or live in front.
    front: Option<FirstWordDamage>,
    culprit: Option<(Culprit, bool)>,
}

/// Damaged records found and not yet reported: a leaf lock (nothing else is taken under it),
/// held only to add or take records.
struct FoundLog {
    entries: [Option<Corruption>; 32],
    /// Records beyond the room above, counted only.
    dropped: usize,
    /// Damage seen behind blocks at their `delete`, not yet confirmed; the oldest give way.
    suspects: [Option<Suspect>; SUSPECTS],
    next_suspect: usize,
    /// The bytes of the latest overruns reported with the headers they reached: damage found
    /// within them later is theirs, not reported again; the oldest give way.
    /// A ring of at most [`SHOWN_REACHES`], grown as overruns are shown (the tracker's own memory:
    /// no program's data segment carries it).
    reaches: Vec<Option<ShownReach>>,
    next_reach: usize,
    /// The headers marked damaged beyond repair, whose blocks are left alone: the first
    /// [`LEFT_ALONE`] of them.
    left_alone: [usize; LEFT_ALONE],
    left_alone_count: usize,
}

/// Headers left alone that the log remembers (8 KiB): each is an error reported.
const LEFT_ALONE: usize = 1024;

/// Overruns' bytes kept as shown (see [`FoundLog::reaches`]; 120 bytes each, so at most 1.9 MiB
/// of the tracker's own memory, in a program that overruns blocks that often; read only where
/// damage is found). Damage a given-up free list keeps to the exit is shown again there once
/// this many later overruns have pushed its reach out: with 64, 21 errors in each of the
/// sweep's seeds of 4,096 overruns; with 1,024, 2.
const SHOWN_REACHES: usize = 16384;

/// The bytes of an overrun as reported: from `start` on.
#[derive(Clone, Copy)]
struct ShownReach {
    start: usize,
    shown: Damage,
}

impl ShownReach {
    /// Whether `found`, seen at `at`, lies within these bytes as shown.
    fn holds(&self, at: usize, found: &[u8]) -> bool {
        let shown = self.shown.bytes();
        at.checked_sub(self.start)
            .filter(|&offset| offset < shown.len())
            .is_some_and(|offset| shown[offset..].iter().zip(found).all(|(a, b)| a == b))
    }
}

/// Suspects kept at once (see [`look_behind_exact_fit`]): each is damage seen, rare outside a
/// program that writes past the ends of blocks over and over (18 KiB).
const SUSPECTS: usize = 256;

static FOUND: Mutex<FoundLog> = Mutex::new(FoundLog {
    entries: [None; 32],
    dropped: 0,
    suspects: [None; SUSPECTS],
    next_suspect: 0,
    reaches: Vec::new(),
    next_reach: 0,
    left_alone: [0; LEFT_ALONE],
    left_alone_count: 0,
});

impl FoundLog {
    /// Whether `found`, seen at `at`, is what an overrun reported already showed there (the
    /// same bytes: damage written there since is another's).
    fn shown_already(&self, at: usize, found: &[u8]) -> bool {
        self.reaches
            .iter()
            .flatten()
            .any(|reach| reach.holds(at, found))
    }

    /// Whether `found`, seen at `at` in the guard of the heap block `block` (a block outside the
    /// heap has no reach), lies within the bytes of an overrun reported already: one that ran
    /// into the block from in front of it, or the block's own, which starts at its guard (a
    /// reach starting elsewhere in the block is an earlier block's there: its guard was written
    /// again since).
    fn shown_in_block(&self, at: usize, found: &[u8], block: Option<HeapBlock>) -> bool {
        let Some(block) = block else {
            return self.shown_already(at, found);
        };
        self.reaches
            .iter()
            .flatten()
            .any(|reach| (reach.start < block.start || reach.start == at) && reach.holds(at, found))
    }

    /// Forgets the reaches that start in `block`: those of blocks its memory held before (its
    /// guard was written afresh since).
    fn forget_reaches_in(&mut self, block: Option<HeapBlock>) {
        if let Some(block) = block {
            let within = block.start..block.start + block.size;
            for reach in &mut self.reaches {
                if reach.as_ref().is_some_and(|r| within.contains(&r.start)) {
                    *reach = None;
                }
            }
        }
    }

    /// The suspect that saw `found` at `at`: the damage found there now is the damage it saw at
    /// its block's `delete`, so its block wrote it. It goes, now that the damage is repaired
    /// (suspects that saw other bytes there stay: damage written there again, found later).
    fn confirm_suspect(&mut self, at: usize, found: [u8; 8]) -> Option<Suspect> {
        self.suspects
            .iter_mut()
            .find(|s| s.is_some_and(|s| s.at == at && s.found == found))?
            .take()
    }
}

/// A block that, at its `delete`, had damage behind it ([`look_behind_exact_fit`]).
#[derive(Clone, Copy)]
struct Suspect {
    /// Where the damage lay, and its bytes then.
    at: usize,
    found: [u8; 8],
    block: Culprit,
}

/// What a block's header told of it when damage behind it was seen, kept because by the time
/// the damage is reported the block may be freed and its memory serve another.
#[derive(Clone, Copy)]
struct Culprit {
    user: usize,
    size: usize,
    /// `K15_NEW`'s `__FILE__` (a literal) as an address, or 0.
    file: usize,
    line: u32,
    kind: BlockKind,
    alloc_stack: StackId,
    /// The stack of its `delete`, when that is where the damage was seen.
    free_stack: StackId,
}

impl Culprit {
    /// What the header at `header` tells, with `free_stack`.
    fn of(h: &BlockHeader, header: *mut BlockHeader, free_stack: StackId) -> Culprit {
        Culprit {
            user: BlockHeader::user_ptr(header) as usize,
            size: h.size(),
            file: h.file() as usize,
            line: h.line(),
            kind: h.kind(),
            alloc_stack: h.alloc_stack(),
            free_stack,
        }
    }

    /// The live heap block whose bytes end at `at`, as its header tells now (its owner may free
    /// it meanwhile: the cookie, read again after the fields, says whether they are its).
    fn live_in_front_of(at: usize) -> Option<Culprit> {
        let front = super::heap::block_containing(at - 1).filter(|b| b.start + b.size == at)?;
        let header = front.header();
        // SAFETY: a block of the heap, readable; only read.
        let h = unsafe { &*header };
        let cookie = h.is_live().then(|| h.live_cookie())?;
        let culprit = Culprit::of(h, header, StackId(0));
        h.cookie_is(cookie).then_some(culprit)
    }

    /// The freed block that the quarantine holds with its bytes ending at `at`, and the stack of
    /// its `delete`.
    fn held_in_front_of(at: usize) -> Option<(Culprit, StackId)> {
        let front = super::heap::block_containing(at - 1).filter(|b| b.start + b.size == at)?;
        let header = front.header();
        let free_stack = super::quarantine::free_stack_of_without_waiting(header)?;
        // SAFETY: a block the quarantine holds: freed, its header as its `delete` left it, and
        // nobody's to change.
        let h = unsafe { &*header };
        Some((Culprit::of(h, header, StackId(0)), free_stack))
    }

    /// Its overrun that changed `damage.was` at `at` into `damage.found`: shown from its guard
    /// on where its guard lies in front of `at` (within [`REACH`] bytes) and the guard's last
    /// byte changed too, the write having run on over it (remembered as shown, so that the
    /// guard's damage, found at the block's `delete`, is not reported again).
    fn overrun(
        &self,
        at: usize,
        damage: FirstWordDamage,
        detail: Option<&'static str>,
    ) -> MemoryError {
        let behind = (self.user + self.size)..at;
        if (1..=REACH).contains(&behind.len()) {
            let crossed = overrun_reach::bytes_at(behind.clone());
            let guard = &crossed[..crossed.len().min(GUARD_SIZE)];
            if let Some(first) = guard.iter().position(|&b| b != GUARD_BYTE) {
                if guard.last() != Some(&GUARD_BYTE) {
                    let bytes = [&crossed[first..], &damage.found[..]].concat();
                    let shown = remember_reach(behind.start + first, &bytes, self.user);
                    return self.overrun_showing(Some(shown), detail);
                }
            }
        }
        let damage = Damage::between((at - self.user) as isize, &damage.found, &damage.was);
        self.overrun_showing(damage, detail)
    }

    /// Its overrun that left `damage`.
    fn overrun_showing(&self, damage: Option<Damage>, detail: Option<&'static str>) -> MemoryError {
        MemoryError {
            size: self.size,
            file: file_at(self.kind, self.file as *const core::ffi::c_char),
            line: self.line,
            allocated_with: Some(self.kind),
            alloc_stack: self.alloc_stack,
            detail,
            damage,
            ..MemoryError::at_free(
                ErrorKind::Overrun,
                self.user as *mut u8,
                self.kind,
                self.free_stack,
            )
        }
    }
}

/// The detail of an overrun seen behind the block at its `delete` and confirmed later.
pub const SEEN_AT_DELETE: &str = "seen at its delete in the header behind it (its class leaves it no guard bytes), confirmed when that header was next checked; repaired";

static ANY_FOUND: AtomicBool = AtomicBool::new(false);

/// Where the found-damage log lies: its records hold block and header addresses (of damage,
/// and of the blocks suspected of it), not the program's pointers, so a leak scan skips them.
pub fn found_log_range() -> core::ops::Range<usize> {
    crate::sys::bytes_of(&FOUND)
}

fn found_log() -> MutexGuard<'static, FoundLog> {
    FOUND.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The log for the readers a report runs, which may be an `exit` in a signal handler that
/// interrupted this very thread while it held the log: waited for within the tracker's patience
/// only, and `None` past it.
fn found_log_within() -> Option<MutexGuard<'static, FoundLog>> {
    super::live_list::lock_within(&FOUND)
}

/// Held by `fork` (see `tracker::fork`).
pub(crate) fn lock_for_fork() -> MutexGuard<'static, impl Sized> {
    found_log()
}

/// Records damage to the header at `header` (readable or not), to be reported by
/// [`report_found`] once no shard is held.
#[cold]
pub fn found_corruption(header: usize, what: Corrupted) {
    // Blocks lost from a list are named by a neighbour, whose bytes are intact.
    let found = match what {
        Corrupted::LostBlocks => None,
        _ => header_bytes(header as *mut BlockHeader),
    };
    log_corruption(header, what, found, None, None);
}

/// Records a write past the end of the block in front of `at` (found and repaired where a heap
/// header or a span's guard word lies), to be reported by [`report_found`]: as an overrun of
/// that block, when it is still live then.
#[cold]
pub fn found_front_overrun(at: usize, damage: FirstWordDamage) {
    let seen_live = Culprit::live_in_front_of(at);
    log_corruption(
        at,
        Corrupted::OverrunFromFront,
        None,
        Some(damage),
        seen_live,
    );
}

/// A block (any state) or guard word of a span whose blocks have all come back, before the span
/// leaves its class: the last look at it (its memory goes to another class or back to the OS).
/// Damage to a header's exposed word or to a guard word (a write past the end of the block in
/// front) is repaired and recorded; a header damaged beyond that is recorded as such.
///
/// # Safety
/// The span's class lock is held and every block of the span is back on its free list: nobody
/// reads or writes its headers and words meanwhile.
#[cold]
pub unsafe fn check_left_behind(found: super::spans::Found) {
    match found {
        super::spans::Found::Block(header, layout) => {
            // SAFETY: guaranteed by the caller.
            if unsafe { (*header).cookie_valid(layout) } {
                return;
            }
            // SAFETY: as above.
            match unsafe { BlockHeader::front_overrun(header, layout) } {
                Some(damage) => {
                    found_front_overrun(BlockHeader::exposed_word_at(header, layout), damage)
                }
                None => found_corruption(header as usize, Corrupted::FreeSpanHeader),
            }
        }
        super::spans::Found::GuardWord(word) => {
            // SAFETY: as above.
            let value = unsafe { word.read() };
            if value != GUARD {
                // SAFETY: as above.
                unsafe { word.write(GUARD) };
                let damage = FirstWordDamage {
                    found: value.to_ne_bytes(),
                    was: GUARD.to_ne_bytes(),
                };
                found_front_overrun(word as usize, damage);
            }
        }
    }
}

fn log_corruption(
    header: usize,
    what: Corrupted,
    found: Option<[u8; 16]>,
    front: Option<FirstWordDamage>,
    seen_live: Option<Culprit>,
) {
    let mut log = found_log();
    let seen = |e: &Option<Corruption>| e.is_some_and(|c| c.header == header && c.what == what);
    if log.entries.iter().any(seen)
        || front.is_some_and(|damage| log.shown_already(header, &damage.found))
    {
        return;
    }
    // Confirmed now, not when reported: a block that writes the same bytes there again after
    // the repair is seen at its own `delete` then, as a suspect of its own.
    let culprit = front
        .and_then(|damage| log.confirm_suspect(header, damage.found))
        .map(|suspect| (suspect.block, true))
        .or(seen_live.map(|live| (live, false)));
    match log.entries.iter_mut().find(|e| e.is_none()) {
        Some(slot) => {
            *slot = Some(Corruption {
                header,
                what,
                found,
                front,
                culprit,
            })
        }
        None => log.dropped += 1,
    }
    drop(log);
    ANY_FOUND.store(true, Ordering::Release);
    // Said at once, without allocating (a shard is held): the full error, with its stacks, comes
    // at the next free that leaves the heap, bad free, stats(), check_heap() or report.
    let mut line = crate::sys::StackBuffer::<160>::new();
    let _ = match front {
        Some(_) => writeln!(
            line,
            "k15-memory: a write past the end of a block reached {header:#x}; details follow in the report"
        ),
        None => writeln!(
            line,
            "k15-memory: heap_corruption at {:#x} ({what:?}); details follow in the report",
            header + HEADER_SIZE
        ),
    };
    line.flush_to_stderr();
}

/// Reports the damage found while shards were held, if any: one load when there is none.
/// Called with no shard held.
#[inline]
pub fn report_found() {
    if ANY_FOUND.load(Ordering::Relaxed) {
        report_found_now();
    }
}

#[cold]
#[inline(never)]
fn report_found_now() {
    let _inside = Inside::enter();
    let (entries, dropped) = {
        let Some(mut log) = found_log_within() else {
            return;
        };
        ANY_FOUND.store(false, Ordering::Relaxed);
        let entries: Vec<Corruption> = log.entries.iter_mut().filter_map(Option::take).collect();
        (entries, core::mem::take(&mut log.dropped))
    };
    for c in entries {
        errors::report(match (c.front, c.culprit) {
            (Some(damage), Some((culprit, at_delete))) => culprit.overrun(
                c.header,
                damage,
                Some(if at_delete {
                    SEEN_AT_DELETE
                } else {
                    FOUND_BEHIND_DETAIL
                }),
            ),
            (Some(damage), None) => match front_overrun_error(c.header, damage) {
                Some(error) => MemoryError {
                    detail: error.detail.or(Some(FOUND_BEHIND_DETAIL)),
                    ..error
                },
                None => continue,
            },
            (None, _) => match given_up_free_block(c.header, c.what) {
                Some(layout) => {
                    let header = c.header as *mut BlockHeader;
                    match damaged_beyond_repair(header, layout, c.what, BlockKind::New, StackId(0))
                    {
                        Some(error) => error,
                        None => continue,
                    }
                }
                // Shown since it was found: an overrun confirmed at the same `delete` (the free
                // list that led here was walked first), which repaired the header too.
                None if shown_since_found(&c) => continue,
                None => corruption_error(
                    c.header as *mut BlockHeader,
                    c.what,
                    c.found,
                    BlockKind::New,
                    StackId(0),
                ),
            },
        });
    }
    if dropped > 0 {
        let line = format!("k15-memory: {dropped} more damaged headers found, not listed\n");
        crate::sys::write_fd(2, line.as_bytes());
    }
}

/// Whether the header bytes a record found lie within an overrun reported after it was found.
fn shown_since_found(c: &Corruption) -> bool {
    let header = c.header as *mut BlockHeader;
    let at = BlockHeader::user_ptr(header) as usize - header_front(header);
    c.found.is_some_and(|found| shown_already(at, &found))
}

/// The layout of the free heap block at `header` whose damaged header a free list led to
/// ([`Corrupted::FreeList`]): its list was given up there, so nobody uses it and its header
/// stays as it was found (damaged beyond repair: [`damaged_beyond_repair`] names the block in
/// front where it can and leaves it alone). `None` for other records.
fn given_up_free_block(header: usize, what: Corrupted) -> Option<Layout> {
    let user = BlockHeader::user_ptr(header as *mut BlockHeader) as usize;
    if what != Corrupted::FreeList || super::heap::block_containing(user)?.user() != user {
        return None;
    }
    let layout = super::heap::layout_at(user);
    // SAFETY: a block of the heap, readable.
    (!unsafe { (*(header as *mut BlockHeader)).cookie_valid(layout) }).then_some(layout)
}

/// Whether `p` could be a header of ours at all (aligned, in user space): cheap enough for every
/// unlink, and enough to keep overwritten links (text, numbers) from being followed.
#[inline(always)]
pub fn could_be_header(p: *mut BlockHeader) -> bool {
    let p = p as usize;
    p.is_multiple_of(16) && (crate::sys::PAGE_SIZE..USER_SPACE_END).contains(&p)
}

/// The end of x86-64 user space (47-bit addresses).
const USER_SPACE_END: usize = 1 << 47;

/// Whether the `HEADER_SIZE` bytes of a header at `p` are mapped: at once for the heap, else asked of the
/// OS (a syscall; for rare non-heap blocks and for repairs).
pub fn readable(p: *mut BlockHeader) -> bool {
    could_be_header(p)
        && (super::heap::contains(p as usize) || {
            let start = p as usize;
            crate::sys::page_is_mapped(start)
                && crate::sys::page_is_mapped(start + super::header::HEADER_SIZE - 1)
        })
}

/// Whether `p` could be a block on a shard list: outside the heap (whose blocks are on none),
/// its header and the links in front of it readable.
fn could_be_far_block(p: *mut BlockHeader) -> bool {
    // The prefix runs into the header: the pages of their four ends are all of theirs.
    !super::heap::contains(p as usize) && readable(p) && readable(far_prefix(p).cast())
}

/// Whether the header at `p` is a far block's and one of ours: its cookie says so, or says a
/// live block whose check word an underrun damaged, or the copy in front of it vouches for a
/// live block that an underrun replaced the header of.
fn recognisable(p: *mut BlockHeader) -> bool {
    // SAFETY: read once it is known to be readable with its prefix.
    could_be_far_block(p)
        && unsafe {
            (*p).cookie_valid(Layout::Full)
                || (*p).underrun_bytes().is_some()
                || BlockHeader::far_copy_vouches(p)
        }
}

/// Whether `node` could be a far block whose back link leads to `from` (the block whose
/// forward link led to it).
///
/// # Safety
/// `from` is a header on a held list.
pub unsafe fn links_back(node: *mut BlockHeader, from: *mut BlockHeader) -> bool {
    // SAFETY: read once it is known to be readable.
    could_be_far_block(node) && unsafe { (*far_links(node)).prev == from }
}

/// Set once a list was repaired: the blocks a repair cut out keep links to neighbours that may be
/// freed since, so from then on a link is followed only to a block known to be readable and not
/// freed ([`could_be_neighbour`]). Until then (nearly every run) a link is trusted as written.
static LISTS_REPAIRED: AtomicBool = AtomicBool::new(false);

/// Whether the far block a link names may be read and linked to: plausible (see
/// [`could_be_header`]), and once a list was repaired, also readable (a live mapped block, the
/// own heap's memory, else as the OS says) and not freed.
pub fn could_be_neighbour(p: *mut BlockHeader) -> bool {
    use crate::sys::own_heap;
    if !could_be_header(p) {
        return false;
    }
    if !LISTS_REPAIRED.load(Ordering::Relaxed) {
        return true;
    }
    let (start, end) = (far_prefix(p) as usize, BlockHeader::user_ptr(p) as usize);
    let readable =
        super::mapped_blocks::holds(end) || own_heap::holds(start, end) || could_be_far_block(p);
    // SAFETY: read once it is known to be readable.
    readable && unsafe { !(*p).is_marked_freed() }
}

/// Rebuilds the list of `held` after a link was found damaged: forward from its head as long as
/// the links lead to headers of ours, backward from its tail likewise, and joins the two where
/// they meet (the block whose own links were damaged, now relinked) or, when more was damaged,
/// across the gap (the blocks in it are no longer listed). What was damaged is recorded.
pub fn repair_list(held: &HeldShard<'_>) {
    LISTS_REPAIRED.store(true, Ordering::Relaxed);
    let (head, tail) = held.ends();
    // SAFETY: the shard is held; every header is read only once `recognisable` says it is ours.
    unsafe {
        let mut forward_end: *mut BlockHeader = null_mut();
        let mut node = head;
        while !node.is_null() && recognisable(node) {
            let back = (*far_links(node)).prev;
            if back != forward_end && recognisable(back) {
                break; // a link into the middle of the list (or a cycle): not followed
            }
            if back != forward_end {
                found_corruption(node as usize, Corrupted::Links);
                (*far_links(node)).prev = forward_end;
            }
            forward_end = node;
            node = (*far_links(node)).next;
        }
        if node.is_null() {
            held.set_ends(head, forward_end);
            return; // the forward links were whole; the back links are mended
        }
        let mut backward_start: *mut BlockHeader = null_mut();
        let mut node = tail;
        while !node.is_null() && node != forward_end && recognisable(node) {
            let ahead = (*far_links(node)).next;
            if ahead != backward_start && recognisable(ahead) {
                break;
            }
            if ahead != backward_start {
                found_corruption(node as usize, Corrupted::Links);
                (*far_links(node)).next = backward_start;
            }
            backward_start = node;
            node = (*far_links(node)).prev;
        }
        if node != forward_end {
            // Named by a listed block beside the gap; with none left on either side (every
            // block's links damaged), by the list's first, now cut from it.
            let named = [forward_end, backward_start]
                .into_iter()
                .find(|block| !block.is_null())
                .unwrap_or(head);
            found_corruption(named as usize, Corrupted::LostBlocks);
        } else if !forward_end.is_null() && (*far_links(forward_end)).next != backward_start {
            found_corruption(forward_end as usize, Corrupted::Links);
        }
        if forward_end.is_null() {
            held.set_ends(
                backward_start,
                if backward_start.is_null() {
                    null_mut()
                } else {
                    tail
                },
            );
        } else {
            (*far_links(forward_end)).next = backward_start;
            held.set_ends(
                head,
                if backward_start.is_null() {
                    forward_end
                } else {
                    tail
                },
            );
        }
        if !backward_start.is_null() {
            (*far_links(backward_start)).prev = forward_end;
        }
    }
}

/// Pages searched backwards for the start of a large block that a bad pointer falls into.
const LARGE_BLOCK_SEARCH_PAGES: usize = 4096;

/// The error for a `delete` of `ptr`, at which no block of ours starts: a pointer into a live
/// block (past its start, such as a second base class) names that block and the offset; a
/// pointer to a heap block whose header was overwritten is `heap_corruption`; anything else is
/// a plain `invalid_free`. Nothing is freed either way.
#[cold]
/// Whether `addr` falls into a block of ours (the heap's, or a large mapped one), at its start
/// or inside it.
pub fn lies_in_tracked_block(addr: usize) -> bool {
    super::heap::block_containing(addr).is_some() || large_block_start(addr).is_some()
}

/// The error for a `delete` of `ptr` (see above): a heap block's header damaged beyond repair
/// names the overrun of the block in front where it can ([`damaged_beyond_repair`]); `None`
/// where that overrun was reported already.
pub fn foreign_free_error(
    ptr: *mut u8,
    freed_with: BlockKind,
    free_stack: StackId,
) -> Option<MemoryError> {
    let plain = MemoryError::at_free(ErrorKind::InvalidFree, ptr, freed_with, free_stack);
    let addr = ptr as usize;
    let (header, layout) = match super::heap::block_containing(addr) {
        Some(block) => (block.header(), block.layout()),
        None => match large_block_start(addr) {
            Some(header) => (header, Layout::Full),
            None => return Some(listed_underrun(ptr, freed_with, free_stack).unwrap_or(plain)),
        },
    };
    let user = BlockHeader::user_ptr(header) as usize;
    // SAFETY: a heap block's header, or one found mapped; only read.
    let h = unsafe { &*header };
    if h.is_live() && addr > user {
        return Some(MemoryError {
            interior_offset: Some(addr - user),
            ..block_error(ErrorKind::InvalidFree, header, freed_with, free_stack)
        });
    }
    if addr == user && !h.cookie_valid(layout) {
        if super::heap::contains(addr) {
            return damaged_beyond_repair(
                header,
                layout,
                Corrupted::Header,
                freed_with,
                free_stack,
            );
        }
        let found = header_bytes(header);
        return Some(corruption_error(
            header,
            Corrupted::Header,
            found,
            freed_with,
            free_stack,
        ));
    }
    Some(plain)
}

/// The `underrun` of a block from outside the heap (large or aligned over 64) at `ptr`, whose
/// cookie an underrun replaced so far that it no longer names the block
/// ([`BlockHeader::underrun_bytes`]): found on its shard's list with the world stopped, it is a
/// live block of ours; its cookie is repaired, so that the `delete` goes on to free it. `None`
/// where `ptr` is no such block.
fn listed_underrun(
    ptr: *mut u8,
    freed_with: BlockKind,
    free_stack: StackId,
) -> Option<MemoryError> {
    let header = BlockHeader::of(ptr);
    if !could_be_far_block(header) {
        return None;
    }
    // Read first, without stopping the world: a foreign pointer's header (its guard among
    // them) does not hold together. Where the underrun reached beyond the check word, the
    // header's copy names the list to look on.
    // SAFETY: readable with its prefix (above).
    let shard = unsafe {
        match (*header).underrun_bytes_of_listed() {
            Some(_) => (*header).shard(),
            None => BlockHeader::far_copy_shard(header),
        }
    };
    let world = StoppedWorld::stop(guard::thread_number());
    let held = world.shards().nth(shard as usize)?;
    if !held.blocks().any(|block| block == header) {
        return None;
    }
    Some(MemoryError {
        free_stack,
        freed_with,
        ..listed_block_repaired(&held, header, FoundBy::Delete)?
    })
}

/// The first 16 bytes of a readable header that are its block's (a far block's list links; a
/// compact heap block's `packed` and cookie), as found.
fn header_bytes(header: *mut BlockHeader) -> Option<[u8; 16]> {
    let first = BlockHeader::user_ptr(header).wrapping_sub(header_front(header));
    // SAFETY: read only when readable (a compact header's bytes lie within its full extent).
    readable(header).then(|| unsafe { (first as *const [u8; 16]).read() })
}

/// The bytes of the header at `header` that lie in front of its user pointer, as the span table
/// says for a heap block ([`header_bytes`] and [`corruption_error`] show them).
fn header_front(header: *mut BlockHeader) -> usize {
    super::heap::layout_at(BlockHeader::user_ptr(header) as usize).front()
}

/// A `heap_corruption` error about the header at `header`, with the bytes found there.
fn corruption_error(
    header: *mut BlockHeader,
    what: Corrupted,
    found: Option<[u8; 16]>,
    freed_with: BlockKind,
    free_stack: StackId,
) -> MemoryError {
    let user = BlockHeader::user_ptr(header);
    let at = -(header_front(header) as isize);
    MemoryError {
        detail: Some(what.detail()),
        damage: found.map(|found| Damage::as_found(at, &found)),
        ..MemoryError::at_free(ErrorKind::HeapCorruption, user, freed_with, free_stack)
    }
}

/// The header of a live block of our own mapping (`raw`: page-aligned user pointers, the header
/// at the end of the page before) that `addr` falls into, found page by page backwards.
fn large_block_start(addr: usize) -> Option<*mut BlockHeader> {
    use crate::sys::{page_is_mapped, PAGE_SIZE};
    let mut page = addr & !(PAGE_SIZE - 1);
    for _ in 0..LARGE_BLOCK_SEARCH_PAGES {
        if page < PAGE_SIZE || !page_is_mapped(page - 1) {
            return None;
        }
        let header = BlockHeader::of(page as *mut u8);
        // SAFETY: the header lies at the end of the page before `page`, mapped (checked above).
        let h = unsafe { &*header };
        if h.is_live() {
            return (addr < page + h.size()).then_some(header);
        }
        page -= PAGE_SIZE;
    }
    None
}

/// `break_on=THREAD/SEQ`: the allocation to stop at.
static BREAK_SEQ: AtomicU32 = AtomicU32::new(0);
static BREAK_THREAD: AtomicU32 = AtomicU32::new(0);

/// Sets the allocation to stop at (the tracker's set-up, from the options).
pub fn break_on(thread: u32, seq: u32) {
    BREAK_THREAD.store(thread, Ordering::Relaxed);
    BREAK_SEQ.store(seq, Ordering::Relaxed);
}

/// Stops in the debugger if this is the allocation `break_on` names (called only when it is set).
#[cold]
#[inline(never)]
pub fn break_if_asked(thread: u32, seq: u32, size: usize) {
    if seq != BREAK_SEQ.load(Ordering::Relaxed) || thread != BREAK_THREAD.load(Ordering::Relaxed) {
        return;
    }
    let mut line = crate::sys::StackBuffer::<160>::new();
    let _ = writeln!(
        line,
        "k15-memory: break_on={thread}/{seq}: allocation of {size} bytes; raising SIGTRAP"
    );
    line.flush_to_stderr();
    // SAFETY: a breakpoint instruction: SIGTRAP at this very point (a debugger stops here, and
    // `continue` goes on; without one the default action ends the process, as asked for).
    unsafe { core::arch::asm!("int3", options(nomem, nostack)) };
}

/// The quarantine's blocks, checked for writes after free (reports).
pub fn check_quarantine(found_by: FoundBy) {
    super::quarantine::check_all(found_by, StackId(0));
}

/// Whether the fields a live block's cookie covers are plausible one by one, for a block whose
/// cookie is damaged (an underrun) and so no longer vouches for them: an offset and size that
/// fit where the block lies, its guard intact, a site the table gave out.
pub fn fields_hold_together(h: &BlockHeader) -> bool {
    use super::header::{Placement, GUARD_SIZE};
    use crate::sys::{page_is_mapped, PAGE_SIZE};
    let header = h as *const BlockHeader as usize;
    let user = header + HEADER_SIZE;
    let fits = match h.placement() {
        Placement::Heap => super::heap::block_containing(user).is_some_and(|block| {
            block.header() as usize == header
                && block.class == h.class()
                && h.size() <= block.room()
        }),
        // The offset of a block from glibc lies in front of its header.
        placement => {
            (placement == Placement::Mapped
                || header % PAGE_SIZE >= size_of::<usize>()
                || page_is_mapped(header - size_of::<usize>()))
                && {
                    let offset = h.raw_offset();
                    (HEADER_SIZE..=super::raw::LARGEST_MALLOC_OFFSET).contains(&offset)
                        && offset.is_multiple_of(16)
                        && h.size() < 1 << 47
                        && page_is_mapped(user + h.size())
                        && page_is_mapped(user + h.size() + GUARD_SIZE - 1)
                }
        }
    };
    fits && h.guard_intact() && h.site_is_known()
}

/// The `K15_NEW` file of a block, read only where its pointer leads to mapped memory (a stray
/// write may have changed it; the cookie does not cover it).
pub fn file_of(h: &BlockHeader) -> Option<String> {
    file_at(h.kind(), h.file())
}

/// The `file` that a header of a block of `kind` gave, as text.
fn file_at(kind: BlockKind, file: *const core::ffi::c_char) -> Option<String> {
    // A `k15::memory::allocate` block keeps its allocator's name there instead.
    if kind == BlockKind::Named || file.is_null() || !crate::sys::page_is_mapped(file as usize) {
        return None;
    }
    // SAFETY: the `file` of a block is null or a `__FILE__` literal, here in mapped memory.
    unsafe { crate::sys::c_str(file) }.map(str::to_owned)
}
