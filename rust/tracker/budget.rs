//! Budget mode (`budget=64M`): the program's tracked bytes are counted against one budget, as a
//! console's heap would count them, whatever the mix of sizes; an allocation beyond it is a
//! `budget_exceeded` error and fails (`bad_alloc`, or null), and freeing makes room again. The
//! tracker's own bytes per block (header, guard) are not the program's and are not counted.

use core::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The name under which budget errors appear (`allocator` in the JSON report).
pub const NAME: &str = "k15 budget";

pub struct Budget {
    limit: usize,
    /// Bytes the program holds now, as [`charged`] counts them.
    spent: AtomicUsize,
}

static BUDGET: OnceLock<Budget> = OnceLock::new();

/// The budget, once [`set_up`] made one.
#[inline]
pub fn active() -> Option<&'static Budget> {
    BUDGET.get()
}

/// Sets the budget up. Called once, at first use, inside the tracker.
pub fn set_up(bytes: usize) {
    let _ = BUDGET.set(Budget {
        limit: bytes,
        spent: AtomicUsize::new(0),
    });
}

/// Gives back to the budget, if there is one, what a freed block of `size` bytes cost it.
pub fn credit_block(size: usize) {
    if let Some(budget) = active() {
        budget.credit(size);
    }
}

/// What a block of `size` bytes costs the budget: its size in the 16-byte steps any allocator
/// hands out (a zero-byte block included).
fn charged(size: usize) -> usize {
    size.max(1).next_multiple_of(16)
}

impl Budget {
    /// Counts a block of `size` bytes against the budget; false (and nothing counted) when it
    /// does not fit. One atomic add: budget mode shares one counter between threads.
    pub fn charge(&self, size: usize) -> bool {
        if size > self.limit {
            return false; // also keeps `charged` from wrapping
        }
        let cost = charged(size);
        let before = self.spent.fetch_add(cost, Ordering::Relaxed);
        if before + cost <= self.limit {
            return true;
        }
        self.spent.fetch_sub(cost, Ordering::Relaxed);
        false
    }

    /// Gives back what [`Budget::charge`] counted for a block of `size` bytes.
    pub fn credit(&self, size: usize) {
        self.spent.fetch_sub(charged(size), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_fit_until_their_16_byte_steps_fill_the_budget_and_frees_make_room() {
        let budget = Budget {
            limit: 1024,
            spent: AtomicUsize::new(0),
        };
        assert!((0..64).all(|_| budget.charge(1)));
        assert!(!budget.charge(1));
        budget.credit(16);
        assert!(!budget.charge(17));
        assert!(budget.charge(16));
        assert!(!budget.charge(usize::MAX));
    }
}
