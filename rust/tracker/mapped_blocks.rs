//! The user addresses of the live mapped blocks, so that freeing or resizing one reads its header (in the page before its page-aligned bytes) without first asking the kernel whether that page is mapped.
//!
//! A page-aligned pointer may be anyone's: its header's page is probed (`sys::page_is_mapped`,
//! a system call) unless this set holds it. Before the set, every `free` and `realloc` of a
//! block over 120 KiB paid two such calls: a 1 MiB `malloc`/`free` pair took 474 ns against
//! glibc's 26, and a `realloc` growing a 1 MiB block 414 ns. A fixed table without a lock: an
//! address found there is a live mapped block's (or one another thread frees at that moment,
//! as a probe's answer may be stale too); one not found, because the table was full, is probed
//! as before.

use core::sync::atomic::{AtomicUsize, Ordering};

/// Slots of the table, log2: 4,096 (32 KiB), far more than the large blocks a program keeps
/// alive at once usually; beyond, blocks go unlisted and their frees probe.
const SLOT_BITS: u32 = 12;
const SLOTS: usize = 1 << SLOT_BITS;
/// How many slots from its home an address may lie: every lookup reads all of them, so holes
/// left by removals need no tombstones.
const REACH: usize = 8;

struct Table([AtomicUsize; SLOTS]);

static LIVE: Table = Table::new();

impl Table {
    const fn new() -> Table {
        Table([const { AtomicUsize::new(0) }; SLOTS])
    }

    /// The slots `user` may lie in.
    fn slots(&self, user: usize) -> impl Iterator<Item = &AtomicUsize> {
        let home = home(user);
        (0..REACH).map(move |i| &self.0[(home + i) & (SLOTS - 1)])
    }

    fn insert(&self, user: usize) {
        self.slots(user).any(|slot| {
            slot.compare_exchange(0, user, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        });
    }

    fn remove(&self, user: usize) {
        self.slots(user).any(|slot| {
            slot.compare_exchange(user, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        });
    }

    fn holds(&self, user: usize) -> bool {
        user != 0
            && self
                .slots(user)
                .any(|slot| slot.load(Ordering::Relaxed) == user)
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

/// A mapped block's bytes start at `user` (its header's page mapped before them).
pub fn insert(user: usize) {
    LIVE.insert(user);
}

/// The mapped block at `user` is going: its pages may be unmapped or given to another block.
pub fn remove(user: usize) {
    LIVE.remove(user);
}

/// Whether `user` is a live mapped block's (false may also mean it went unlisted).
pub fn holds(user: usize) -> bool {
    LIVE.holds(user)
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
            table.insert(a);
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
        table.insert(same_home[REACH]);
        assert!(table.holds(same_home[REACH]), "the hole is taken again");
        for &a in &same_home {
            table.remove(a);
        }
        assert!(!same_home.iter().any(|&a| table.holds(a)));
        assert!(!table.holds(0));
    }
}
