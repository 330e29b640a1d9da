//! Process-wide thread slots 0..64: a thread that holds slot `k` is the only user of cache `k` in every pool,
//! so the pool's fast path needs no atomic read-modify-write.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) const MAX_THREADS: usize = 64;
const UNASSIGNED: u8 = u8::MAX;

static TAKEN: AtomicU64 = AtomicU64::new(0);

struct ThreadSlot(Cell<u8>);

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        let slot = self.0.get();
        if slot != UNASSIGNED {
            // Release: the next owner of the slot sees this thread's cache writes.
            TAKEN.fetch_and(!(1 << slot), Ordering::Release);
        }
    }
}

thread_local! {
    static SLOT: ThreadSlot = const { ThreadSlot(Cell::new(UNASSIGNED)) };
}

/// This thread's slot, claimed on first use; `None` while all 64 are taken or once the thread is exiting.
pub(crate) fn current() -> Option<usize> {
    SLOT.try_with(|slot| {
        if slot.0.get() == UNASSIGNED {
            slot.0.set(claim()?);
        }
        Some(slot.0.get() as usize)
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
