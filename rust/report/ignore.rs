//! Blocks that live on purpose: `ignore_leak(ptr)` and `ScopedLeakIgnore`, kept off the hot path.
//!
//! `ignore_leak` records the block's address with its thread and sequence number (so a later
//! block at the same address is not ignored). A scope records the calling thread's allocation
//! sequence at its start and end: the blocks that thread allocated in between are ignored, and
//! `new` pays nothing for it.

use crate::tracker::header::{BlockHeader, Lookup};
use core::cell::Cell;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

/// An ignored block, or the blocks one thread allocated during a scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ignored {
    /// A tracked block (`thread`/`seq` as in its header), or an engine allocator's (both 0).
    Block {
        address: usize,
        thread: u32,
        seq: u32,
    },
    /// `seq` in `from..to`; `to` is `u32::MAX` while the scope is open.
    Scope { thread: u32, from: u32, to: u32 },
}

/// The list is append-only and read without a lock: a report that runs while a thread is
/// adding to it (a signal handler's `exit` that interrupted `ScopedLeakIgnore`, a fork) reads
/// every entry that was complete and skips the one being written, whose scope holds no block
/// yet. Its entries lie in chunks mapped as it grows (`MAP_NORESERVE`, zeroed, never unmapped):
/// chunk `c` holds `FIRST_CHUNK << c` entries, so the list takes at most twice the address
/// space it fills, and a program under a tight `ulimit -v` pays for what it uses.
static CHUNKS: [AtomicPtr<Entry>; CHUNK_COUNT] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; CHUNK_COUNT];
const FIRST_CHUNK: usize = 4096;
const CHUNK_COUNT: usize = 40;
/// Entries claimed so far (the last ones may still be being written).
static CLAIMED: AtomicUsize = AtomicUsize::new(0);

/// What an [`Entry`] holds (0 while it is being written): a block or a scope.
const BLOCK: u32 = 1;
const SCOPE: u32 = 2;

/// One [`Ignored`]: `what` is stored last (Release), so a reader that sees it set sees the rest.
/// Only a scope's `to` changes after that.
#[repr(C)]
struct Entry {
    what: AtomicU32,
    thread: AtomicU32,
    /// A block's `seq`, a scope's `from`.
    seq: AtomicU32,
    to: AtomicU32,
    address: AtomicUsize,
}

thread_local! {
    /// The index of this thread's last scope, plus one (0: none): a scope that begins where the
    /// last one ended (no allocation in between) reopens it, so a scope entered again and again
    /// in a loop takes one entry.
    static LAST_SCOPE: Cell<usize> = const { Cell::new(0) };
}

/// The chunk of entry `index` and its place there.
fn place(index: usize) -> (usize, usize) {
    let k = index / FIRST_CHUNK + 1;
    let chunk = k.ilog2() as usize;
    (chunk, index - FIRST_CHUNK * ((1 << chunk) - 1))
}

/// Entry `index`, its chunk mapped first if `map`; `None` if that chunk is not (or cannot be)
/// mapped.
fn entry(index: usize, map: bool) -> Option<&'static Entry> {
    let (chunk, at) = place(index);
    let slot = CHUNKS.get(chunk)?;
    let entries = if map {
        crate::sys::map_once(slot, (FIRST_CHUNK << chunk) * size_of::<Entry>())
    } else {
        slot.load(Ordering::Acquire)
    };
    // SAFETY: a mapped chunk holds `FIRST_CHUNK << chunk` entries (`at` is below that), zeroed
    // (a valid `Entry`: all atomics), and is never unmapped.
    unsafe { entries.as_ref().map(|_| &*entries.add(at)) }
}

/// Appends `ignored`; its index, or `None` when its chunk could not be mapped.
fn push(ignored: Ignored) -> Option<usize> {
    let index = CLAIMED.fetch_add(1, Ordering::Relaxed);
    let e = entry(index, true)?;
    let what = match ignored {
        Ignored::Block {
            address,
            thread,
            seq,
        } => {
            e.address.store(address, Ordering::Relaxed);
            e.thread.store(thread, Ordering::Relaxed);
            e.seq.store(seq, Ordering::Relaxed);
            BLOCK
        }
        Ignored::Scope { thread, from, to } => {
            e.thread.store(thread, Ordering::Relaxed);
            e.seq.store(from, Ordering::Relaxed);
            e.to.store(to, Ordering::Relaxed);
            SCOPE
        }
    };
    e.what.store(what, Ordering::Release);
    Some(index)
}

/// The complete entries of the list.
fn recorded() -> impl Iterator<Item = Ignored> {
    (0..CLAIMED.load(Ordering::Relaxed)).filter_map(|index| {
        let e = entry(index, false)?;
        // `what` first: its Acquire is what makes the fields read after it complete.
        let what = e.what.load(Ordering::Acquire);
        let thread = e.thread.load(Ordering::Relaxed);
        match what {
            BLOCK => Some(Ignored::Block {
                address: e.address.load(Ordering::Relaxed),
                thread,
                seq: e.seq.load(Ordering::Relaxed),
            }),
            SCOPE => Some(Ignored::Scope {
                thread,
                from: e.seq.load(Ordering::Relaxed),
                to: e.to.load(Ordering::Relaxed),
            }),
            _ => None, // being written
        }
    })
}

/// Why a block is not reported: the two rules the report counts separately.
pub const IGNORE_LEAK: &str = "ignore_leak()";
pub const SCOPED: &str = "ScopedLeakIgnore";

/// `k15::memory::ignore_leak(ptr)`: the block is never reported as a leak, and what it points to
/// is reachable. Null and pointers that are no live block are ignored.
pub fn ignore_leak(ptr: *mut u8) {
    if ptr.is_null() {
        return;
    }
    let entry = match BlockHeader::lookup(ptr) {
        Lookup::Live(header, _) => {
            // SAFETY: a live header, read while the block is live (the caller owns it).
            let h = unsafe { &*header };
            Ignored::Block {
                address: ptr as usize,
                thread: h.thread(),
                seq: h.seq(),
            }
        }
        _ if crate::engine::allocator_of(ptr.cast_const()).is_some() => Ignored::Block {
            address: ptr as usize,
            thread: 0,
            seq: 0,
        },
        _ => return,
    };
    let _ = push(entry);
}

/// A token that ends no scope: its entry could not be mapped.
const NO_SCOPE: usize = usize::MAX;

/// Starts a `ScopedLeakIgnore` on the calling thread; the token ends it.
pub fn begin_scope() -> usize {
    let (thread, next_seq) = crate::tracker::guard::next_sequence();
    let last = LAST_SCOPE.with(Cell::get);
    if let Some(index) = last.checked_sub(1) {
        // Closed exactly where this one begins: reopened, covering the same blocks as two.
        let reopened = entry(index, false).is_some_and(|e| {
            e.to.compare_exchange(next_seq, u32::MAX, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        });
        if reopened {
            return index;
        }
    }
    let scope = Ignored::Scope {
        thread,
        from: next_seq,
        to: u32::MAX,
    };
    match push(scope) {
        Some(index) => {
            LAST_SCOPE.with(|last| last.set(index + 1));
            index
        }
        None => NO_SCOPE,
    }
}

/// Ends the scope `begin_scope` returned `token` for.
pub fn end_scope(token: usize) {
    let (_, next_seq) = crate::tracker::guard::next_sequence();
    if let Some(e) = entry(token, false).filter(|e| e.what.load(Ordering::Acquire) == SCOPE) {
        e.to.store(next_seq, Ordering::Relaxed);
    }
}

/// The ignored blocks and scopes at report time, indexed for lookups by block.
pub struct IgnoreSet {
    blocks: std::collections::HashSet<(usize, u32, u32)>,
    /// `(thread, from, to)`, sorted, overlapping ones merged.
    scopes: Vec<(u32, u32, u32)>,
}

impl IgnoreSet {
    pub fn now() -> IgnoreSet {
        IgnoreSet::of(recorded())
    }

    fn of(entries: impl Iterator<Item = Ignored>) -> IgnoreSet {
        let mut set = IgnoreSet {
            blocks: std::collections::HashSet::new(),
            scopes: Vec::new(),
        };
        for entry in entries {
            match entry {
                Ignored::Block {
                    address,
                    thread,
                    seq,
                } => {
                    set.blocks.insert((address, thread, seq));
                }
                Ignored::Scope { thread, from, to } => set.scopes.push((thread, from, to)),
            }
        }
        set.scopes.sort_unstable();
        // Nested and overlapping scopes of a thread merged: at most one can hold a block.
        let mut merged: Vec<(u32, u32, u32)> = Vec::with_capacity(set.scopes.len());
        for scope in set.scopes.drain(..) {
            match merged.last_mut() {
                Some(last) if last.0 == scope.0 && scope.1 <= last.2 => {
                    last.2 = last.2.max(scope.2)
                }
                _ => merged.push(scope),
            }
        }
        set.scopes = merged;
        set
    }

    /// Which rule ignores the block allocated as `seq` by `thread` at `address`, if any.
    pub fn rule_for(&self, address: usize, thread: u32, seq: u32) -> Option<&'static str> {
        if self.blocks.contains(&(address, thread, seq)) {
            return Some(IGNORE_LEAK);
        }
        // Scopes of this thread that start at or before `seq`; nested ones may end earlier
        // than an enclosing one, so each is checked.
        let first = self.scopes.partition_point(|&(t, _, _)| t < thread);
        let last = self
            .scopes
            .partition_point(|&(t, from, _)| (t, from) <= (thread, seq));
        self.scopes[first..last]
            .iter()
            .any(|&(_, _, to)| seq < to)
            .then_some(SCOPED)
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty() && self.scopes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_double_and_leave_no_gap() {
        assert_eq!(place(0), (0, 0));
        assert_eq!(place(FIRST_CHUNK - 1), (0, FIRST_CHUNK - 1));
        assert_eq!(place(FIRST_CHUNK), (1, 0));
        assert_eq!(place(3 * FIRST_CHUNK - 1), (1, 2 * FIRST_CHUNK - 1));
        assert_eq!(place(3 * FIRST_CHUNK), (2, 0));
        assert_eq!(place(7 * FIRST_CHUNK), (3, 0));
    }

    #[test]
    fn nested_and_sequential_scopes_cover_exactly_their_allocations() {
        let mut list = vec![
            Ignored::Scope {
                thread: 2,
                from: 10,
                to: 20,
            },
            Ignored::Scope {
                thread: 2,
                from: 12,
                to: 15,
            }, // nested
            Ignored::Scope {
                thread: 2,
                from: 30,
                to: u32::MAX,
            }, // still open
            Ignored::Scope {
                thread: 3,
                from: 5,
                to: 6,
            },
            Ignored::Block {
                address: 0x1000,
                thread: 1,
                seq: 7,
            },
        ];
        list.reverse();
        let set = IgnoreSet::of(list.into_iter());
        let rule = |thread, seq| set.rule_for(0x2000, thread, seq);
        assert_eq!(
            [9, 10, 14, 19, 20, 29, 30, 99].map(|s| rule(2, s)),
            [
                None,
                Some(SCOPED),
                Some(SCOPED),
                Some(SCOPED),
                None,
                None,
                Some(SCOPED),
                Some(SCOPED)
            ]
        );
        assert_eq!([4, 5, 6].map(|s| rule(3, s)), [None, Some(SCOPED), None]);
        assert_eq!(rule(1, 10), None);
        assert_eq!(set.rule_for(0x1000, 1, 7), Some(IGNORE_LEAK));
        assert_eq!(
            set.rule_for(0x1000, 1, 8),
            None,
            "a later block at the same address"
        );
    }
}
