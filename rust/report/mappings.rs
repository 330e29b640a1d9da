//! The program's own anonymous mappings, recorded as its `mmap`, `mremap` and `munmap` calls
//! (`cpp/mappings.cpp`) make them, so that the leak scan reads them as roots, as valgrind does:
//! an engine's arenas, pools and fiber stacks hold pointers to blocks.
//!
//! Only calls that reach the library's definitions are seen: the program's own and its
//! libraries' (the executable exports the names, which glibc has too, and GNU ld exports such
//! definitions; under `LD_PRELOAD` likewise). glibc maps its own memory (thread stacks,
//! `malloc`'s arenas) with its internal calls, and the tracker its own with the system call or,
//! through a library, from inside itself (its reentrancy guard held), so neither is recorded:
//! their words are not the program's.
//!
//! A call that would unmap or replace the pages of the tracker's large blocks fails instead
//! ([`refused`]), as it does under glibc.

use core::fmt::Write;
use core::ops::Range;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

use crate::sys::{self, PAGE_SIZE};

/// More ranges than a process can have mappings (`vm.max_map_count` is 65,530 by default), so
/// every mapping fits, however the program splits them.
const CAPACITY: usize = 1 << 16;

/// The recorded ranges: sorted, apart (neither overlapping nor touching) and page-aligned.
#[repr(C)]
struct Registry {
    len: usize,
    ranges: [(usize, usize); CAPACITY],
}

static REGISTRY: AtomicPtr<Registry> = AtomicPtr::new(core::ptr::null_mut());
/// The lock, held across `fork` (see `tracker::fork`): the child must not find it taken by a
/// thread it does not have.
pub fn lock_for_fork() -> impl Sized {
    sys::MapLock::take()
}

/// Makes the program's system call `call` and records what it did with `update`, both under
/// the mappings' lock (`sys::MapLock`): another thread's call must not come between (a range one
/// thread unmaps and another maps at once would otherwise be recorded in the wrong order, and
/// lost), nor the tracker's mapping of a large block where `replaces` pages. The call's result,
/// errno as the call left it; -1 with `EINVAL` where it would unmap or replace the tracker's
/// pages ([`refused`]). Unrecorded where the thread holds the lock already (a signal handler),
/// or the record cannot be mapped.
fn call_and_record(
    replaces: &[(&str, usize, usize)],
    call: impl FnOnce() -> isize,
    update: impl FnOnce(&mut Registry, usize),
) -> isize {
    if crate::tracker::guard::inside() {
        // The tracker's own call (the symbolizer's buffers through `memmap2`), or a signal
        // handler's on a thread inside the tracker: not the program's memory, or left out.
        return call();
    }
    let held = sys::MapLock::take();
    if replaces
        .iter()
        .any(|&(name, start, end)| refused(name, start, end))
    {
        return -1;
    }
    let registry = match held {
        Some(_) => sys::map_once(&REGISTRY, core::mem::size_of::<Registry>()),
        None => core::ptr::null_mut(),
    };
    let in_flight = held.as_ref().map(|_| InFlight::calling(replaces));
    let result = call();
    if let Some(in_flight) = &in_flight {
        in_flight.recording();
    }
    // SAFETY: the record is mapped for the process lifetime, zeroed (an empty record) when new,
    // and only touched under the lock, held here when `registry` is not null.
    if let (true, Some(registry)) = (result != -1, unsafe { registry.as_mut() }) {
        update(registry, result as usize);
    }
    drop(in_flight);
    drop(held);
    result
}

/// The call of the program's that holds the lock, for a leak scan that suspended its thread
/// there (`ranges_with_others_suspended`): the ranges it may unmap or replace, and whether it
/// is recording what it did (the record may then be half changed).
static IN_FLIGHT: [(AtomicUsize, AtomicUsize); 2] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; 2];
static PHASE: AtomicU8 = AtomicU8::new(IDLE);
const IDLE: u8 = 0;
const CALLING: u8 = 1;
const RECORDING: u8 = 2;

/// The published call of the lock's holder, cleared when dropped.
struct InFlight;

impl InFlight {
    fn calling(replaces: &[(&str, usize, usize)]) -> InFlight {
        for (at, (start, end)) in IN_FLIGHT.iter().enumerate() {
            // A call replaces two ranges at most (`mremap` with `MREMAP_FIXED`); 0..0 for none.
            let (_, from, to) = replaces.get(at).copied().unwrap_or(("", 0, 0));
            start.store(from, Ordering::Relaxed);
            end.store(to, Ordering::Relaxed);
        }
        PHASE.store(CALLING, Ordering::Release);
        InFlight
    }

    fn recording(&self) {
        PHASE.store(RECORDING, Ordering::Release);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        PHASE.store(IDLE, Ordering::Release);
    }
}

/// Whole pages from `start` for `len` bytes, as the kernel counts them.
fn pages(start: usize, len: usize) -> (usize, usize) {
    let start = start & !(PAGE_SIZE - 1);
    (start, start.saturating_add(len.next_multiple_of(PAGE_SIZE)))
}

/// Whether the program's `call` would unmap or replace pages of `[start, end)` that hold the
/// tracker's large blocks (live, or kept for the next): then it fails with `EINVAL`, as it does
/// under glibc, whose blocks never start a page, and the first such call gets a line on stderr.
/// A program that takes a large `malloc`'d buffer for a mapping of its own runs on, as it would
/// without the tracker, instead of losing the block's header or handing unmapped pages to the
/// next large block.
fn refused(call: &str, start: usize, end: usize) -> bool {
    if !crate::tracker::holds_large_block_pages(start, end) {
        return false;
    }
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        let mut line = sys::StackBuffer::<384>::new();
        let _ = writeln!(
            line,
            "k15-memory: {call} of {start:#x}..{end:#x} refused (EINVAL): those pages hold a \
             block from malloc or new (or one freed and kept for the next), not a mapping of the \
             program's; glibc refuses it too, its blocks never starting a page (said once)"
        );
        line.flush_to_stderr();
    }
    // SAFETY: errno is the calling thread's own.
    unsafe { *libc::__errno_location() = libc::EINVAL };
    true
}

/// The program's `mmap`: an anonymous mapping is recorded; any other one (a file mapped with
/// `MAP_FIXED` over part of an arena) is taken out of the record.
pub fn map(address: usize, len: usize, protection: i32, flags: i32, fd: i32, offset: i64) -> isize {
    let (fixed_start, fixed_end) = pages(address, len);
    let fixed = [("mmap(MAP_FIXED)", fixed_start, fixed_end)];
    let replaces = if flags & libc::MAP_FIXED != 0 {
        &fixed[..]
    } else {
        &[]
    };
    let call = || {
        // SAFETY: the program's own call, passed on as it made it.
        unsafe {
            libc::syscall(libc::SYS_mmap, address, len, protection, flags, fd, offset) as isize
        }
    };
    call_and_record(replaces, call, |registry, start| {
        let (start, end) = pages(start, len);
        if flags & libc::MAP_ANONYMOUS != 0 {
            registry.add(start, end);
        } else {
            registry.remove(start, end);
        }
    })
}

/// The program's `munmap`.
pub fn unmap(address: usize, len: usize) -> isize {
    let (start, end) = pages(address, len);
    // SAFETY: the program's own call, passed on as it made it.
    let call = || unsafe { libc::syscall(libc::SYS_munmap, address, len) as isize };
    call_and_record(&[("munmap", start, end)], call, |registry, _| {
        registry.remove(start, end)
    })
}

/// The program's `mremap`: the new range is recorded if the old one was (wholly or in part).
pub fn remap(old: usize, old_len: usize, new_len: usize, flags: i32, new_address: usize) -> isize {
    let (old_start, old_end) = pages(old, old_len);
    let (fixed_start, fixed_end) = pages(new_address, new_len);
    let moved = [
        ("mremap", old_start, old_end.max(old_start + PAGE_SIZE)),
        ("mremap(MREMAP_FIXED)", fixed_start, fixed_end),
    ];
    let replaces = if flags & libc::MREMAP_FIXED != 0 {
        &moved[..]
    } else {
        &moved[..1]
    };
    let call = || {
        // SAFETY: the program's own call, passed on as it made it.
        unsafe {
            libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_address) as isize
        }
    };
    call_and_record(replaces, call, |registry, new| {
        let (new_start, new_end) = pages(new, new_len);
        if !registry.overlaps(old_start, old_end.max(old_start + PAGE_SIZE)) {
            return;
        }
        if old_len != 0 {
            // 0: a shared mapping duplicated, the old one staying.
            registry.remove(old_start, old_end);
        }
        registry.add(new_start, new_end);
    })
}

/// The program's mappings while every other thread is suspended, given those `gathered` under
/// the lock before (`ranges`): what the record says now (the calls made since count), but where
/// a thread was suspended recording its call (the record may be half changed: then `gathered`),
/// less what the call a thread was suspended in may have unmapped. A range unmapped since may
/// hold the tracker's own memory now, whose words are not the program's.
pub fn ranges_with_others_suspended(gathered: Vec<Range<usize>>) -> Vec<Range<usize>> {
    let phase = PHASE.load(Ordering::Acquire);
    // SAFETY: mapped for good once published; no thread but the caller runs, and it changes no
    // record (its calls are the tracker's own); one suspended while recording is excluded.
    let registry = unsafe { REGISTRY.load(Ordering::Acquire).as_ref() };
    let now = match registry {
        Some(registry) if phase != RECORDING => registry.recorded().collect(),
        _ => gathered,
    };
    if phase == IDLE {
        return now;
    }
    let in_flight: Vec<Range<usize>> = IN_FLIGHT
        .iter()
        .map(|(start, end)| start.load(Ordering::Relaxed)..end.load(Ordering::Relaxed))
        .filter(|range| !range.is_empty())
        .collect();
    now.into_iter()
        .flat_map(|range| super::scan::uncovered(range, &in_flight))
        .map(|(start, end)| start..end)
        .collect()
}

/// The ranges recorded now.
pub fn ranges() -> Vec<Range<usize>> {
    let mut copied = Vec::new();
    loop {
        let wanted = {
            let Some(_held) = sys::MapLock::take() else {
                return copied;
            };
            // SAFETY: as in `change`: mapped for good once published, read under the lock.
            let Some(registry) = (unsafe { REGISTRY.load(Ordering::Acquire).as_ref() }) else {
                return copied;
            };
            if registry.len <= copied.capacity() {
                copied.extend(registry.recorded());
                return copied;
            }
            registry.len
        };
        // Not under the lock: reserving may map memory, and a hook may be waiting.
        copied.reserve(wanted);
    }
}

impl Registry {
    fn recorded(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.ranges[..self.len]
            .iter()
            .map(|&(start, end)| start..end)
    }

    /// The index of the first range that ends after `start` (`touching`: at or after it).
    fn first_after(&self, start: usize, touching: bool) -> usize {
        self.ranges[..self.len]
            .partition_point(|&(_, end)| end < start || !touching && end == start)
    }

    /// The index past the last range that starts before `end` (`touching`: at or before it).
    fn last_before(&self, end: usize, touching: bool) -> usize {
        self.ranges[..self.len]
            .partition_point(|&(start, _)| start < end || touching && start == end)
    }

    fn overlaps(&self, start: usize, end: usize) -> bool {
        self.first_after(start, false) < self.last_before(end, false)
    }

    /// Replaces `ranges[from..to]` with `pieces`; false (nothing changed) where they do not fit.
    fn splice(&mut self, from: usize, to: usize, pieces: &[(usize, usize)]) -> bool {
        let len = self.len - (to - from) + pieces.len();
        if len > CAPACITY {
            return false;
        }
        self.ranges.copy_within(to..self.len, from + pieces.len());
        self.ranges[from..from + pieces.len()].copy_from_slice(pieces);
        self.len = len;
        true
    }

    /// Records `[start, end)`, merged with the ranges it overlaps or touches.
    fn add(&mut self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        let (from, to) = (self.first_after(start, true), self.last_before(end, true));
        let merged = if from < to {
            (
                start.min(self.ranges[from].0),
                end.max(self.ranges[to - 1].1),
            )
        } else {
            (start, end)
        };
        self.splice(from, to, &[merged]);
    }

    /// Takes `[start, end)` out of the record. Splitting a range when the record is full keeps
    /// only its part below the hole: a range no longer mapped must never be read as a root (the
    /// tracker may map its own memory there), while a part left out only loses roots.
    fn remove(&mut self, start: usize, end: usize) {
        let (from, to) = (self.first_after(start, false), self.last_before(end, false));
        if from >= to {
            return;
        }
        let (first, last) = (self.ranges[from].0, self.ranges[to - 1].1);
        // No allocation here: this runs inside the program's `munmap`, under the lock.
        let mut pieces = [(0, 0); 2];
        let mut count = 0;
        for (piece_start, piece_end) in [(first, start), (end, last)] {
            if piece_start < piece_end {
                pieces[count] = (piece_start, piece_end);
                count += 1;
            }
        }
        if !self.splice(from, to, &pieces[..count]) {
            self.splice(from, to, &pieces[..count.min(1)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(changes: &[(bool, usize, usize)]) -> Vec<(usize, usize)> {
        let mut registry: Box<Registry> = Box::new(Registry {
            len: 0,
            ranges: [(0, 0); CAPACITY],
        });
        for &(add, start, end) in changes {
            if add {
                registry.add(start, end);
            } else {
                registry.remove(start, end);
            }
        }
        registry.ranges[..registry.len].to_vec()
    }

    #[test]
    fn the_programs_mappings_are_recorded_and_the_trackers_own_are_not() {
        let len = 3 * PAGE_SIZE;
        let (prot, flags) = (
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        );
        let programs = map(0, len, prot, flags, -1, 0) as usize;
        let inside = crate::tracker::guard::Inside::enter();
        assert!(inside.is_some());
        let trackers = map(0, len, prot, flags, -1, 0) as usize;
        drop(inside);
        let covered = |address: usize| ranges().iter().any(|r| r.contains(&address));
        assert!(covered(programs) && covered(programs + len - 1));
        assert!(!covered(trackers), "mapped inside the tracker");
        assert_eq!(unmap(programs + PAGE_SIZE, PAGE_SIZE), 0);
        assert!(covered(programs) && !covered(programs + PAGE_SIZE));
        assert_eq!(unmap(programs, len), 0);
        assert!(!covered(programs) && !covered(programs + 2 * PAGE_SIZE));
        assert_eq!(unmap(trackers, len), 0);
        assert_eq!(
            unmap(0x1001, 1),
            -1,
            "a misaligned unmap fails as the system call does"
        );
    }

    #[test]
    fn touching_and_overlapping_ranges_merge() {
        let got = record(&[
            (true, 0x3000, 0x4000),
            (true, 0x1000, 0x2000),
            (true, 0x2000, 0x3000),
        ]);
        assert_eq!(got, [(0x1000, 0x4000)]);
        let got = record(&[
            (true, 0x1000, 0x2000),
            (true, 0x5000, 0x6000),
            (true, 0x1800, 0x5800),
        ]);
        assert_eq!(got, [(0x1000, 0x6000)]);
        let got = record(&[
            (true, 0x5000, 0x6000),
            (true, 0x1000, 0x2000),
            (true, 0x3000, 0x4000),
        ]);
        assert_eq!(got, [(0x1000, 0x2000), (0x3000, 0x4000), (0x5000, 0x6000)]);
    }

    #[test]
    fn unmapping_cuts_holes_and_leaves_the_rest() {
        let base = [(true, 0x1000, 0x9000), (true, 0xa000, 0xc000)];
        let cut = |start, end| {
            let mut changes = base.to_vec();
            changes.push((false, start, end));
            record(&changes)
        };
        assert_eq!(
            cut(0x3000, 0x4000),
            [(0x1000, 0x3000), (0x4000, 0x9000), (0xa000, 0xc000)]
        );
        assert_eq!(cut(0x8000, 0xb000), [(0x1000, 0x8000), (0xb000, 0xc000)]);
        assert_eq!(cut(0x0, 0xd000), []);
        assert_eq!(cut(0x9000, 0xa000), base.map(|(_, s, e)| (s, e)));
        assert_eq!(cut(0x1000, 0x9000), [(0xa000, 0xc000)]);
    }

    #[test]
    fn a_full_record_splits_by_keeping_only_the_part_below_the_hole() {
        let mut registry: Box<Registry> = Box::new(Registry {
            len: 0,
            ranges: [(0, 0); CAPACITY],
        });
        for i in 0..CAPACITY {
            registry.add(0x10000 + i * 0x2000, 0x11000 + i * 0x2000);
        }
        registry.add(0x1000, 0x1000); // empty: nothing
        registry.add(0x4000_0000, 0x4000_1000); // no room, touches nothing: not recorded
        assert_eq!(registry.len, CAPACITY);
        assert!(!registry.overlaps(0x4000_0000, 0x4000_1000));
        registry.add(0x11000, 0x12000); // fills the gap between the first two: they merge
        assert_eq!(registry.ranges[0], (0x10000, 0x13000));
        registry.add(0x4000_0000, 0x4000_1000); // room now
        registry.remove(0x11000, 0x12000); // a split that does not fit
        assert_eq!(registry.ranges[0], (0x10000, 0x11000));
        assert_eq!(registry.ranges[1], (0x14000, 0x15000));
    }
}
