//! The memory under tracked blocks up to 128 KiB: size classes carved from our own mappings, a
//! free list per thread and class in front of a shared list per class, so a tracked
//! `new`/`delete` pair costs no glibc call, no lock and no atomic read-modify-write.
//!
//! A block here is header and user bytes together (`total` bytes, rounded up to its class).
//!
//! A free block in a thread's lists stays *parked* on the thread's shard list, its cookie saying
//! `FREED` (the report skips it): a `delete` of one of the thread's own blocks and the `new` that
//! reuses it then change no list neighbours, whose cache misses were the largest cost of a pair.
//! Blocks join the thread's shard list when a list of them comes to the thread (`refill`) and
//! leave it when a list goes back to the class (`retire_full_list`, thread exit). Blocks on the
//! shared stacks are on no shard list.
//!
//! A free block keeps its list links (bytes 0..16) and its size, stack and cookie (40..64), so a
//! second `delete` still finds `FREED` until the block is handed out again; bytes 16..40 link the
//! free lists:
//!
//! | word | in every free block | in the first block of a list on a shared stack |
//! | --- | --- | --- |
//! | 2 | next block of its list | |
//! | 3 | | next list |
//! | 4 | | blocks in this list |
//!
//! Memory moves between a thread and its class's shared stack in whole lists of up to
//! [`batch_blocks`] blocks, under the class lock (once per batch, not per call). A thread holds at
//! most two lists per class: `active` (allocations pop from it, frees push onto it) and one full
//! `spare`. Memory is never given back to the OS: a debug-run trade-off that keeps the hot path
//! short.
//!
//! An overrun of the block in front may reach a free block's links, so a free block's `FREED`
//! cookie covers its link to the next (`BlockHeader::set_free_link`), and a link is followed
//! only when the cookie of the block holding it vouches for it: a damaged list is given up,
//! never followed. (A list's head is a block the thread freed, a link so vouched for, or checked
//! to lie in the heap when the list comes off a shared stack.) The heap's spans lie in one reserved range with a page map, which also finds the
//! block any address falls into (bad frees of pointers inside a block, smashed headers).

use super::header::{BlockHeader, GUARD_SIZE, HEADER_SIZE};
use super::live_list::HeldShard;
use crate::sys::{self, PAGE_SIZE};
use core::cell::Cell;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The largest block (header included) served here; larger ones get their own mapping (`raw`).
/// Up to this size no tracked block comes from glibc, which may give the memory of a freed block
/// back to the OS, so that a second `delete` reading its header would fault.
const LARGEST_BLOCK: usize = 128 * 1024;

/// 16-byte steps up to 512 bytes, then four classes per power of two.
const FINE_CLASSES: usize = 32;
const CLASS_COUNT: usize = FINE_CLASSES + 4 * 8;

/// The largest alignment of a user pointer the heap serves. Classes whose size is a multiple of
/// it have every block (and so every user pointer, `HEADER_SIZE` after it) aligned to it.
const LARGEST_ALIGN: usize = 64;

/// The class of a block of `size` user bytes and `overhead` bytes of ours whose user pointer is
/// aligned to `align`, `None` when the heap does not serve that size or alignment.
#[inline]
pub fn class_for(size: usize, overhead: usize, align: usize) -> Option<u8> {
    if align > 16 {
        return aligned_class_for(size, overhead, align);
    }
    // Compared before adding: a size near usize::MAX would wrap.
    (size <= LARGEST_BLOCK - overhead).then(|| class_of(size + overhead) as u8)
}

/// [`class_for`] a user pointer aligned to more than 16 bytes: a class whose blocks are
/// aligned to [`LARGEST_ALIGN`].
#[inline(never)]
fn aligned_class_for(size: usize, overhead: usize, align: usize) -> Option<u8> {
    if size > LARGEST_BLOCK || align > LARGEST_ALIGN {
        return None;
    }
    let total = (size + overhead).next_multiple_of(LARGEST_ALIGN);
    (total <= LARGEST_BLOCK).then(|| class_of(total) as u8)
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
fn class_size(class: usize) -> usize {
    CLASSES[class].0
}

/// Blocks in a full list of class `class`.
#[inline]
fn batch_blocks(class: usize) -> u32 {
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

const fn size_of_class(class: usize) -> usize {
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

/// The word of a free block that links it to the next block of its list (its freed cookie
/// covers it: `BlockHeader::set_free_link`).
const NEXT_BLOCK: usize = super::header::FREE_LINK_WORD;
/// In the first block of a list on a shared stack: the next list, and the list's length.
/// They lie in the block's first user bytes, after the free stack (`record_free_stack`): the
/// header's words 3 and 4 (site, stack, size) must survive for a second `delete` to name them.
/// Every block has 16 user bytes at least (its class holds the header, the guard and one byte).
const NEXT_LIST: usize = (HEADER_SIZE + 8) / size_of::<usize>();
/// The list's length, a `u32` in the block's user bytes 4..8.
#[inline]
fn list_length(block: *mut u8) -> *mut u32 {
    block.wrapping_add(HEADER_SIZE + 4).cast()
}
const _: () = assert!((HEADER_SIZE + GUARD_SIZE).next_multiple_of(16) >= HEADER_SIZE + 16);

/// One list of free blocks, linked through [`NEXT_BLOCK`].
#[derive(Clone, Copy)]
struct List {
    head: *mut u8,
    count: u32,
}

const EMPTY: List = List {
    head: null_mut(),
    count: 0,
};

/// A block's word `index`.
///
/// # Safety
/// `block` is a free block of this heap (at least 40 bytes, 16-aligned) that the caller holds.
#[inline]
unsafe fn word(block: *mut u8, index: usize) -> *mut usize {
    (block as *mut usize).wrapping_add(index)
}

impl List {
    /// # Safety
    /// `block` is a free block of this list's class that nobody else holds.
    #[inline]
    unsafe fn push(&mut self, block: *mut u8) {
        // SAFETY: guaranteed by the caller.
        unsafe { BlockHeader::set_free_link(block.cast(), self.head) };
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
    unsafe fn checked(self) -> List {
        let mut good = List {
            head: self.head,
            count: 0,
        };
        let mut last: *mut u8 = null_mut();
        let mut block = self.head;
        while good.count < self.count {
            // SAFETY: the head, or a block a vouched-for link led to: a block of the heap.
            let Some(next) = (unsafe { BlockHeader::free_link(block.cast()) }) else {
                super::integrity::found_corruption(
                    block as usize,
                    super::integrity::Corrupted::FreeList,
                );
                if last.is_null() {
                    return EMPTY;
                }
                // SAFETY: `last` is a free block of the list, checked just before.
                unsafe { BlockHeader::set_free_link(last.cast(), null_mut()) };
                break;
            };
            last = block;
            good.count += 1;
            block = next;
        }
        good
    }

    /// Every block of the list.
    ///
    /// # Safety
    /// The list's blocks are free and held by the caller, and stay so while it iterates.
    unsafe fn blocks(self) -> impl Iterator<Item = *mut u8> {
        let mut block = self.head;
        (0..self.count).map(move |_| {
            let current = block;
            // SAFETY: guaranteed by the caller; `count` blocks are linked from `head`.
            block = unsafe { *word(current, NEXT_BLOCK) } as *mut u8;
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
}

struct ThreadHeap {
    classes: [ThreadLists; CLASS_COUNT],
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
                }
            }; CLASS_COUNT],
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

/// What a class's lock protects: full or partial lists given back by threads, and the rest of
/// the span being carved.
struct SharedClass {
    /// Stack of lists, linked through word 1 of their first block; word 2 is the list's count.
    lists: *mut u8,
    carve_next: *mut u8,
    carve_end: *mut u8,
}

// SAFETY: the pointers are into our own mappings and only followed under the class lock.
unsafe impl Send for SharedClass {}

static SHARED: [Mutex<SharedClass>; CLASS_COUNT] = [const {
    Mutex::new(SharedClass {
        lists: null_mut(),
        carve_next: null_mut(),
        carve_end: null_mut(),
    })
}; CLASS_COUNT];

/// A class lock. Nobody waits for a shard while holding one (`refill` lets go of it before it
/// links blocks), so it may be taken with a shard held or the world stopped.
fn shared(class: usize) -> MutexGuard<'static, SharedClass> {
    SHARED[class].lock().unwrap_or_else(PoisonError::into_inner)
}

/// A free block of class `class` (header included, 16-aligned, its user pointer never
/// page-aligned), parked on `mine` (the calling thread's shard, held): the caller makes it live
/// without linking it. `None` when no memory could be mapped.
#[inline]
pub fn take(class: u8, mine: &mut HeldShard<'_>) -> Option<*mut u8> {
    let class = class as usize;
    let lists = &thread_heap().classes[class];
    let mut head = lists.active.get();
    let mut count = lists.active_count.get();
    if count == 0 {
        (head, count) = match lists.spare.replace(null_mut()) {
            spare if !spare.is_null() => (spare, batch_blocks(class)),
            _ => refill(class, mine)?,
        };
    }
    // The link to the next block lies in this free block, where an overrun of the block in
    // front may have reached: followed only when the block's freed cookie vouches for it. The
    // head itself came from such a link, or from a list checked when it came to the thread.
    // SAFETY: `head` is the first of `count > 0` free blocks of the heap this thread holds.
    let Some(next) = (unsafe { BlockHeader::free_link(head.cast()) }) else {
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

/// Takes back a block of class `class` that is on `mine` (the calling thread's shard, held) and
/// marks it freed; it stays there, parked.
///
/// # Safety
/// `block` is a block from [`take`] of this class, on the list of `mine`, and nobody uses it
/// any more.
#[inline]
pub unsafe fn park(block: *mut u8, class: u8, mine: &mut HeldShard<'_>) {
    let class = class as usize;
    let lists = &thread_heap().classes[class];
    let mut head = lists.active.get();
    let mut count = lists.active_count.get();
    if count == batch_blocks(class) {
        retire_full_list(class, lists, head, mine);
        (head, count) = (null_mut(), 0);
    }
    // SAFETY: guaranteed by the caller: the block is free and now this thread's.
    unsafe { BlockHeader::set_free_link(block.cast(), head) };
    lists.active.set(block);
    lists.active_count.set(count + 1);
}

/// A full active list becomes the spare; a spare already there leaves the shard list and goes
/// back to the class.
#[cold]
#[inline(never)]
fn retire_full_list(class: usize, lists: &ThreadLists, full: *mut u8, mine: &mut HeldShard<'_>) {
    super::guard::arm_thread_exit();
    let spare = lists.spare.replace(full);
    if !spare.is_null() {
        // SAFETY: the spare's blocks are free, this thread's, and parked on `mine`.
        unsafe {
            let list = List {
                head: spare,
                count: batch_blocks(class),
            }
            .checked();
            if list.count > 0 {
                unpark(list, mine);
                give_back(class, list);
            }
        }
    }
}

/// Takes a list's blocks off the shard list they are parked on.
///
/// # Safety
/// The list's blocks are free, held by the caller and parked on `mine`.
unsafe fn unpark(list: List, mine: &mut HeldShard<'_>) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        for block in list.blocks() {
            mine.unlink(block as *mut BlockHeader);
        }
    }
}

/// A list for an empty thread, parked on `mine`: one given back by a thread, else freshly carved
/// blocks. The class lock is let go before the shard list is touched.
#[cold]
#[inline(never)]
fn refill(class: usize, mine: &mut HeldShard<'_>) -> Option<(*mut u8, u32)> {
    super::guard::arm_thread_exit();
    let list = {
        let mut shared = shared(class);
        loop {
            let head = shared.lists;
            if head.is_null() {
                break carve(&mut shared, class)?;
            }
            // SAFETY: the first block of a list on the shared stack, held under the class lock,
            // read once it is known to be in the heap.
            unsafe {
                if !contains(head as usize) || BlockHeader::free_link(head.cast()).is_none() {
                    // The stack's link is damaged: what lies behind it stays unused.
                    super::integrity::found_corruption(
                        head as usize,
                        super::integrity::Corrupted::FreeList,
                    );
                    shared.lists = null_mut();
                    continue;
                }
                shared.lists = *word(head, NEXT_LIST) as *mut u8;
                let list = List {
                    head,
                    count: (*list_length(head)).min(batch_blocks(class)),
                }
                .checked();
                if list.count > 0 {
                    break list;
                }
            }
        }
    };
    // SAFETY: the list's blocks are free, this thread's now, and on no shard list.
    unsafe {
        for block in list.blocks() {
            mine.link(block as *mut BlockHeader);
        }
    }
    Some((list.head, list.count))
}

/// Up to one batch of never-used blocks from the class's span, taking a new span when it is spent.
fn carve(shared: &mut SharedClass, class: usize) -> Option<List> {
    let size = class_size(class);
    let mut list = EMPTY;
    while list.count < batch_blocks(class) {
        if (shared.carve_end as usize - shared.carve_next as usize) < size {
            if list.count > 0 {
                break;
            }
            let span = span_bytes(class);
            let start = map_span(span, class)?;
            shared.carve_next = start.wrapping_add(first_block_offset(class));
            shared.carve_end = start.wrapping_add(span);
            continue;
        }
        let block = shared.carve_next;
        shared.carve_next = block.wrapping_add(size);
        if carve_skips(block as usize) {
            shared.carve_next = block.wrapping_add(LARGEST_ALIGN);
            continue;
        }
        // SAFETY: a fresh block of this class inside our span, handed to nobody yet.
        unsafe { list.push(block) };
    }
    Some(list)
}

/// Where a span's first block starts: at the span's start, but in classes that serve aligned
/// blocks (those whose size is a multiple of [`LARGEST_ALIGN`]) so far on that every user
/// pointer, `HEADER_SIZE` after its block, is aligned to it.
const fn first_block_offset(class: usize) -> usize {
    if size_of_class(class).is_multiple_of(LARGEST_ALIGN) {
        (LARGEST_ALIGN - HEADER_SIZE % LARGEST_ALIGN) % LARGEST_ALIGN
    } else {
        0
    }
}

/// Whether `carve` leaves out the block it would cut at `block`: a page-aligned user pointer
/// would cost each of its frees a page probe (`header`). Shifting the rest of the span by
/// LARGEST_ALIGN bytes keeps the next ones off page starts too, and the blocks of the classes
/// that serve aligned blocks aligned.
fn carve_skips(block: usize) -> bool {
    (block + HEADER_SIZE).is_multiple_of(PAGE_SIZE)
}

/// Each class carves spans of at least 256 KiB, and of at least four batches.
fn span_bytes(class: usize) -> usize {
    span_bytes_of(class)
}

const fn span_bytes_of(class: usize) -> usize {
    let batches = 4 * blocks_per_batch(class) as usize * size_of_class(class);
    let bytes = if batches > 256 * 1024 {
        batches
    } else {
        256 * 1024
    };
    bytes.next_multiple_of(PAGE_SIZE)
}

/// Gives a list of blocks on no shard list back to its class's shared stack.
fn give_back(class: usize, list: List) {
    let mut shared = shared(class);
    // SAFETY: the list's first block is free and ours until it is on the shared stack.
    unsafe {
        *word(list.head, NEXT_LIST) = shared.lists as usize;
        *list_length(list.head) = list.count;
    }
    shared.lists = list.head;
}

/// Gives back one freed block that is on no shard list (freed off another thread's list): it
/// tops up the list on top of its class's stack, so that threads still get whole lists.
///
/// # Safety
/// `block` is a block from [`take`] of class `class`, marked freed, on no shard list, and nobody
/// uses it any more.
pub unsafe fn give_back_block(block: *mut u8, class: u8) {
    let class = class as usize;
    let mut shared = shared(class);
    let top = shared.lists;
    // SAFETY: `top` is the first block of a list on the stack, held under the class lock, and
    // `block` is free and ours (guaranteed by the caller).
    unsafe {
        let top_length = if top.is_null() { 0 } else { *list_length(top) };
        if top_length == 0 || top_length == batch_blocks(class) {
            BlockHeader::set_free_link(block.cast(), null_mut());
            *word(block, NEXT_LIST) = top as usize;
            *list_length(block) = 1;
        } else {
            BlockHeader::set_free_link(block.cast(), top);
            *word(block, NEXT_LIST) = *word(top, NEXT_LIST);
            *list_length(block) = top_length + 1;
        }
    }
    shared.lists = block;
}

/// The heap's address space is reserved once, inaccessible, and made usable a region at a time:
/// one range, so that whether an address is the heap's is a subtraction and a compare
/// ([`contains`]), and a page map over it says which span and class each page belongs to
/// ([`block_containing`]). The first size the OS grants is used.
const RESERVE_BYTES: [usize; 3] = [64 << 30, 8 << 30, 1 << 30];
/// Bytes made usable at once.
const REGION_BYTES: usize = 64 * 1024 * 1024;

/// Where the heap's spans lie, side by side so that [`contains`] finds both with one address.
struct Carved {
    /// Start of the reservation; 0 until the first span.
    base: AtomicUsize,
    /// Bytes from `base` handed out as spans so far (only grows).
    bytes: AtomicUsize,
}

static CARVED: Carved = Carved {
    base: AtomicUsize::new(0),
    bytes: AtomicUsize::new(0),
};
/// One `u16` per page of the reservation: 0 where no span lies, else the page's index in its
/// span (low byte) and its class + 1 (high byte).
static PAGE_MAP: AtomicPtr<u16> = AtomicPtr::new(null_mut());

/// A span's pages are numbered in a byte.
const _: () = assert!(span_bytes_of(CLASS_COUNT - 1) <= 256 * PAGE_SIZE);

struct Region {
    /// Bytes of the reservation in all; 0 until it is made.
    reserved: usize,
    /// Bytes from the base made usable (a multiple of [`REGION_BYTES`]).
    usable: usize,
}

static REGION: Mutex<Region> = Mutex::new(Region {
    reserved: 0,
    usable: 0,
});

fn region() -> MutexGuard<'static, Region> {
    REGION.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether `addr` lies in a span of the heap (a block of it, or a free part of its spans).
#[inline(always)]
pub fn contains(addr: usize) -> bool {
    addr.wrapping_sub(CARVED.base.load(Ordering::Relaxed)) < CARVED.bytes.load(Ordering::Acquire)
}

/// A span of `bytes` for class `class`, entered in the page map.
fn map_span(bytes: usize, class: usize) -> Option<*mut u8> {
    let mut region = region();
    if region.reserved == 0 {
        reserve(&mut region)?;
    }
    let base = CARVED.base.load(Ordering::Relaxed);
    let carved = CARVED.bytes.load(Ordering::Relaxed);
    let end = carved.checked_add(bytes)?;
    while end > region.usable {
        let more = REGION_BYTES.min(region.reserved - region.usable);
        if more == 0 || !sys::commit_pages((base + region.usable) as *mut u8, more) {
            return None;
        }
        region.usable += more;
    }
    let first_page = carved / PAGE_SIZE;
    let map = PAGE_MAP.load(Ordering::Relaxed);
    for page in 0..bytes / PAGE_SIZE {
        // SAFETY: the map has one entry per page of the reservation, and the span lies in it;
        // entries are written here only, under the region lock, before the span is handed out.
        unsafe { *map.add(first_page + page) = ((class as u16 + 1) << 8) | page as u16 };
    }
    CARVED.bytes.store(end, Ordering::Release);
    Some((base + carved) as *mut u8)
}

/// Reserves the heap's address space and its page map.
#[cold]
fn reserve(region: &mut Region) -> Option<()> {
    for bytes in RESERVE_BYTES {
        let base = sys::reserve_pages(bytes);
        if base.is_null() {
            continue;
        }
        let map = sys::map_pages(bytes / PAGE_SIZE * size_of::<u16>());
        if map.is_null() {
            // SAFETY: the reservation was made just above and is used by nobody.
            unsafe { sys::unmap_pages(base, bytes) };
            return None;
        }
        PAGE_MAP.store(map.cast(), Ordering::Relaxed);
        CARVED.base.store(base as usize, Ordering::Relaxed);
        region.reserved = bytes;
        return Some(());
    }
    None
}

/// A block of the heap: where it starts (its header) and its class's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapBlock {
    pub start: usize,
    pub size: usize,
    pub class: u8,
}

/// The heap block whose bytes hold `addr`, from the page map and the order in which `carve`
/// cuts a span (whether the block is live, free or never used is for its header to say).
#[cold]
pub fn block_containing(addr: usize) -> Option<HeapBlock> {
    if !contains(addr) {
        return None;
    }
    let base = CARVED.base.load(Ordering::Relaxed);
    let page = (addr - base) / PAGE_SIZE;
    // SAFETY: `addr` is below CARVED, so its page has an entry, written before CARVED grew.
    let entry = unsafe { *PAGE_MAP.load(Ordering::Relaxed).add(page) };
    let class = (entry >> 8).checked_sub(1)? as usize;
    let span_start = base + (page - (entry & 0xff) as usize) * PAGE_SIZE;
    let size = class_size(class);
    let span_end = span_start + span_bytes(class);
    let mut block = span_start + first_block_offset(class);
    while block + size <= span_end {
        if carve_skips(block) {
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

/// Thread exit (`guard`): the thread's lists leave `mine` (its shard, held) and go back to
/// their classes.
pub fn give_back_thread_lists(mine: &mut HeldShard<'_>) {
    for (class, lists) in thread_heap().classes.iter().enumerate() {
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
                // SAFETY: the thread's own free blocks, parked on its shard.
                unsafe {
                    let list = list.checked();
                    if list.count > 0 {
                        unpark(list, mine);
                        give_back(class, list);
                    }
                }
            }
        }
    }
}

/// Every lock of the heap, held by `fork` (see `tracker::fork`), in the order `carve` nests them:
/// the class locks (never more than one at a time otherwise), then the region.
pub(crate) fn lock_for_fork() -> (
    Vec<MutexGuard<'static, impl Sized>>,
    MutexGuard<'static, impl Sized>,
) {
    let classes = (0..CLASS_COUNT).map(shared).collect();
    (classes, region())
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
                let class = class_for(total - HEADER_SIZE, HEADER_SIZE, align).unwrap() as usize;
                assert!(class_size(class) >= total);
                assert!(class_size(class).is_multiple_of(LARGEST_ALIGN), "{total}");
            }
        }
        assert_eq!(class_for(1, HEADER_SIZE, 128), None);
        assert_eq!(
            class_for(LARGEST_BLOCK + 1 - HEADER_SIZE, HEADER_SIZE, 16),
            None
        );
        assert_eq!(class_for(usize::MAX - 60, HEADER_SIZE, 64), None);
        // Enough blocks of a small class to cross many page starts (where carving skips ahead).
        let class = class_for(100, HEADER_SIZE, 64).unwrap();
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
    fn a_parked_block_is_reused_and_blocks_never_overlap() {
        let class = class_for(100, 0, 16).unwrap();
        with_my_shard(|mine| {
            let a = take(class, mine).unwrap();
            let b = take(class, mine).unwrap();
            assert!(b as usize + 112 <= a as usize || a as usize + 112 <= b as usize);
            assert!((a as usize).is_multiple_of(16));
            // SAFETY: both came from take(class) just above, are parked on `mine` and used by
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
    fn a_free_block_whose_link_changed_is_never_handed_out_again() {
        let class = class_for(10 * 1024, 0, 16).unwrap(); // a class no other test uses
        with_my_shard(|mine| {
            let blocks: [*mut u8; 3] = core::array::from_fn(|_| take(class, mine).unwrap());
            for &block in blocks.iter().rev() {
                // SAFETY: each came from take(class) just above and is used by nobody.
                unsafe { park(block, class, mine) };
            }
            // An overrun of the block in front of blocks[0] rewrites its link, to another free
            // block (blocks[1] would be lost) that lies in the heap and carries a freed cookie.
            // SAFETY: blocks[0] is a free block of the heap this thread holds.
            unsafe { *word(blocks[0], NEXT_BLOCK) = blocks[2] as usize };
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
    }

    #[test]
    fn blocks_parked_by_an_exited_thread_are_handed_out_again() {
        let class = class_for(30 * 1024, 0, 16).unwrap(); // a class no other test uses
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
    fn blocks_given_back_one_by_one_come_back_as_one_list() {
        let class = class_for(20 * 1024, 0, 16).unwrap(); // a class no other test uses
        let given: [usize; 3] = with_my_shard(|mine| {
            core::array::from_fn(|_| {
                let block = take(class, mine).unwrap();
                // SAFETY: fresh from take(class), parked on `mine`, used by nobody; off the
                // shard list it may go back to the class.
                unsafe {
                    mine.unlink(block as *mut BlockHeader);
                    give_back_block(block, class);
                }
                block as usize
            })
        });
        let taken = std::thread::spawn(move || {
            with_my_shard(|mine| {
                let taken: [usize; 3] =
                    core::array::from_fn(|_| take(class, mine).unwrap() as usize);
                let lists = &thread_heap().classes[class as usize];
                (taken, lists.active_count.get())
            })
        })
        .join()
        .unwrap();
        let (mut taken, left) = taken;
        taken.sort_unstable();
        let mut given = given;
        given.sort_unstable();
        assert_eq!(
            taken, given,
            "the three blocks did not come back as one list"
        );
        assert_eq!(left, 0);
    }
}
