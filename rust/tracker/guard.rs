//! Per-thread state: the reentrancy guard ("inside the tracker"), the thread's number and its
//! allocation sequence.
//!
//! The thread-local is `const`-initialised and has no `Drop`: C++ `thread_local` destructors
//! call `delete` at thread exit, after Rust TLS destructors would have run.

use core::cell::Cell;
use core::sync::atomic::{AtomicU32, Ordering};

struct ThreadState {
    inside_tracker: Cell<bool>,
    /// 0 until the thread's first allocation; then 1 for the first thread that allocated, 2, …
    number: Cell<u32>,
    /// How many blocks this thread has allocated: the `seq` of the next one.
    allocations: Cell<u32>,
}

thread_local! {
    static THREAD: ThreadState = const {
        ThreadState { inside_tracker: Cell::new(false), number: Cell::new(0), allocations: Cell::new(0) }
    };
}

/// The calling thread's state, in one TLS access. `LocalKey::with` around a whole allocation
/// is not inlined and costs a call per use on the hot path; the reference it hands out here
/// cannot leave the thread (`ThreadState` is not `Sync`, so `&ThreadState` is not `Send`).
#[inline(always)]
fn this_thread() -> &'static ThreadState {
    // SAFETY: a `const` thread-local without `Drop` stays valid until the thread itself is gone,
    // and the reference stays on this thread (see above).
    THREAD.with(|t| unsafe { &*(t as *const ThreadState) })
}

static NEXT_THREAD_NUMBER: AtomicU32 = AtomicU32::new(1);

/// Proof that this thread is inside the tracker; nested allocations (the tracker's own, a
/// signal handler's) get `None` and take the untracked path. Frees need no guard: a shard lock
/// knows its holder (`live_list::SpinLock`).
pub struct Inside(&'static ThreadState);

impl Inside {
    #[inline]
    pub fn enter() -> Option<Inside> {
        let thread = this_thread();
        (!thread.inside_tracker.replace(true)).then(|| Inside(thread))
    }

    /// The calling thread's number (assigned at its first tracked allocation: 1, 2, …) and
    /// the sequence number of the allocation being made now (1, 2, … per thread).
    #[inline]
    pub fn next_allocation(&self) -> (u32, u32) {
        let t = self.0;
        let seq = t.allocations.get().wrapping_add(1);
        t.allocations.set(seq);
        (number_of(t), seq)
    }
}

/// The calling thread's number, assigned now if it has none (for frees, which need no guard).
#[inline]
pub fn thread_number() -> u32 {
    number_of(this_thread())
}

#[inline]
fn number_of(t: &ThreadState) -> u32 {
    match t.number.get() {
        0 => assign_thread_number(t),
        number => number,
    }
}

#[cold]
fn assign_thread_number(t: &ThreadState) -> u32 {
    let number = NEXT_THREAD_NUMBER.fetch_add(1, Ordering::Relaxed);
    t.number.set(number);
    number
}

impl Drop for Inside {
    #[inline]
    fn drop(&mut self) {
        self.0.inside_tracker.set(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_entry_is_refused_and_leaves_the_outer_one_in_place() {
        let outer = Inside::enter().expect("first entry");
        assert!(Inside::enter().is_none());
        assert!(
            Inside::enter().is_none(),
            "the refused entry did not clear the flag"
        );
        drop(outer);
        assert!(Inside::enter().is_some());
    }
}
