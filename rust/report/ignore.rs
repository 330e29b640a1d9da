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
        Lookup::Live(header) => {
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

/// Which rule ignores the block allocated as `seq` by `thread` at `address`, if any.
pub struct IgnoreSet(Vec<Ignored>);

impl IgnoreSet {
    pub fn now() -> IgnoreSet {
        IgnoreSet(
            IGNORED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }

    pub fn rule_for(&self, address: usize, thread: u32, seq: u32) -> Option<&'static str> {
        self.0.iter().find_map(|entry| match *entry {
            Ignored::Block {
                address: a,
                thread: t,
                seq: s,
            } if a == address && t == thread && s == seq => Some(IGNORE_LEAK),
            Ignored::Scope {
                thread: t,
                from,
                to,
            } if t == thread && (from..to).contains(&seq) && seq != 0 => Some(SCOPED),
            _ => None,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
