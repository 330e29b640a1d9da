//! The live mapped blocks, so that freeing or resizing one reads its header (in the page before its page-aligned bytes) without first asking the kernel whether that page is mapped, and so that the program's own `munmap`, `mremap` and `mmap(MAP_FIXED)` leave their pages alone.
//!
//! A page-aligned pointer may be anyone's: its header's page is probed (`sys::page_is_mapped`,
//! a system call) unless this set holds it. Before the set, every `free` and `realloc` of a
//! block over 120 KiB paid two such calls: a 1 MiB `malloc`/`free` pair took 474 ns against
//! glibc's 26, and a `realloc` growing a 1 MiB block 414 ns. A fixed table without a lock: an
//! address found there is a live mapped block's (or one another thread frees at that moment,
//! as a probe's answer may be stale too); one not found, because the table was full, is probed
//! as before.
//!
//! Each slot also keeps its mapping's length, for [`overlaps`]: a program that takes a large
//! `malloc`'d buffer for a mapping of its own and unmaps it runs on under glibc (whose blocks
//! never start a page, so the call fails), and must under the tracker too.

use core::sync::atomic::{AtomicUsize, Ordering};

use crate::sys::PAGE_SIZE;

/// Slots of the table, log2: 4,096 (32 KiB), far more than the large blocks a program keeps
/// alive at once usually; beyond, blocks go unlisted and their frees probe.
const SLOT_BITS: u32 = 12;
const SLOTS: usize = 1 << SLOT_BITS;
/// How many slots from its home an address may lie: every lookup reads all of them, so holes
/// left by removals need no tombstones.
const REACH: usize = 8;

struct Table {
    /// The blocks' user addresses (0: a free slot).
    users: [AtomicUsize; SLOTS],
    /// The bytes each block's mapping spans from its header's page, beside its address.
    lengths: [AtomicUsize; SLOTS],
    /// Blocks listed, so that the program's calls skip the table when none is.
    listed: AtomicUsize,
}

static LIVE: Table = Table::new();

impl Table {
    const fn new() -> Table {
        Table {
            users: [const { AtomicUsize::new(0) }; SLOTS],
            lengths: [const { AtomicUsize::new(0) }; SLOTS],
            listed: AtomicUsize::new(0),
        }
    }

    /// The indices of the slots `user` may lie in.
    fn slots(user: usize) -> impl Iterator<Item = usize> {
        let home = home(user);
        (0..REACH).map(move |i| (home + i) & (SLOTS - 1))
    }

    fn insert(&self, user: usize, len: usize) {
        if let Some(i) = Self::slots(user).find(|&i| {
            self.users[i]
                .compare_exchange(0, user, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        }) {
            self.lengths[i].store(len, Ordering::Relaxed);
            self.listed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn slot_of(&self, user: usize) -> Option<usize> {
        (user != 0)
            .then(|| Self::slots(user).find(|&i| self.users[i].load(Ordering::Relaxed) == user))
            .flatten()
    }

    fn remove(&self, user: usize) {
        if Self::slots(user).any(|i| {
            self.users[i]
                .compare_exchange(user, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        }) {
            self.listed.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn resize(&self, user: usize, len: usize) {
        if let Some(i) = self.slot_of(user) {
            self.lengths[i].store(len, Ordering::Relaxed);
        }
    }

    fn holds(&self, user: usize) -> bool {
        self.slot_of(user).is_some()
    }

    /// Whether a listed block's mapping (header page included) overlaps `[start, end)`.
    fn overlaps(&self, start: usize, end: usize) -> bool {
        self.listed.load(Ordering::Relaxed) != 0
            && self.users.iter().zip(&self.lengths).any(|(user, len)| {
                let user = user.load(Ordering::Relaxed);
                let first = user.wrapping_sub(PAGE_SIZE);
                // A length not stored yet (an insert under way) counts as the header's page.
                let last = first + len.load(Ordering::Relaxed).max(PAGE_SIZE);
                user != 0 && first < end && start < last
            })
    }
}

/// The first slot `user` may lie in (user addresses of mapped blocks are page-aligned).
fn home(user: usize) -> usize {
    ((user as u64 >> 12).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOT_BITS)) as usize
}

/// Where the table lies: its addresses are the live large blocks', which a leak scan must not
/// take for the program's pointers to them.
pub fn table_range() -> core::ops::Range<usize> {
    crate::sys::bytes_of(&LIVE)
}

/// A mapped block's bytes start at `user`, its mapping (from its header's page) `len` bytes long.
pub fn insert(user: usize, len: usize) {
    LIVE.insert(user, len);
}

/// The mapped block at `user` is going: its pages may be unmapped or given to another block.
pub fn remove(user: usize) {
    LIVE.remove(user);
}

/// The mapping of the block at `user` is now `len` bytes long (resized in place).
pub fn resize(user: usize, len: usize) {
    LIVE.resize(user, len);
}

/// Whether `user` is a live mapped block's (false may also mean it went unlisted).
pub fn holds(user: usize) -> bool {
    LIVE.holds(user)
}

/// Whether the pages `[start, end)` hold part of a listed block's mapping.
pub fn overlaps(start: usize, end: usize) -> bool {
    LIVE.overlaps(start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_held_until_removed_and_beyond_the_reach_go_unlisted() {
        let table = Box::new(Table::new());
        let base = 0x7f00_0000_0000usize;
        let same_home: Vec<usize> = (0..)
            .map(|page| base + (page << 12))
            .filter(|&a| home(a) == home(base))
            .take(REACH + 1)
            .collect();
        for &a in &same_home {
            table.insert(a, PAGE_SIZE);
        }
        assert!(same_home[..REACH].iter().all(|&a| table.holds(a)));
        assert!(
            !table.holds(same_home[REACH]),
            "beyond the reach: unlisted, probed"
        );
        table.remove(same_home[0]);
        assert!(!table.holds(same_home[0]));
        assert!(
            same_home[1..REACH].iter().all(|&a| table.holds(a)),
            "a hole loses no other"
        );
        table.insert(same_home[REACH], PAGE_SIZE);
        assert!(table.holds(same_home[REACH]), "the hole is taken again");
        for &a in &same_home {
            table.remove(a);
        }
        assert!(!same_home.iter().any(|&a| table.holds(a)));
        assert!(!table.holds(0));
        assert_eq!(table.listed.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_range_overlaps_a_block_from_its_header_page_to_its_last_page() {
        let table = Box::new(Table::new());
        let user = 0x7f00_0010_0000usize;
        assert!(
            !table.overlaps(0, usize::MAX),
            "an empty table holds nothing"
        );
        table.insert(user, 3 * PAGE_SIZE);
        let header_page = user - PAGE_SIZE;
        assert!(table.overlaps(header_page, header_page + PAGE_SIZE));
        assert!(table.overlaps(user, user + PAGE_SIZE));
        assert!(
            table.overlaps(user + PAGE_SIZE, user + 2 * PAGE_SIZE),
            "its last page"
        );
        assert!(
            !table.overlaps(user + 2 * PAGE_SIZE, user + 3 * PAGE_SIZE),
            "past its end"
        );
        assert!(
            !table.overlaps(header_page - PAGE_SIZE, header_page),
            "before its header"
        );
        table.resize(user, 5 * PAGE_SIZE);
        assert!(
            table.overlaps(user + 3 * PAGE_SIZE, user + 4 * PAGE_SIZE),
            "grown in place"
        );
        table.remove(user);
        assert!(!table.overlaps(0, usize::MAX));
    }
}
