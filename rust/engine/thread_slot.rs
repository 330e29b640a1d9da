//! Process-wide thread slots 0..64: a thread that holds slot `k` is the only user of cache `k` in every pool,
//! so the pool's fast path needs no atomic read-modify-write.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) const MAX_THREADS: usize = 64;
const UNASSIGNED: u8 = u8::MAX;
/// The thread gave its slot back on exit; it gets no other.
const EXITED: u8 = u8::MAX - 1;

static TAKEN: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's slot number, or [`UNASSIGNED`] / [`EXITED`]. No destructor, so reading it is one load.
    static SLOT: Cell<u8> = const { Cell::new(UNASSIGNED) };
    /// Gives the slot back when the thread exits; set up only when the slot is claimed.
    static OWNER: SlotOwner = const { SlotOwner(Cell::new(UNASSIGNED)) };
}

struct SlotOwner(Cell<u8>);

impl Drop for SlotOwner {
    fn drop(&mut self) {
        let slot = self.0.get();
        if slot != UNASSIGNED {
            SLOT.set(EXITED);
            // Release: the next owner of the slot sees this thread's cache writes.
            TAKEN.fetch_and(!(1 << slot), Ordering::Release);
        }
    }
}

/// This thread's slot (below [`MAX_THREADS`]), claimed on first use; `None` while all 64 are taken or once
/// the thread is exiting.
#[inline]
pub(crate) fn current() -> Option<usize> {
    assigned().or_else(assign)
}

/// This thread's slot if it already has one: a fast path that calls nothing.
#[inline]
pub(crate) fn assigned() -> Option<usize> {
    let slot = SLOT.get() as usize;
    (slot < MAX_THREADS).then_some(slot)
}

#[cold]
#[inline(never)]
fn assign() -> Option<usize> {
    if SLOT.get() == EXITED {
        return None;
    }
    // Fails once the owner is destroyed (the thread is exiting), before `SLOT` says so.
    OWNER
        .try_with(|owner| {
            let slot = claim()?;
            owner.0.set(slot);
            SLOT.set(slot);
            Some(slot as usize)
        })
        .ok()
        .flatten()
}

fn claim() -> Option<u8> {
    let mut taken = TAKEN.load(Ordering::Relaxed);
    loop {
        let bit = (!taken).trailing_zeros();
        if bit as usize >= MAX_THREADS {
            return None;
        }
        match TAKEN.compare_exchange_weak(
            taken,
            taken | 1 << bit,
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            Ok(_) => return Some(bit as u8),
            Err(now) => taken = now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_get_distinct_slots_and_give_them_back() {
        let mine = current().unwrap();
        assert_eq!(current(), Some(mine));
        assert_ne!(std::thread::spawn(current).join().unwrap(), Some(mine));
        // More threads than slots, one after another: each exiting thread frees its slot for the next.
        for _ in 0..2 * MAX_THREADS {
            assert!(std::thread::spawn(current).join().unwrap().is_some());
        }
    }
}
