//! Freed large blocks' mappings kept resident for the next large block, bounded as glibc bounds
//! what its dynamic mmap threshold keeps: a program that frees its large blocks and allocates
//! them again (a level unloaded, the next one loaded) does not fault every page in again.
//!
//! A mapping is kept only if one at least as long was freed before (the first of each length
//! goes back to the OS, as glibc unmaps the block that raises its threshold), up to twice the
//! longest freed (glibc's trim threshold) in all, the ranges kept longest going back first to
//! make room, and only up to [`LONGEST_KEPT`] each. A block
//! takes the shortest kept range that holds it, the rest of the range staying kept; ranges
//! that touch are joined. All goes back to the OS before the exit report.
//!
//! The lock is only ever tried: a signal handler that lands on a thread holding it (its own
//! large blocks come through here too) maps and unmaps as if nothing were kept.

use crate::sys;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The longest mapping kept (glibc's `DEFAULT_MMAP_THRESHOLD_MAX` on 64-bit): longer ones are
/// unmapped when freed.
const LONGEST_KEPT: usize = 32 << 20;

/// Ranges kept at most: a freed mapping finding no slot (and touching no kept range) is unmapped.
const SLOTS: usize = 32;

/// A kept range of pages: `len` bytes from `start`, both page multiples.
#[derive(Clone, Copy)]
struct Range {
    start: usize,
    len: usize,
    /// When it was kept (its [`Kept::frees`]), joined ranges counting as kept last.
    kept_at: u64,
}

struct Kept {
    /// `ranges[..count]` are kept, none empty: a program keeps a range or two, and every
    /// `malloc` and `free` of a large block looks through them.
    ranges: [Range; SLOTS],
    count: usize,
    /// Bytes kept in all.
    bytes: usize,
    /// Ranges kept so far.
    frees: u64,
    /// The longest mapping freed so far, up to [`LONGEST_KEPT`]: mappings up to it are kept, up
    /// to twice it in all.
    threshold: usize,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept::NONE);

/// The first word of a mapping handed out again: its pages hold what earlier blocks wrote (a
/// fresh mapping's first word is 0).
const REUSED: usize = 1;

/// `len` bytes (a page multiple) of kept pages, or `None` (then the caller maps fresh ones).
pub fn take(len: usize) -> Option<*mut u8> {
    let mut kept = KEPT.try_lock().ok()?;
    let best = (0..kept.count)
        .filter(|&i| kept.ranges[i].len >= len)
        .min_by_key(|&i| kept.ranges[i].len)?;
    let range = &mut kept.ranges[best];
    let start = range.start as *mut u8;
    range.start += len;
    range.len -= len;
    if range.len == 0 {
        kept.remove(best);
    }
    kept.bytes -= len;
    // SAFETY: the range's first page is ours (kept, now handed out) and writable.
    unsafe { start.cast::<usize>().write(REUSED) };
    Some(start)
}

/// Whether the mapping at `start` (from [`take`] or fresh) holds what earlier blocks wrote: a
/// `calloc` must zero it.
///
/// # Safety
/// `start` is the start of a live mapping of a large block.
pub unsafe fn reused(start: *const u8) -> bool {
    // SAFETY: guaranteed by the caller: the mapping's first page is readable.
    unsafe { start.cast::<usize>().read() == REUSED }
}

/// Keeps the freed mapping of `len` bytes at `start` (page multiples) for [`take`], or unmaps it.
///
/// # Safety
/// The mapping is ours and nothing uses it any more.
pub unsafe fn keep_or_unmap(start: *mut u8, len: usize) {
    let kept = KEPT.try_lock().is_ok_and(|mut kept| {
        // The decision of glibc's free: kept below its threshold, which rises to the longest
        // chunk freed, the oldest kept going back to make room.
        let keep = len <= kept.threshold && kept.make_room(len) && kept.add(start as usize, len);
        if len <= LONGEST_KEPT {
            kept.threshold = kept.threshold.max(len);
        }
        keep
    });
    if !kept {
        // SAFETY: guaranteed by the caller.
        unsafe { sys::unmap_pages(start, len) };
    }
}

impl Kept {
    const NONE: Kept = Kept {
        ranges: [Range {
            start: 0,
            len: 0,
            kept_at: 0,
        }; SLOTS],
        count: 0,
        bytes: 0,
        frees: 0,
        threshold: 0,
    };

    fn kept(&self) -> &[Range] {
        &self.ranges[..self.count]
    }

    /// Drops `ranges[i]` from the kept ones (its bytes are the caller's to count).
    fn remove(&mut self, i: usize) {
        self.count -= 1;
        self.ranges[i] = self.ranges[self.count];
    }

    /// Unmaps the ranges kept longest until `len` more bytes fit in twice the threshold (it
    /// does, as `len` is at most the threshold).
    fn make_room(&mut self, len: usize) -> bool {
        while self.bytes + len > 2 * self.threshold {
            let Some(oldest) = (0..self.count).min_by_key(|&i| self.ranges[i].kept_at) else {
                return false;
            };
            let range = self.ranges[oldest];
            // SAFETY: a kept range: ours, and nothing uses it.
            unsafe { sys::unmap_pages(range.start as *mut u8, range.len) };
            self.bytes -= range.len;
            self.remove(oldest);
        }
        true
    }

    /// Adds a range, joined to any kept range it touches; `false` when no slot is left for it.
    fn add(&mut self, mut start: usize, mut len: usize) -> bool {
        let mut i = 0;
        while i < self.count {
            let range = self.ranges[i];
            if range.start + range.len == start || start + len == range.start {
                start = start.min(range.start);
                len += range.len;
                self.bytes -= range.len;
                self.remove(i); // `ranges[i]` is another range now
            } else {
                i += 1;
            }
        }
        if self.count == SLOTS {
            return false;
        }
        self.frees += 1;
        self.ranges[self.count] = Range {
            start,
            len,
            kept_at: self.frees,
        };
        self.count += 1;
        self.bytes += len;
        true
    }
}

/// Every kept range goes back to the OS (at exit, before the report: memory the program will
/// hardly ask for again, and the symbolizer may).
pub fn unmap_all() {
    let mut kept = lock();
    for range in kept.kept() {
        // SAFETY: a kept range: ours, and nothing uses it.
        unsafe { sys::unmap_pages(range.start as *mut u8, range.len) };
    }
    kept.count = 0;
    kept.bytes = 0;
}

/// Whether a kept range overlaps the pages `[start, end)`. Only tried, as [`take`] does: while
/// another thread keeps or takes a range, the answer is no.
pub fn overlaps(start: usize, end: usize) -> bool {
    KEPT.try_lock().is_ok_and(|kept| {
        kept.kept()
            .iter()
            .any(|range| range.start < end && start < range.start + range.len)
    })
}

/// Where the kept ranges are listed: addresses of freed mappings, which a leak scan skips.
pub fn kept_list_range() -> core::ops::Range<usize> {
    sys::bytes_of(&KEPT)
}

fn lock() -> MutexGuard<'static, Kept> {
    KEPT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Held by `fork` (see `tracker::fork`).
pub(crate) fn lock_for_fork() -> MutexGuard<'static, impl Sized> {
    lock()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::PAGE_SIZE;

    #[test]
    fn ranges_that_touch_are_joined_and_the_oldest_go_back_first() {
        let pages = sys::map_pages(16 * PAGE_SIZE) as usize;
        assert_ne!(pages, 0);
        let page = |n: usize| pages + n * PAGE_SIZE;
        let mut kept = Kept::NONE;
        kept.threshold = 4 * PAGE_SIZE;
        assert!(kept.add(page(0), PAGE_SIZE));
        assert!(kept.add(page(4), 2 * PAGE_SIZE));
        assert!(kept.add(page(1), PAGE_SIZE), "touches the first");
        let spans = |kept: &Kept| {
            let mut spans: Vec<_> = kept.kept().iter().map(|r| (r.start, r.len)).collect();
            spans.sort();
            spans
        };
        assert_eq!(
            spans(&kept),
            [(page(0), 2 * PAGE_SIZE), (page(4), 2 * PAGE_SIZE)]
        );
        assert_eq!(kept.bytes, 4 * PAGE_SIZE);
        assert!(kept.add(page(2), 2 * PAGE_SIZE), "touches both: one range");
        assert_eq!(spans(&kept), [(page(0), 6 * PAGE_SIZE)]);
        assert!(kept.add(page(8), PAGE_SIZE));
        // 7 pages kept, at most 8: 3 more need the oldest (the joined range) to go.
        assert!(kept.make_room(3 * PAGE_SIZE));
        assert_eq!(spans(&kept), [(page(8), PAGE_SIZE)]);
        assert_eq!(kept.bytes, PAGE_SIZE);
        // SAFETY: the test's own pages (those make_room unmapped again are unmapped twice: fine).
        unsafe { sys::unmap_pages(pages as *mut u8, 16 * PAGE_SIZE) };
    }

    #[test]
    fn a_full_list_keeps_nothing_more() {
        let mut kept = Kept::NONE;
        kept.threshold = usize::MAX / 4;
        for n in 0..SLOTS {
            assert!(kept.add(0x1000_0000 + 2 * n * PAGE_SIZE, PAGE_SIZE));
        }
        assert!(!kept.add(0x2000_0000, PAGE_SIZE));
        assert_eq!(kept.count, SLOTS);
    }
}
