//! `realloc` in place: a block keeps its memory where its heap class, or for a mapped block its pages (grown or trimmed with `mremap`), has room, and becomes this call's block.
//!
//! A block resized in place is written again by the header's own writer, as a new block of
//! `realloc` would be: its size, kind (`realloc`), sequence number, thread and this call's stack
//! (so the leak report and the errors name the `realloc`, as when it moved), its cookie and its
//! guard behind the new size. The counters see what they saw when the block moved: a free of
//! the old size and an allocation of the new one (`total_frees` and `total_allocations` each
//! one more, `live_bytes` the new size); only `peak_bytes` no longer counts both blocks at once,
//! since there never are two.
//!
//! The block moves instead, as before (allocate, copy, free), wherever the move's free has
//! something to report or to do: a damaged guard or header, a block of another family, on
//! another thread's shard, or of the tracker's own; with `quarantine` (a stale pointer kept past
//! a `realloc` is then caught as a use after free), `budget` or `break_on`; and a block that would
//! not stay where a fresh block of its new size goes: a heap block that outgrows its class or
//! shrinks to half of it or less (unless its class is the new size's own; a block that grows
//! within its class stays, however much room is left: see [`room_to_grow`]), a mapped block that
//! shrinks to a size the heap serves, a block from glibc (aligned beyond the heap's reach).
//!
//! As `allocate` publishes a header, the block is rewritten while its shard is held: a report or
//! `check_heap()`, which stop the world first, never see it half written.

use super::guard::Inside;
use super::header::{BlockHeader, GuardCheck, Layout, NewBlock, Placement, GUARD_SIZE};
use super::live_list::SHARDS;
use super::raw::{self, RawBlock};
use super::{
    capture_allocation_stack, count_tagged_then, heap, init, owner, pending_stacks, tags, BlockKind,
};
use crate::stack::StartFrame;

/// `realloc` of the live block at `header` (its cookie `cookie` as the lookup saw it) to `size`
/// bytes (not 0) without copying its bytes: its user pointer (a mapped block's may change), or
/// `None`, with nothing changed, where it must move (see the module doc).
pub(super) fn resize_in_place(
    header: *mut BlockHeader,
    cookie: usize,
    size: usize,
    start: impl FnOnce() -> StartFrame,
) -> Option<*mut u8> {
    let hot = init::peek()?;
    if !hot.malloc() || hot.rare_allocation_options() || hot.quarantine() {
        return None;
    }
    // SAFETY: a live block of ours (its cookie just seen), which the program hands to this call.
    let h = unsafe { &*header };
    let stays = h.freed_by_its_family(BlockKind::Realloc)
        && h.guard_check() == GuardCheck::Intact
        && stays_in_place(h, size);
    if !stays {
        return None;
    }
    let inside = Inside::enter()?;
    let me = inside
        .me_on_own_shard()
        .filter(|me| me.shard.index == h.shard())?;
    // The block takes the tag of the scope this `realloc` runs in; a compact header has no room
    // for one, so a compact block resized under a tag moves to a full one.
    let (old_tag, tag) = (h.tag(), inside.tag());
    if tag != 0 && h.layout() == Layout::Compact {
        return None;
    }
    let seq = inside.next_seq();
    let alloc_stack = capture_allocation_stack(hot, me, start);
    let mut held = SHARDS[me.shard.index as usize].hold(me.number, me.shard.owned)?;
    // A racing free of the same pointer by another thread: the move's free reports it.
    if !h.cookie_is(cookie) {
        return None;
    }
    let old_size = h.size();
    let mut block = RawBlock {
        user: BlockHeader::user_ptr(header),
        raw_offset: h.raw_offset(),
        placement: h.placement(),
        class: h.class(),
    };
    let mut relink = false;
    if block.placement == Placement::Mapped {
        // SAFETY: a live mapped block, ours for this call. Its pages grow in place where the
        // address space after them is free; else it moves, off its shard's list (held here:
        // its neighbours' links name its header), and goes back on it at its new address
        // below, or at once if it cannot be moved either.
        unsafe {
            block.user = match raw::resize_mapping(header, old_size, size, false) {
                Some(user) => user,
                None => {
                    held.unlink(header);
                    relink = true;
                    let Some(user) = raw::resize_mapping(header, old_size, size, true) else {
                        held.link(header);
                        return None;
                    };
                    user
                }
            }
        }
    }
    let new_block = NewBlock {
        size,
        kind: BlockKind::Realloc,
        file: core::ptr::null(),
        line: 0,
    };
    // The header's writer puts the guard in one 8-byte store that ends where the guard ends,
    // taking with it the user's last bytes where the guard is shorter: those are the program's
    // here, and are put back.
    let tail = block.user.wrapping_add(size.saturating_sub(GUARD_SIZE));
    // SAFETY: the block holds `size` bytes at its user pointer now (its class's room, or its
    // pages); its header lies in front of it (moved with its pages), and nobody else uses it
    // while its shard is held.
    let header = unsafe {
        let kept_tail = (size >= GUARD_SIZE).then(|| tail.cast::<u64>().read_unaligned());
        let header = BlockHeader::write(&block, &new_block, Some(owner(me, seq, alloc_stack, tag)));
        if let Some(bytes) = kept_tail {
            tail.cast::<u64>().write_unaligned(bytes);
        }
        header
    };
    pending_stacks::attach(alloc_stack, header, block.placement);
    if relink {
        // SAFETY: written just above, and on no list.
        unsafe { held.link(header) };
    }
    held.count_free(old_size);
    if old_tag != 0 {
        tags::count_free(me.shard.index, old_tag, old_size);
    }
    held.count_allocation(size);
    if tag != 0 {
        let owner = owner(me, seq, alloc_stack, tag);
        return Some(count_tagged_then(held, owner, size, block.user));
    }
    Some(block.user)
}

/// Whether a block resized to `size` stays where it is (see the module doc).
fn stays_in_place(h: &BlockHeader, size: usize) -> bool {
    match h.placement() {
        Placement::Heap => {
            let room = h.heap_room();
            size <= room
                && (size >= h.size()
                    || size > room / 2
                    || heap::class_for(size, 0, true) == Some(h.class()))
        }
        Placement::Mapped => heap::class_for(size, 0, true).is_none(),
        Placement::Malloc => false,
    }
}

/// The room for the block a `realloc` moves to: a heap block that grows moves to a class with
/// room to double (as far as the heap's largest), so a block grown in small steps (a log buffer,
/// a string builder) moves once per doubling rather than at every class; its copies then add up
/// to no more than twice its final size, and the calls between moves stay in place. A block
/// grown by doubling moves to what it asked for. The room only keeps the class free for it: its
/// size, guard and counts are what the program asked for.
pub(super) fn room_to_grow(old_size: usize, size: usize) -> usize {
    if size <= old_size || size > heap::LARGEST_ROOM {
        return size;
    }
    size.max(old_size.saturating_mul(2).min(heap::LARGEST_ROOM))
}
