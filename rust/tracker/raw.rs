//! The memory under each block: our heap (`heap`) for tracked blocks up to 128 KiB aligned up to
//! 64 bytes, our own mappings for larger ones (kept for the next large block after a `free`
//! within glibc's bounds, `kept_mappings`), the tracker's own heap (`sys::own_heap`, never
//! glibc's: a signal handler may allocate there whatever its thread was doing) for the tracker's
//! own memory and for more strongly aligned blocks, and a record of recently freed mapped blocks
//! so that a second `delete` of one is recognised without touching unmapped memory.

use super::header::{BlockHeader, Placement, FAR_PREFIX, GUARD_SIZE, HEADER_SIZE, SIZE_LIMIT};
use super::heap;
use super::kept_mappings;
use super::live_list::HeldShard;
use super::mapped_blocks;
use super::spans;
use crate::stack::StackId;
use crate::sys::{self, PAGE_SIZE};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Requests this large are mapped by us, and their unmapping recorded: the own heap maps large
/// blocks alone and unmaps them on free, and a double free would then read unmapped memory.
const MAPPED_THRESHOLD: usize = 120 * 1024;

/// The least offset of a user pointer from the start of a block of the program's from the own
/// heap: the header and the bytes in front of it, its list links, the copy of its header and
/// the offset of its memory (`header`).
const FAR_OFFSET: usize = HEADER_SIZE + FAR_PREFIX;

/// What a block from outside the heap keeps in front of its header.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Front {
    /// A block of the program's, listed on its shard: the whole [`FAR_PREFIX`].
    Listed,
    /// The tracker's own (on no list, never checked): the offset of its memory alone, in a
    /// word rounded to 16 bytes.
    Own,
}

impl Front {
    /// The least offset of the user pointer from the start of the block's memory.
    const fn offset(self) -> usize {
        match self {
            Front::Listed => FAR_OFFSET,
            Front::Own => HEADER_SIZE + 16,
        }
    }
}

/// The most a block from the own heap keeps in front of its user pointer: its alignment (below
/// a page: larger ones are mapped) past the header, and as much again where that would start a
/// page ([`malloc_user_offset`]). An offset read from a header beyond it is damage.
pub const LARGEST_MALLOC_OFFSET: usize = PAGE_SIZE;
const _: () =
    assert!(FAR_OFFSET.next_multiple_of(PAGE_SIZE / 2) + PAGE_SIZE / 2 <= LARGEST_MALLOC_OFFSET);

/// Memory for one block: `raw` is what gets released, `user` is what the program sees.
pub struct RawBlock {
    pub user: *mut u8,
    pub raw_offset: usize,
    pub placement: Placement,
    /// The heap's size class, for [`Placement::Heap`].
    pub class: u8,
}

/// A block of the heap for `size` bytes aligned to `align`, with a header in front and what its
/// class leaves behind as the guard, for the thread holding `mine`, its shard (see `heap`):
/// `None` when the heap does not serve that size or alignment (over 128 KiB, or aligned over 64)
/// or has no memory left. `compact`: the block keeps no site (no `K15_NEW` file), so a small one
/// may take a compact header. Apart from [`acquire_elsewhere`], so that the common path keeps the
/// block in registers.
#[inline(always)]
pub fn acquire_from_heap(
    size: usize,
    align: usize,
    compact: bool,
    mine: &mut HeldShard<'_>,
) -> Option<RawBlock> {
    // No overflow: the heap's sizes are far below usize::MAX, and larger ones are refused first.
    // The guard is what the class leaves; a block of 0 bytes still gets room (a free stack).
    let class = heap::class_for(size.max(1), align, compact)?;
    Some(heap_block(heap::take(class, mine)?, class))
}

/// [`acquire_from_heap`] of a block of `class` from the thread's active list alone (see
/// [`heap::take_from_active`]): `None`, with nothing changed, where that list cannot give one.
#[inline(always)]
pub fn acquire_from_active_list(class: u8, mine: &mut HeldShard<'_>) -> Option<RawBlock> {
    Some(heap_block(heap::take_from_active(class, mine)?, class))
}

#[inline(always)]
fn heap_block(raw: *mut u8, class: u8) -> RawBlock {
    RawBlock {
        user: raw.wrapping_add(HEADER_SIZE),
        raw_offset: HEADER_SIZE,
        placement: Placement::Heap,
        class,
    }
}

/// A block from the heap, else from our mappings or the own heap (then on no list). `None`
/// when exhausted or beyond what the address space can hold.
pub fn acquire_anywhere(
    size: usize,
    align: usize,
    compact: bool,
    mine: &mut HeldShard<'_>,
) -> Option<RawBlock> {
    if let Some(block) = acquire_from_heap(size, align, compact, mine) {
        return Some(block);
    }
    if size >= SIZE_LIMIT {
        return None;
    }
    let heap_serves = heap::class_for(size.max(1), align, compact).is_some();
    let size = size.checked_add(GUARD_SIZE)?;
    if heap_serves && spans::reserved() {
        // The heap is out of memory (its reservation full, `ulimit -v`): a block of the own
        // heap would keep its address space for good (its chunks are never unmapped), and a
        // program that ran out once could then map nothing more, nor the tracker write its
        // report. Mapped alone, the block's pages go back when it is freed.
        return acquire_mapped(size, align.max(16));
    }
    acquire_from_system(size, align, Front::Listed)
}

/// Memory from the own heap or our own mappings, never the heap: the tracker's own memory (a signal
/// handler may be allocating it while its thread is inside the heap), and what the heap cannot
/// serve. As [`acquire`], with the guard.
#[inline]
pub fn acquire_system(size: usize, align: usize) -> Option<RawBlock> {
    if size >= SIZE_LIMIT {
        return None;
    }
    acquire_from_system(size.checked_add(GUARD_SIZE)?, align, Front::Own)
}

/// [`acquire_system`] for `size` bytes, the guard included, with `front` in front.
#[inline]
fn acquire_from_system(size: usize, align: usize, front: Front) -> Option<RawBlock> {
    // The common case, kept short: default alignment, from the own heap, not page-aligned.
    if align <= 16 && size < MAPPED_THRESHOLD {
        let raw = sys::raw_alloc(front.offset() + size, 16);
        if !raw.is_null() {
            let user = raw.wrapping_add(front.offset());
            if !(user as usize).is_multiple_of(PAGE_SIZE) {
                return Some(RawBlock {
                    user,
                    raw_offset: front.offset(),
                    placement: Placement::Malloc,
                    class: 0,
                });
            }
            // SAFETY: fresh from raw_alloc and never handed out.
            unsafe { sys::raw_free(raw) };
        }
    }
    acquire_any(size, align, front)
}

/// A block counted against the budget (`budget=`), from wherever an unbudgeted one would come:
/// `None` when it does not fit.
#[cold]
#[inline(never)]
pub fn acquire_budgeted(
    size: usize,
    align: usize,
    compact: bool,
    mine: &mut HeldShard<'_>,
) -> Option<RawBlock> {
    let budget = super::budget::active()?;
    if !budget.charge(size) {
        return None;
    }
    let block = acquire_anywhere(size, align, compact, mine);
    if block.is_none() {
        budget.credit(size);
    }
    block
}

#[cold]
#[inline(never)]
fn acquire_any(size: usize, align: usize, front: Front) -> Option<RawBlock> {
    let align = align.max(16);
    if !align.is_power_of_two() || align > (1 << 30) {
        return None;
    }
    if size >= MAPPED_THRESHOLD || align >= PAGE_SIZE {
        return acquire_mapped(size, align.max(16));
    }
    // Page-aligned user pointers are kept for mapped blocks only, so freeing a malloc'd block
    // never needs the page probe (a syscall). Asking for `align` bytes more lets the user
    // pointer move off a page start. (Retrying the same size is no way out: chunks of a whole
    // number of pages carved one after another from a heap's top all start at the
    // same offset in their page, and such a retry recurred until the stack overflowed.)
    let total = front
        .offset()
        .next_multiple_of(align)
        .checked_add(size)?
        .checked_add(align)?;
    let raw = sys::raw_alloc(total, align);
    if raw.is_null() {
        return None;
    }
    let raw_offset = malloc_user_offset(raw as usize, align, front);
    Some(RawBlock {
        user: raw.wrapping_add(raw_offset),
        raw_offset,
        placement: Placement::Malloc,
        class: 0,
    })
}

/// Where the user pointer goes in a chunk at `raw` (aligned to `align`, below a page) with
/// `align` bytes to spare: right after the header and `front`, or `align` further on if that is
/// a page start.
fn malloc_user_offset(raw: usize, align: usize, front: Front) -> usize {
    let offset = front.offset().next_multiple_of(align);
    if (raw + offset).is_multiple_of(PAGE_SIZE) {
        offset + align
    } else {
        offset
    }
}

/// A mapping whose user pointer is page-aligned, with the header at the end of the page before:
/// kept pages of freed blocks where they hold it (not for alignments over a page), else fresh.
fn acquire_mapped(size: usize, align: usize) -> Option<RawBlock> {
    let slack = if align > PAGE_SIZE { align } else { 0 };
    let len = PAGE_SIZE
        .checked_add(slack)?
        .checked_add(size)?
        .checked_next_multiple_of(PAGE_SIZE)?;
    // Until the block is listed, a `munmap` of the program's may not come between.
    let mapping = mapping_change();
    let start = if slack == 0 {
        kept_mappings::take(len).unwrap_or_else(|| sys::map_pages(len))
    } else {
        sys::map_pages(len)
    };
    if start.is_null() {
        return None;
    }
    let user = (start as usize + PAGE_SIZE).next_multiple_of(align);
    let head = user - PAGE_SIZE - start as usize;
    let kept = (PAGE_SIZE + size).next_multiple_of(PAGE_SIZE);
    let tail = len - head - kept;
    // SAFETY: both trimmed ranges lie inside the fresh mapping and outside what is kept.
    unsafe {
        if head > 0 {
            sys::unmap_pages(start, head);
        }
        if tail > 0 {
            sys::unmap_pages((user + size).next_multiple_of(PAGE_SIZE) as *mut u8, tail);
        }
    }
    mapped_blocks::insert(user, kept);
    drop(mapping);
    spans::make_room_for_mapped_block();
    Some(RawBlock {
        user: user as *mut u8,
        raw_offset: PAGE_SIZE,
        placement: Placement::Mapped,
        class: 0,
    })
}

/// Gives the memory of a block not from the heap back. The header must already be marked freed.
/// A tracked mapped block is remembered ([`recently_unmapped`]) whether its pages are kept or
/// unmapped; the tracker's own are not (a signal handler may free one while its thread holds the
/// record's lock).
///
/// # Safety
/// `header` belongs to a block from [`acquire`] or [`acquire_system`], not from the heap, that
/// nobody else frees; `raw_offset` is its header's.
#[inline(never)]
pub unsafe fn release(header: *mut BlockHeader, raw_offset: usize, tracked: bool) {
    let user = BlockHeader::user_ptr(header);
    let raw = user.wrapping_sub(raw_offset);
    // SAFETY: guaranteed by the caller; the header stays readable until the memory goes.
    let (placement, size, alloc_stack) = unsafe {
        let h = &*header;
        (h.placement(), h.size(), h.alloc_stack())
    };
    match placement {
        // SAFETY: raw is the pointer raw_alloc returned for this block.
        Placement::Malloc => unsafe { sys::raw_free(raw) },
        // Never here: the free path parks heap blocks or gives them back.
        Placement::Heap => {}
        Placement::Mapped => {
            if tracked {
                remember_unmapped(UnmappedBlock {
                    user: user as usize,
                    size,
                    alloc_stack,
                    // SAFETY: a large block being unmapped.
                    free_stack: unsafe { super::recorded_free_stack(user) },
                });
            }
            // Between unlisting and keeping, no `munmap` of the program's may come.
            let _mapping = mapping_change();
            mapped_blocks::remove(user as usize);
            // SAFETY: the kept range of acquire_mapped for this block, no longer referenced.
            unsafe { kept_mappings::keep_or_unmap(raw, mapped_len(size)) };
        }
    }
}

/// Shares the mappings' lock (`sys::MapLock`) for a change of a large block's mapping, unless
/// the calling thread holds the others suspended (for a leak scan), one of which may be inside
/// a `munmap` of the program's: it would never let go.
fn mapping_change() -> Option<sys::MapChange> {
    if super::suspend::holds_others_suspended() {
        None
    } else {
        sys::MapChange::begin()
    }
}

/// The pages a mapped block of `size` user bytes keeps: the page of its header, its bytes and
/// guard.
fn mapped_len(size: usize) -> usize {
    (PAGE_SIZE + size + GUARD_SIZE).next_multiple_of(PAGE_SIZE)
}

/// Whether the pages of a mapped block (its header at `header`) may hold bytes other than 0:
/// kept pages of an earlier block's, which a `calloc` zeroes (fresh pages are zero already).
///
/// # Safety
/// `header` is a live [`Placement::Mapped`] block's.
pub unsafe fn mapping_reused(header: *mut BlockHeader) -> bool {
    let raw = BlockHeader::user_ptr(header).wrapping_sub(PAGE_SIZE);
    // SAFETY: guaranteed by the caller: the block's mapping starts a page before its user bytes.
    unsafe { kept_mappings::reused(raw) }
}

/// Resizes a mapped block of `old_size` user bytes (its header at `header`) to `new_size`:
/// its pages are grown or trimmed (`mremap`), and with `may_move` it may move, header and bytes
/// together. The new user pointer, or `None` (the block left as it was) where there is no room.
///
/// # Safety
/// `header` is a live [`Placement::Mapped`] block of `old_size` bytes that nobody else uses
/// meanwhile, and on no list if it `may_move`.
pub unsafe fn resize_mapping(
    header: *mut BlockHeader,
    old_size: usize,
    new_size: usize,
    may_move: bool,
) -> Option<*mut u8> {
    if new_size >= SIZE_LIMIT {
        return None;
    }
    let raw = BlockHeader::user_ptr(header).wrapping_sub(PAGE_SIZE);
    let (old_len, new_len) = (mapped_len(old_size), mapped_len(new_size));
    if old_len == new_len {
        return Some(BlockHeader::user_ptr(header));
    }
    // Until the table follows, a `munmap` of the program's may not come between.
    let _mapping = mapping_change();
    // SAFETY: guaranteed by the caller: the block's kept range (`acquire_mapped`).
    let start = unsafe { sys::remap_pages(raw, old_len, new_len, may_move) };
    if start.is_null() {
        return None;
    }
    if start == raw {
        mapped_blocks::resize(raw as usize + PAGE_SIZE, new_len);
    } else {
        mapped_blocks::remove(raw as usize + PAGE_SIZE);
        mapped_blocks::insert(start as usize + PAGE_SIZE, new_len);
    }
    Some(start.wrapping_add(PAGE_SIZE))
}

/// What is kept of a large block after its pages are gone.
#[derive(Clone, Copy)]
pub struct UnmappedBlock {
    pub user: usize,
    pub size: usize,
    pub alloc_stack: StackId,
    /// The stack of the `delete` that unmapped it (`free_stacks=1`), else 0.
    pub free_stack: StackId,
}

const UNMAPPED_HISTORY: usize = 1024;

struct UnmappedRing {
    entries: [Option<UnmappedBlock>; UNMAPPED_HISTORY],
    next: usize,
}

/// Large frees are rare and already pay a `munmap`, so one lock is fine here.
static UNMAPPED: Mutex<UnmappedRing> = Mutex::new(UnmappedRing {
    entries: [None; UNMAPPED_HISTORY],
    next: 0,
});

/// Where the record of unmapped blocks lies: its user addresses are of blocks gone (a new block
/// mapped at the same address is another's), not the program's pointers, so a leak scan skips it.
pub fn unmapped_record_range() -> core::ops::Range<usize> {
    sys::bytes_of(&UNMAPPED)
}

fn unmapped() -> MutexGuard<'static, UnmappedRing> {
    UNMAPPED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Held by `fork` (see `tracker::fork`).
pub(crate) fn lock_for_fork() -> MutexGuard<'static, impl Sized> {
    unmapped()
}

fn remember_unmapped(block: UnmappedBlock) {
    let mut ring = unmapped();
    let slot = ring.next;
    ring.entries[slot] = Some(block);
    ring.next = (slot + 1) % UNMAPPED_HISTORY;
}

/// The latest large free at `user`, if recent (the kept mappings and the OS give addresses out
/// again: older frees at the same address are other blocks').
pub fn recently_unmapped(user: usize) -> Option<UnmappedBlock> {
    let ring = unmapped();
    let (newer, older) = ring.entries.split_at(ring.next);
    newer
        .iter()
        .rev()
        .chain(older.iter().rev())
        .flatten()
        .find(|b| b.user == user)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk whose user pointer would fall on a page start gets it one alignment further on,
    /// inside the room asked for (retrying the same size was no way out: glibc carves chunks of
    /// a whole number of pages one after another at the same page offset, and the retry recurred
    /// until the stack overflowed).
    #[test]
    fn a_malloc_user_pointer_is_moved_off_a_page_start() {
        for (align, front) in [16, 64, 128, 2048]
            .into_iter()
            .zip([Front::Listed, Front::Own].iter().cycle())
        {
            let header = front.offset().next_multiple_of(align);
            let at_page = 7 * PAGE_SIZE - header;
            assert_eq!(malloc_user_offset(at_page, align, *front), header + align);
            assert!(!(at_page + header + align).is_multiple_of(PAGE_SIZE));
            assert_eq!(malloc_user_offset(at_page + align, align, *front), header);
        }
    }

    #[test]
    fn system_blocks_are_never_page_aligned_malloc_pointers() {
        let size = 5 * PAGE_SIZE - Front::Own.offset() - 16; // a chunk of exactly 5 pages
        let blocks: Vec<RawBlock> = (0..512)
            .map(|_| acquire_system(size, 16).expect("memory"))
            .collect();
        for block in blocks {
            assert!(!(block.user as usize).is_multiple_of(PAGE_SIZE));
            assert_eq!(block.placement, Placement::Malloc);
            // SAFETY: fresh from acquire_system, never handed out; raw as it computed.
            unsafe { sys::raw_free(block.user.wrapping_sub(block.raw_offset)) };
        }
    }
}
