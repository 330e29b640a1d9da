//! Blocks that live on purpose: `ignore_leak(ptr)` and `ScopedLeakIgnore`, kept off the hot path.
//!
//! `ignore_leak` records the block's address with its thread and sequence number (so a later
//! block at the same address is not ignored). A scope records the calling thread's allocation
//! sequence at its start and end: the blocks that thread allocated in between are ignored, and
//! `new` pays nothing for it.

use crate::tracker::header::{BlockHeader, Lookup};
use std::sync::{Mutex, PoisonError};

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

static IGNORED: Mutex<Vec<Ignored>> = Mutex::new(Vec::new());

/// Why a block is not reported: the two rules the report counts separately.
pub const IGNORE_LEAK: &str = "ignore_leak()";
pub const SCOPED: &str = "ScopedLeakIgnore";

fn with_ignored<T>(f: impl FnOnce(&mut Vec<Ignored>) -> T) -> T {
    let _inside = crate::tracker::guard::Inside::enter(); // the list is the tracker's memory
    f(&mut IGNORED.lock().unwrap_or_else(PoisonError::into_inner))
}

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
                thread: h.thread,
                seq: h.seq,
            }
        }
        _ if crate::engine::allocator_of(ptr.cast_const()).is_some() => Ignored::Block {
            address: ptr as usize,
            thread: 0,
            seq: 0,
        },
        _ => return,
    };
    with_ignored(|list| list.push(entry));
}

/// Starts a `ScopedLeakIgnore` on the calling thread; the token ends it.
pub fn begin_scope() -> usize {
    let (thread, next_seq) = crate::tracker::guard::next_sequence();
    with_ignored(|list| {
        list.push(Ignored::Scope {
            thread,
            from: next_seq,
            to: u32::MAX,
        });
        list.len() - 1
    })
}

/// Ends the scope `begin_scope` returned `token` for.
pub fn end_scope(token: usize) {
    let (_, next_seq) = crate::tracker::guard::next_sequence();
    with_ignored(|list| {
        if let Some(Ignored::Scope { to, .. }) = list.get_mut(token) {
            *to = next_seq;
        }
    });
}

/// The ignored blocks and scopes at report time, indexed for lookups by block.
pub struct IgnoreSet {
    blocks: std::collections::HashSet<(usize, u32, u32)>,
    /// `(thread, from, to)`, sorted, overlapping ones merged.
    scopes: Vec<(u32, u32, u32)>,
}

impl IgnoreSet {
    pub fn now() -> IgnoreSet {
        let mut set = IgnoreSet {
            blocks: std::collections::HashSet::new(),
            scopes: Vec::new(),
        };
        for entry in IGNORED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            match *entry {
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
        *IGNORED.lock().unwrap() = list;
        let set = IgnoreSet::now();
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
