//! The memory under tracked blocks up to 128 KiB: size classes carved from our own spans, a
//! free list per thread and class in front of each span's free list, so a tracked
//! `new`/`delete` pair costs no glibc call, no lock and no atomic read-modify-write.
//!
//! A block here is header and user bytes together (`total` bytes, rounded up to its class), on
//! no list while live: the report and `check_heap()` walk the spans (`spans::for_each_block`).
//! A `delete` of one of the thread's own blocks and the `new` that reuses it touch only the
//! block and the thread's own list heads. Blocks of up to 16 bytes without a site take the
//! compact class ([`COMPACT_CLASS`]: 16 header bytes in a 32-byte slot, see `header`); lists and
//! callers name every block by its header (for a compact block, 16 bytes in front of its slot).
//!
//! A free block keeps its site, stack, size and cookie (bytes 8..32), so a second `delete` still
//! finds `FREED` until the block is handed out again; word 0 (a compact block's side word) links
//! it to the next block of its free list.
//!
//! Memory moves between a thread and its class's spans (`spans`) in whole lists of up to
//! [`batch_blocks`] blocks, under the class lock (once per batch, not per call). A thread holds at
//! most two lists per class: `active` (allocations pop from it, frees push onto it) and one full
//! `spare`. A span whose blocks have all come back serves any class next, and its pages go back
//! to the OS (see `spans`).
//!
//! An overrun of the block in front may reach a free block's links, so a free block's `FREED`
//! cookie covers its link to the next (`BlockHeader::set_free_link`), and a link is followed
//! only when the cookie of the block holding it vouches for it: a damaged list is given up,
//! never followed. The heap's spans lie in one reserved range with a table of which class each
//! serves, which also finds the block any address falls into (bad frees of pointers inside a
//! block, smashed headers).

use super::header::{BlockHeader, Layout, COMPACT_CLASS, COMPACT_ROOM, GUARD_SIZE, HEADER_SIZE};
use super::live_list::HeldShard;
use super::spans::{self, UNIT_BYTES};
use crate::sys::PAGE_SIZE;
use core::cell::Cell;
use core::ptr::null_mut;

pub(crate) use super::spans::{contains, lock_for_fork};

/// The largest block (header included) served here; larger ones get their own mapping (`raw`).
/// Up to this size no tracked block comes from glibc, which may give the memory of a freed block
/// back to the OS, so that a second `delete` reading its header would fault.
const LARGEST_BLOCK: usize = 128 * 1024;

/// The most user bytes a heap block holds (in the largest class, with a full header).
pub const LARGEST_ROOM: usize = LARGEST_BLOCK - HEADER_SIZE;

/// 16-byte steps up to 512 bytes, then four classes per power of two.
const FINE_CLASSES: usize = 32;
pub(super) const CLASS_COUNT: usize = FINE_CLASSES + 4 * 8;

/// The largest alignment of a user pointer the heap serves. Classes whose size is a multiple of
/// it have every block (and so every user pointer, `HEADER_SIZE` after it) aligned to it.
pub(super) const LARGEST_ALIGN: usize = 64;

/// The class of a block of `size` user bytes whose user pointer is aligned to `align`, `None`
/// when the heap does not serve that size or alignment. With `compact` (the block has no site
/// to keep), up to [`COMPACT_ROOM`] bytes take the compact class ([`Layout::Compact`]).
#[inline]
pub fn class_for(size: usize, align: usize, compact: bool) -> Option<u8> {
    if align > 16 {
        return aligned_class_for(size, align);
    }
    if compact && size <= COMPACT_ROOM {
        return Some(COMPACT_CLASS);
    }
    // Compared before adding: a size near usize::MAX would wrap.
    (size <= LARGEST_ROOM).then(|| class_of(size + HEADER_SIZE) as u8)
}

/// [`class_for`] a user pointer aligned to more than 16 bytes: a class whose blocks are
/// aligned to [`LARGEST_ALIGN`].
#[inline(never)]
fn aligned_class_for(size: usize, align: usize) -> Option<u8> {
    if size > LARGEST_BLOCK || align > LARGEST_ALIGN {
        return None;
    }
    let total = (size + HEADER_SIZE).next_multiple_of(LARGEST_ALIGN);
    (total <= LARGEST_BLOCK).then(|| class_of(total) as u8)
}

/// The layout of the header of the heap block at user pointer `user`, as the span table says
/// (full for an address outside the heap's spans).
#[cold]
pub fn layout_at(user: usize) -> Layout {
    spans::serving_span(user)
        .or_else(|| spans::free_span(user))
        .map_or(Layout::Full, |(_, class)| Layout::of_class(class))
}

/// The class of a block of `total` bytes (1 ..= [`LARGEST_BLOCK`]).
#[inline]
fn class_of(total: usize) -> usize {
    let last = total - 1;
    if total <= FINE_CLASSES * 16 {
        return last >> 4;
    }
    let power = usize::BITS - 1 - last.leading_zeros(); // 9 ..= 16
    let quarter = (last >> (power - 2)) & 3;
    FINE_CLASSES + (power as usize - 9) * 4 + quarter
}

/// The block size of class `class`, a multiple of 16.
#[inline]
pub(super) fn class_size(class: usize) -> usize {
    CLASSES[class].0
}

/// Blocks in a full list of class `class`.
#[inline]
pub(super) fn batch_blocks(class: usize) -> u32 {
    CLASSES[class].1
}

/// Per class, its block size and the blocks in a full list: looked up, not computed, on the
/// hot path.
const CLASSES: [(usize, u32); CLASS_COUNT] = {
    let mut classes = [(0, 0); CLASS_COUNT];
    let mut class = 0;
    while class < CLASS_COUNT {
        classes[class] = (size_of_class(class), blocks_per_batch(class));
        class += 1;
    }
    classes
};

pub(super) const fn size_of_class(class: usize) -> usize {
    if class < FINE_CLASSES {
        return (class + 1) * 16;
    }
    let power = 9 + (class - FINE_CLASSES) / 4;
    let quarter = (class - FINE_CLASSES) % 4;
    (1 << power) + (quarter + 1) * (1 << (power - 2))
}

/// About 64 KiB of blocks, at least 2, at most 64.
const fn blocks_per_batch(class: usize) -> u32 {
    let blocks = 64 * 1024 / size_of_class(class);
    if blocks < 2 {
        2
    } else if blocks > 64 {
        64
    } else {
        blocks as u32
    }
}

/// One list of free blocks of one class, each named by its header, linked through the headers'
/// word 0 (its freed cookie covers it: `BlockHeader::set_free_link`).
#[derive(Clone, Copy)]
pub(super) struct List {
    head: *mut u8,
    pub(super) count: u32,
}

pub(super) const EMPTY: List = List {
    head: null_mut(),
    count: 0,
};

impl List {
    /// # Safety
    /// `block` is a free block of this list's class, whose headers are laid out as `layout`,
    /// that nobody else holds.
    #[inline]
    pub(super) unsafe fn push(&mut self, block: *mut u8, layout: Layout) {
        // SAFETY: guaranteed by the caller.
        unsafe { BlockHeader::set_free_link(block.cast(), self.head, layout) };
        self.head = block;
        self.count += 1;
    }

    /// The list up to its first block whose freed cookie does not vouch for its link (an
    /// overrun of the block in front may have reached it), reported; that block and those
    /// behind it stay unused.
    ///
    /// # Safety
    /// The list's head is a free block held by the caller, and so is each block whose cookie
    /// vouches for a link to it.
    unsafe fn checked(self, layout: Layout) -> List {
        let mut good = List {
            head: self.head,
            count: 0,
        };
        let mut last: *mut u8 = null_mut();
        let mut block = self.head;
        while good.count < self.count {
            // SAFETY: the head, or a block a vouched-for link led to: a block of the heap.
            let Some(next) = (unsafe { BlockHeader::free_link(block.cast(), layout) })
                .or_else(|| super::integrity::repair_free_link(block, layout))
            else {
                super::integrity::found_corruption(
                    block as usize,
                    super::integrity::Corrupted::FreeList,
                );
                if last.is_null() {
                    return EMPTY;
                }
                // SAFETY: `last` is a free block of the list, checked just before.
                unsafe { BlockHeader::set_free_link(last.cast(), null_mut(), layout) };
                break;
            };
            last = block;
            good.count += 1;
            block = next;
        }
        good
    }

    /// The list's first block, taken off it, once it lies in `bounds` and its freed cookie
    /// vouches for its link; a list whose head is not so (an overrun may have reached the link
    /// that led there) is given up, reported, and its blocks stay unused.
    ///
    /// # Safety
    /// The list's head is a free block held by the caller, and so is each block whose cookie
    /// vouches for a link to it; the list is not empty.
    pub(super) unsafe fn pop_checked(
        &mut self,
        bounds: core::ops::Range<usize>,
        layout: Layout,
    ) -> Option<*mut u8> {
        let block = self.head;
        let next = if bounds.contains(&(block as usize)) {
            // SAFETY: in the heap, so readable.
            unsafe { BlockHeader::free_link(block.cast(), layout) }
                .or_else(|| super::integrity::repair_free_link(block, layout))
        } else {
            None
        };
        let Some(next) = next else {
            super::integrity::found_corruption(
                block as usize,
                super::integrity::Corrupted::FreeList,
            );
            *self = EMPTY;
            return None;
        };
        self.head = next;
        self.count -= 1;
        Some(block)
    }

    /// The list's blocks in `bounds`, from its head for as long as each block's freed cookie
    /// vouches for its link: the blocks a damaged link would lead to are left out.
    ///
    /// # Safety
    /// The list's head is a free block held by the caller, and so is each block whose cookie
    /// vouches for a link to it; they stay so while it iterates.
    pub(super) unsafe fn vouched_blocks(
        self,
        bounds: core::ops::Range<usize>,
        layout: Layout,
    ) -> impl Iterator<Item = *mut u8> {
        let mut block = Some(self.head);
        (0..self.count).map_while(move |_| {
            let current = block.filter(|b| bounds.contains(&(*b as usize)))?;
            // SAFETY: guaranteed by the caller; `current` lies in the heap, so is readable.
            block = unsafe { BlockHeader::free_link(current.cast(), layout) };
            Some(current)
        })
    }

    /// Every block of the list.
    ///
    /// # Safety
    /// The list's blocks are free and held by the caller, and stay so while it iterates.
    pub(super) unsafe fn blocks(self, layout: Layout) -> impl Iterator<Item = *mut u8> {
        let mut block = self.head;
        (0..self.count).map(move |_| {
            let current = block;
            // SAFETY: guaranteed by the caller; `count` blocks are linked from `head`.
            block = unsafe { BlockHeader::free_link_unchecked(current.cast(), layout) };
            current
        })
    }
}

/// One thread's lists of one class: `active` as head and count, and `spare`, which is either
/// empty (null) or a full list of [`batch_blocks`] blocks.
struct ThreadLists {
    active: Cell<*mut u8>,
    active_count: Cell<u32>,
    spare: Cell<*mut u8>,
    /// How many lists the thread has taken from the class, up to [`SLOW_START_REFILLS`].
    refills: Cell<u8>,
    /// The active list's head when [`give_back_idle_lists`] last looked at the class.
    head_seen: Cell<*mut u8>,
}

/// A thread's first lists of a class are short (an eighth of a batch, then a quarter, a half):
/// a thread that allocates a few blocks of many classes, as each of hundreds of worker threads
/// may, does not hold a full batch of each.
const SLOW_START_REFILLS: u8 = 3;

/// How many blocks the next list of `class` for `lists` holds.
fn refill_blocks(class: usize, lists: &ThreadLists) -> u32 {
    let refills = lists.refills.get().min(SLOW_START_REFILLS);
    lists.refills.set(refills + 1);
    (batch_blocks(class) >> (SLOW_START_REFILLS - refills)).max(1)
}

struct ThreadHeap {
    classes: [ThreadLists; CLASS_COUNT],
    /// The class [`give_back_idle_lists`] looks at next.
    idle_cursor: Cell<u8>,
}

thread_local! {
    // `const` and without `Drop`: usable in every thread-exit destructor, C++ ones included.
    static THREAD_HEAP: ThreadHeap = const {
        ThreadHeap {
            classes: [const {
                ThreadLists {
                    active: Cell::new(null_mut()),
                    active_count: Cell::new(0),
                    spare: Cell::new(null_mut()),
                    refills: Cell::new(0),
                    head_seen: Cell::new(null_mut()),
                }
            }; CLASS_COUNT],
            idle_cursor: Cell::new(0),
        }
    };
}

/// The calling thread's heap in one TLS access (as `guard::this_thread`; `ThreadHeap` is not
/// `Sync`, so the reference cannot leave the thread).
#[inline(always)]
fn thread_heap() -> &'static ThreadHeap {
    // SAFETY: a `const` thread-local without `Drop` stays valid until the thread itself is gone.
    THREAD_HEAP.with(|heap| unsafe { &*(heap as *const ThreadHeap) })
}

/// Where the calling thread's heap lies: its list heads are header addresses (a compact
/// header's is the user address of the block in front), which a leak scan must not take for
/// the program's pointers.
pub fn thread_heap_range() -> core::ops::Range<usize> {
    crate::sys::bytes_of(thread_heap())
}

/// The header of a free block of class `class` (16-aligned; its user pointer, `HEADER_SIZE`
/// bytes on, never page-aligned), for the calling thread, which holds its shard (`mine`): a walk
/// of the heap waits until the caller has made the block live. `None` when no memory could be
/// mapped.
#[inline(always)]
pub fn take(class: u8, mine: &mut HeldShard<'_>) -> Option<*mut u8> {
    take_from_active(class, mine).or_else(|| take_otherwise(class, mine))
}

/// [`take`] from the thread's active list of `class`, when it has a block whose link vouches
/// for the next; `None`, with nothing changed, otherwise (the quick allocation path then leaves
/// the block to [`take`]). Calls nothing.
#[inline(always)]
pub fn take_from_active(class: u8, _mine: &mut HeldShard<'_>) -> Option<*mut u8> {
    let lists = &thread_heap().classes[class as usize];
    let head = lists.active.get();
    let count = lists.active_count.get();
    if count == 0 {
        return None;
    }
    // SAFETY: `head` is the first of `count > 0` free blocks of the heap this thread holds.
    let next = unsafe { BlockHeader::free_link(head.cast(), Layout::of_class(class as usize)) }?;
    lists.active.set(next);
    lists.active_count.set(count - 1);
    Some(head)
}

/// [`take`] where [`take_from_active`] could not: an empty active list, or a link to repair.
#[cold]
#[inline(never)]
fn take_otherwise(class: u8, mine: &mut HeldShard<'_>) -> Option<*mut u8> {
    let class = class as usize;
    let lists = &thread_heap().classes[class];
    let mut head = lists.active.get();
    let mut count = lists.active_count.get();
    if count == 0 {
        (head, count) = match lists.spare.replace(null_mut()) {
            spare if !spare.is_null() => (spare, batch_blocks(class)),
            _ => refill(class)?,
        };
    }
    // The link to the next block lies in this free block (or its side word), where an overrun
    // of the block in front may have reached: followed only when the block's freed cookie
    // vouches for it. The head itself came from such a link, or from a list checked when it
    // came to the thread.
    let layout = Layout::of_class(class);
    // SAFETY: `head` is the first of `count > 0` free blocks of the heap this thread holds.
    let Some(next) = (unsafe { BlockHeader::free_link(head.cast(), layout) })
        .or_else(|| super::integrity::repair_free_link(head, layout))
    else {
        return take_after_damage(class, mine, head);
    };
    lists.active.set(next);
    lists.active_count.set(count - 1);
    Some(head)
}

/// The active list of `class` led to `bad`, which is no free block of the heap: the rest of
/// that list is given up (its blocks stay unused) and a block is taken from another list.
#[cold]
#[inline(never)]
fn take_after_damage(class: usize, mine: &mut HeldShard<'_>, bad: *mut u8) -> Option<*mut u8> {
    super::integrity::found_corruption(bad as usize, super::integrity::Corrupted::FreeList);
    let lists = &thread_heap().classes[class];
    lists.active.set(null_mut());
    lists.active_count.set(0);
    take(class as u8, mine)
}

/// Takes back a block of class `class` for the calling thread's lists, which holds its shard
/// (`_mine`), and marks it freed.
///
/// # Safety
/// `block` is a block from [`take`] of this class, and nobody uses it any more.
#[inline]
pub unsafe fn park(block: *mut u8, class: u8, _mine: &mut HeldShard<'_>) {
    let class = class as usize;
    let lists = &thread_heap().classes[class];
    let mut head = lists.active.get();
    let mut count = lists.active_count.get();
    if count == batch_blocks(class) {
        retire_full_list(class, lists, head);
        (head, count) = (null_mut(), 0);
    }
    BlockHeader::clear_record(BlockHeader::user_ptr(block.cast()) as usize, class as u8);
    // SAFETY: guaranteed by the caller: the block is free and now this thread's.
    unsafe { BlockHeader::set_free_link(block.cast(), head, Layout::of_class(class)) };
    lists.active.set(block);
    lists.active_count.set(count + 1);
}

/// A full active list becomes the spare; a spare already there goes back to the class.
#[cold]
#[inline(never)]
fn retire_full_list(class: usize, lists: &ThreadLists, full: *mut u8) {
    super::guard::arm_thread_exit();
    give_back_idle_lists(class);
    let spare = lists.spare.replace(full);
    if !spare.is_null() {
        // SAFETY: the spare's blocks are free and this thread's.
        unsafe {
            give_back_checked(
                class,
                List {
                    head: spare,
                    count: batch_blocks(class),
                },
            )
        };
    }
}

/// Gives the blocks of a thread's list back to the class, up to the first whose link was
/// damaged (`List::checked`).
///
/// # Safety
/// The list's blocks are free, of class `class`, and held by the caller.
unsafe fn give_back_checked(class: usize, list: List) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        let list = list.checked(Layout::of_class(class));
        if list.count > 0 {
            give_back(class, list);
        }
    }
}

/// A list for an empty thread: blocks given back to the class's spans, else freshly carved ones.
#[cold]
#[inline(never)]
fn refill(class: usize) -> Option<(*mut u8, u32)> {
    super::guard::arm_thread_exit();
    give_back_idle_lists(class);
    let wanted = refill_blocks(class, &thread_heap().classes[class]);
    let list = spans::take_blocks(class, wanted);
    (list.count > 0).then_some((list.head, list.count))
}

/// Where the first block of the span at `span_start` starts, from the span's start: a colour
/// ([`SPAN_COLOURS`] of them, by span), and in classes that serve aligned blocks (those whose
/// size is a multiple of [`LARGEST_ALIGN`]) so far on that every user pointer, `HEADER_SIZE`
/// after its block, is aligned to it. A compact class's blocks start 16 bytes further, so that
/// their headers (16 bytes in front of each block) lie in the span too.
///
/// Spans are aligned to 64 KiB (1 MiB for large classes), and the blocks a program uses most
/// are each class's first ones: cut from the same offset in every span, they would all fall
/// into the same cache sets and evict each other (churn over 32 classes ran 15% slower so).
/// The colour mixes the 1 MiB number into the 64 KiB one, so that large spans (whose 64 KiB
/// numbers are all multiples of 16) take every colour too.
pub(super) fn first_block_offset(span_start: usize, class: usize) -> usize {
    let unit = span_start / UNIT_BYTES;
    let colour = (unit ^ (unit >> 4)) % SPAN_COLOURS * COLOUR_STEP;
    if size_of_class(class).is_multiple_of(LARGEST_ALIGN) {
        colour + (LARGEST_ALIGN - HEADER_SIZE % LARGEST_ALIGN) % LARGEST_ALIGN
    } else {
        colour + header_before_block(class)
    }
}

/// Span colours (see [`first_block_offset`]), a cache line apart, so that they differ in the set
/// of the L1 cache (bits 6..12) and of the larger ones, within a span's first page: a unit of
/// 64 KiB cannot skip pages, and the bytes a colour skips are resident (64 colours took 2.6%
/// more memory for 6 million small blocks, 16 none measurable).
const SPAN_COLOURS: usize = 16;
const COLOUR_STEP: usize = 64;
const _: () = assert!(COLOUR_STEP.is_multiple_of(LARGEST_ALIGN));

/// Whether carving leaves out the block it would cut at `block`: a page-aligned user pointer
/// would cost each of its frees a page probe (`header`). Shifting the rest of the span by
/// LARGEST_ALIGN bytes keeps the next ones off page starts too, and the blocks of the classes
/// that serve aligned blocks aligned.
pub(super) fn carve_skips(block: usize, class: usize) -> bool {
    (block + Layout::of_class(class).front()).is_multiple_of(PAGE_SIZE)
}

/// How far in front of its block a header of class `class` starts: 0 in full, 16 in compact
/// (whose header's first 16 bytes are not the block's).
pub(super) const fn header_before_block(class: usize) -> usize {
    HEADER_SIZE - Layout::of_class(class).front()
}

/// Gives a list of blocks back to its class's spans.
///
/// # Safety
/// The list's blocks are of class `class`, free, checked, and used by nobody.
unsafe fn give_back(class: usize, list: List) {
    // SAFETY: guaranteed by the caller.
    unsafe { spans::give_back(class, list) }
}

/// Gives back one freed block that no thread's lists hold (freed for another thread's shard).
///
/// # Safety
/// `block` is a block from [`take`] of class `class`, marked freed, and nobody uses it any more.
pub unsafe fn give_back_block(block: *mut u8, class: u8) {
    let mut list = EMPTY;
    // SAFETY: guaranteed by the caller.
    unsafe {
        list.push(block, Layout::of_class(class as usize));
        give_back(class as usize, list);
    }
}

/// A block of the heap: where it starts (its header's first byte in the block) and its class's
/// size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapBlock {
    pub start: usize,
    pub size: usize,
    pub class: u8,
}

impl HeapBlock {
    pub fn layout(&self) -> Layout {
        Layout::of_class(self.class as usize)
    }

    pub fn header(&self) -> *mut BlockHeader {
        (self.start - header_before_block(self.class as usize)) as *mut BlockHeader
    }

    pub fn user(&self) -> usize {
        self.start + self.layout().front()
    }

    /// The user bytes the block holds at most.
    pub fn room(&self) -> usize {
        self.size - self.layout().front()
    }
}

/// The heap block whose bytes hold `addr`, in a span serving a class, from the order in which
/// the spans are carved (whether the block is live, free or never used is for its header to say).
#[cold]
pub fn block_containing(addr: usize) -> Option<HeapBlock> {
    let (span_start, class) = spans::serving_span(addr)?;
    carved_block_containing(addr, span_start, class)
}

/// The block whose user pointer is `user` in a free span (one whose blocks all came back to it):
/// a block freed before its span went back to the OS, whose header may be gone with its pages.
#[cold]
pub fn block_of_free_span(user: usize) -> Option<HeapBlock> {
    let (span_start, class) = spans::free_span(user)?;
    carved_block_containing(user, span_start, class).filter(|block| block.user() == user)
}

/// The block of class `class` that holds `addr` in the span at `span_start`, if the span was cut
/// into blocks of that class.
fn carved_block_containing(addr: usize, span_start: usize, class: usize) -> Option<HeapBlock> {
    let size = class_size(class);
    let span_end = span_start + spans::span_bytes(class) - GUARD_SIZE;
    let mut block = span_start + first_block_offset(span_start, class);
    while block + size <= span_end {
        if carve_skips(block, class) {
            block += LARGEST_ALIGN;
            continue;
        }
        if addr < block + size {
            return (addr >= block).then_some(HeapBlock {
                start: block,
                size,
                class: class as u8,
            });
        }
        block += size;
    }
    None
}

/// Thread exit (`guard`): the thread's lists go back to their classes; `_mine`, its shard, is
/// held.
pub fn give_back_thread_lists(_mine: &mut HeldShard<'_>) {
    for (class, lists) in thread_heap().classes.iter().enumerate() {
        give_back_lists(class, lists);
    }
}

/// Gives a thread's lists of `class` back to the class's spans.
fn give_back_lists(class: usize, lists: &ThreadLists) {
    let active = List {
        head: lists.active.replace(null_mut()),
        count: lists.active_count.replace(0),
    };
    let spare = List {
        head: lists.spare.replace(null_mut()),
        count: batch_blocks(class),
    };
    for list in [active, spare] {
        if !list.head.is_null() {
            // SAFETY: the thread's own free blocks.
            unsafe { give_back_checked(class, list) };
        }
    }
}

/// At each list the thread takes from or gives to a class (the slow path; `busy`, whose lists
/// the caller is changing, is left alone), looks at one class in turn and gives its lists back
/// when its active list's head is the one seen at the last look:
/// the thread has not used the class since (a block taken and given back in between leaves the
/// head as it was, so a class in use may go back too: it refills at its next use).
///
/// A thread's lists of a class it no longer uses would otherwise keep their blocks, and with
/// them their spans, for as long as the thread lives: a level of a game that used many blocks
/// of a class and was unloaded left a span of 5,504 free blocks in Bullet's scenes, held by the
/// 120 in the thread's lists, which the next level could not use for another class.
fn give_back_idle_lists(busy: usize) {
    let heap = thread_heap();
    let class = heap.idle_cursor.get() as usize;
    heap.idle_cursor.set(((class + 1) % CLASS_COUNT) as u8);
    let lists = &heap.classes[class];
    let head = lists.active.get();
    if class == busy || (lists.active_count.get() == 0 && lists.spare.get().is_null()) {
        return;
    }
    if lists.head_seen.replace(head) == head {
        give_back_lists(class, lists);
        lists.head_seen.set(null_mut());
        lists.refills.set(0);
        spans::return_free_block_pages(class);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_lands_in_the_smallest_class_that_holds_it() {
        for total in 1..=LARGEST_BLOCK {
            let class = class_of(total);
            assert!(class < CLASS_COUNT, "{total}");
            assert!(
                class_size(class) >= total,
                "{total} in {}",
                class_size(class)
            );
            if class > 0 {
                assert!(class_size(class - 1) < total, "{total}");
            }
        }
        assert_eq!(class_size(CLASS_COUNT - 1), LARGEST_BLOCK);
    }

    /// Runs `f` with the calling thread's shard held, as the tracker does around the heap.
    fn with_my_shard<R>(f: impl FnOnce(&mut HeldShard<'_>) -> R) -> R {
        let me = crate::tracker::guard::me();
        let shard = &crate::tracker::live_list::SHARDS[me.shard.index as usize];
        f(&mut shard
            .hold(me.number, me.shard.owned)
            .expect("not held already"))
    }

    #[test]
    fn classes_for_aligned_requests_hand_out_aligned_user_pointers() {
        for total in (HEADER_SIZE + 1..=LARGEST_BLOCK).step_by(7) {
            for align in [32, 64] {
                let class = class_for(total - HEADER_SIZE, align, false).unwrap() as usize;
                assert!(class_size(class) >= total);
                assert!(class_size(class).is_multiple_of(LARGEST_ALIGN), "{total}");
            }
        }
        assert_eq!(class_for(1, 128, false), None);
        assert_eq!(class_for(LARGEST_BLOCK + 1 - HEADER_SIZE, 16, false), None);
        assert_eq!(class_for(usize::MAX - 60, 64, false), None);
        // Enough blocks of a small class to cross many page starts (where carving skips ahead).
        let class = class_for(100, 64, false).unwrap();
        with_my_shard(|mine| {
            let blocks: Vec<*mut u8> = (0..2000).map(|_| take(class, mine).unwrap()).collect();
            for &block in &blocks {
                let user = block as usize + HEADER_SIZE;
                assert!(user.is_multiple_of(64) && !user.is_multiple_of(PAGE_SIZE));
            }
            for block in blocks {
                // SAFETY: each came from take(class) just above and is used by nobody.
                unsafe { park(block, class, mine) };
            }
        });
    }

    #[test]
    fn a_freed_block_is_reused_and_blocks_never_overlap() {
        let class = class_for(100 - HEADER_SIZE, 16, false).unwrap();
        with_my_shard(|mine| {
            let a = take(class, mine).unwrap();
            let b = take(class, mine).unwrap();
            assert!(b as usize + 112 <= a as usize || a as usize + 112 <= b as usize);
            assert!((a as usize).is_multiple_of(16));
            // SAFETY: both came from take(class) just above, are this thread's and used by
            // nobody.
            unsafe { park(a, class, mine) };
            assert_eq!(take(class, mine), Some(a));
            // SAFETY: as above.
            unsafe {
                park(a, class, mine);
                park(b, class, mine);
            }
        });
    }

    #[test]
    fn a_free_block_whose_link_changed_is_repaired_and_one_whose_header_went_is_left_alone() {
        // A class no other test uses.
        let class = class_for(10 * 1024 - HEADER_SIZE, 16, false).unwrap();
        with_my_shard(|mine| {
            let blocks: [*mut u8; 3] = core::array::from_fn(|_| take(class, mine).unwrap());
            for &block in blocks.iter().rev() {
                // SAFETY: each came from take(class) just above and is used by nobody.
                unsafe { park(block, class, mine) };
            }
            // An overrun of the block in front of blocks[0] rewrites its link, to another free
            // block (blocks[1] would be lost) that lies in the heap and carries a freed cookie:
            // the cookie, which covers the link, gives it back.
            // SAFETY: blocks[0] is a free block of the heap this thread holds.
            unsafe { *blocks[0].cast::<usize>() = blocks[2] as usize };
            let taken: [*mut u8; 3] = core::array::from_fn(|_| take(class, mine).unwrap());
            assert_eq!(taken, blocks, "the damaged link was not repaired");
            for &block in taken.iter().rev() {
                // SAFETY: each came from take(class) just above and is used by nobody.
                unsafe { park(block, class, mine) };
            }
            // Now the cookie goes too: the block and those behind it are never handed out.
            // SAFETY: as above.
            unsafe {
                *blocks[0].cast::<usize>() = blocks[2] as usize;
                *blocks[0].cast::<usize>().add(3) ^= 0x4242;
            }
            let taken: [*mut u8; 12] = core::array::from_fn(|_| take(class, mine).unwrap());
            assert!(
                taken.iter().all(|block| !blocks.contains(block)),
                "a block of the damaged list was handed out"
            );
            for block in taken {
                // SAFETY: each came from take(class) just above and is used by nobody.
                unsafe { park(block, class, mine) };
            }
        });
        crate::tracker::integrity::report_found();
    }

    #[test]
    fn free_blocks_of_an_exited_thread_are_handed_out_again() {
        // A class no other test uses.
        let class = class_for(30 * 1024 - HEADER_SIZE, 16, false).unwrap();
        let blocks = std::thread::spawn(move || {
            with_my_shard(|mine| {
                let blocks: [usize; 20] =
                    core::array::from_fn(|_| take(class, mine).unwrap() as usize);
                for block in blocks {
                    // SAFETY: each came from take(class) on this thread and is used by nobody.
                    unsafe { park(block as *mut u8, class, mine) };
                }
                blocks
            })
        })
        .join()
        .unwrap();
        let again: [usize; 20] =
            with_my_shard(|mine| core::array::from_fn(|_| take(class, mine).unwrap() as usize));
        assert!(
            again.iter().any(|block| blocks.contains(block)),
            "the exited thread's free blocks were lost"
        );
    }

    #[test]
    fn blocks_given_back_one_by_one_are_handed_out_again() {
        // A class no other test uses.
        let class = class_for(20 * 1024 - HEADER_SIZE, 16, false).unwrap();
        let (given, held) = with_my_shard(|mine| {
            let blocks: [*mut u8; 4] = core::array::from_fn(|_| take(class, mine).unwrap());
            for &block in &blocks[..3] {
                // SAFETY: fresh from take(class) and used by nobody.
                unsafe { give_back_block(block, class) };
            }
            // The fourth stays out, so that its span keeps serving the class.
            (
                blocks[..3].iter().map(|&b| b as usize).collect::<Vec<_>>(),
                blocks[3] as usize,
            )
        });
        let mut taken = std::thread::spawn(move || {
            with_my_shard(|mine| {
                (0..3)
                    .map(|_| take(class, mine).unwrap() as usize)
                    .collect::<Vec<_>>()
            })
        })
        .join()
        .unwrap();
        taken.sort_unstable();
        let mut given = given;
        given.sort_unstable();
        assert_eq!(taken, given, "the three blocks given back were not reused");
        assert!(!taken.contains(&held));
        assert!(spans::serving_span(held).is_some_and(|(_, c)| c == class as usize));
    }
}
