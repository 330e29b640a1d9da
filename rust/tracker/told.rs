//! Blocks the program tells the tracker about, whose memory it does not serve (an arena's
//! sub-blocks: `engine::client_pools`): their allocation number and stack, their tag's figures,
//! and the tracked block (the arena's) that holds them.
//!
//! A sub-block counts against the tag of the scope it was allocated in, as any block does. Its
//! bytes also lie inside the arena's own block, counted against that block's tag when the arena
//! was allocated: so that no byte counts twice, a sub-block's bytes are lent from the arena's
//! tag for as long as the sub-block lives (that tag's live bytes go down, its allocation counts
//! stay). The arena's block thus counts, per tag, only for the bytes no sub-block holds: the
//! pool's overhead. The process's counters (`stats()`) count the arena's block alone.

use super::guard::{self, Inside};
use super::header::{BlockHeader, Lookup};
use super::live_list::SHARDS;
use super::tags::{self, Loan, TagId};
use crate::stack::{StackId, StartFrame};

/// A sub-block's identity: who allocated it, when, from where, under which tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToldBlock {
    pub thread: u32,
    pub seq: u32,
    pub stack: StackId,
    pub tag: TagId,
}

/// A live tracked block that holds told blocks: where its bytes start and end, its tag, and
/// which allocation it is (so that a block allocated later at the same place is not taken for
/// it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arena {
    pub start: usize,
    pub end: usize,
    pub tag: TagId,
    pub thread: u32,
    pub seq: u32,
}

impl Arena {
    /// The live tracked block that starts at `start`.
    pub fn starting_at(start: usize) -> Option<Arena> {
        let Lookup::Live(header, _) = BlockHeader::lookup(start as *mut u8) else {
            return None;
        };
        // SAFETY: a live header of ours; its fields are plain values.
        let h = unsafe { &*header };
        Some(Arena {
            start,
            end: start + h.size(),
            tag: h.tag(),
            thread: h.thread(),
            seq: h.seq(),
        })
    }

    /// The live block of the tracker's heap whose bytes hold `addr` (the heap's span table: no
    /// syscall). Large blocks are found only from their start ([`Arena::starting_at`]).
    pub fn holding(addr: usize) -> Option<Arena> {
        let block = super::heap::block_containing(addr)?;
        Self::starting_at(block.user()).filter(|arena| arena.holds(addr, 1))
    }

    /// Whether it is still the live block it was.
    pub fn is_live(&self) -> bool {
        Self::starting_at(self.start).as_ref() == Some(self)
    }

    /// Whether `[addr, addr + size)` lies inside it.
    pub fn holds(&self, addr: usize, size: usize) -> bool {
        addr >= self.start && addr.saturating_add(size) <= self.end
    }
}

/// Records a block of `size` bytes told about now by the calling thread: its allocation number,
/// its stack from `start`, and its tag's figures (its bytes lent from `lent_from`, the tag of the
/// arena that holds it, see the module doc); reports the budgets it crossed. `None` inside the
/// tracker already (a nested call is not recorded).
#[cold]
#[inline(never)]
pub fn count_allocation(size: usize, lent_from: TagId, start: StartFrame) -> Option<ToldBlock> {
    let inside = Inside::enter()?;
    let (me, seq) = inside.next_allocation();
    let stack = super::capture_stack(&inside, start);
    let block = ToldBlock {
        thread: me.number,
        seq,
        stack,
        tag: inside.tag(),
    };
    if block.tag != 0 || lent_from != 0 {
        count_against(me, block.tag, size, lent_from, stack);
    }
    Some(block)
}

/// Counts a block of `size` bytes that another allocator served (`engine`'s) against `tag`,
/// the calling thread's scope when it was allocated at `stack`; reports the budgets it crossed.
#[cold]
#[inline(never)]
pub fn count_tagged_allocation(tag: TagId, size: usize, stack: StackId) {
    let Some(_inside) = Inside::enter() else {
        return;
    };
    count_against(guard::me(), tag, size, 0, stack);
}

/// The tag of the calling thread's innermost scope (0: none, or inside the tracker already).
pub fn current_tag() -> TagId {
    Inside::enter().map_or(0, |inside| inside.tag())
}

/// Counts `size` bytes against `tag` (if not 0) and lends them from `lent_from` (if not 0) on
/// `me`'s shard; reports the budgets crossed, at `stack`.
fn count_against(me: guard::Me, tag: TagId, size: usize, lent_from: TagId, stack: StackId) {
    let Some(held) = SHARDS[me.shard.index as usize].hold(me.number, me.shard.owned) else {
        return;
    };
    if lent_from != 0 {
        tags::shift_live_bytes(me.shard.index, lent_from, size, Loan::Lent);
    }
    let crossed = (tag != 0).then(|| tags::count_allocation(me.shard.index, tag, size));
    drop(held);
    for &(tag, live_bytes) in crossed.iter().flat_map(|c| c.tags()) {
        super::report_over_budget(tag, live_bytes, size, stack);
    }
}

/// Counts the end of a told block (or an engine allocator's tagged one) of `size` bytes tagged
/// `tag` whose bytes were lent from `lent_from` (0: none, or its arena is gone: nothing to give
/// back).
#[cold]
#[inline(never)]
pub fn count_free(size: usize, tag: TagId, lent_from: TagId) {
    if tag == 0 && lent_from == 0 {
        return;
    }
    let me = guard::me();
    let Some(held) = SHARDS[me.shard.index as usize].hold(me.number, me.shard.owned) else {
        return;
    };
    if tag != 0 {
        tags::count_free(me.shard.index, tag, size);
    }
    if lent_from != 0 {
        tags::shift_live_bytes(me.shard.index, lent_from, size, Loan::GivenBack);
    }
    drop(held);
}
