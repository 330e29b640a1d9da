//! The memory under small tracked blocks: size classes carved from our own mappings, a free list
//! per thread and class in front of a shared list per class, so a tracked `new`/`delete` pair
//! costs no glibc call, no lock and no atomic read-modify-write.
//!
//! A block here is header and user bytes together (`total` bytes, rounded up to its class). A
//! free block keeps its header's last 48 bytes, so a second `delete` still finds the `FREED`
//! cookie until the block is handed out again; its first 24 bytes (the header's list links and
//! sequence number) link the free lists:
//!
//! | word | in every free block | in the first block of a batch on a shared list |
//! | --- | --- | --- |
//! | 0 | next block of its list | |
//! | 1 | | next batch |
//! | 2 | | blocks in this batch |
//!
//! Memory moves between a thread and its class's shared list in whole lists of up to
//! [`batch_blocks`] blocks, in O(1) under the class lock (once per batch, not per call). A thread
//! holds at most two lists per class: `active` (allocations pop from it, frees push onto it) and
//! one full `spare`. A thread's lists go back to the shared lists when it exits (`guard`). Memory is never given back to
//! the OS: a debug-run trade-off that keeps the hot path short.

use crate::sys::{self, PAGE_SIZE};
use core::cell::Cell;
use core::ptr::null_mut;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The largest block (header included) served here; larger ones go to glibc or get their own
/// mapping (`raw`).
pub const LARGEST_BLOCK: usize = 32 * 1024;

/// 16-byte steps up to 512 bytes, then four classes per power of two.
const FINE_CLASSES: usize = 32;
const CLASS_COUNT: usize = FINE_CLASSES + 4 * 6;

/// The class of a block of `total` bytes (1 ..= [`LARGEST_BLOCK`]).
#[inline]
fn class_of(total: usize) -> usize {
    let last = total - 1;
    if total <= FINE_CLASSES * 16 {
        return last >> 4;
    }
    let power = usize::BITS - 1 - last.leading_zeros(); // 9 ..= 14
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

/// About 32 KiB of blocks, at least 8, at most 64.
const fn blocks_per_batch(class: usize) -> u32 {
    let blocks = 32 * 1024 / size_of_class(class);
    if blocks < 8 {
        8
    } else if blocks > 64 {
        64
    } else {
        blocks as u32
    }
}

/// One list of free blocks, linked through word 0.
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
/// `block` is a free block of this heap (at least 24 bytes, 16-aligned) that the caller holds.
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
        unsafe { *word(block, 0) = self.head as usize };
        self.head = block;
        self.count += 1;
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

fn shared(class: usize) -> MutexGuard<'static, SharedClass> {
    SHARED[class].lock().unwrap_or_else(PoisonError::into_inner)
}

/// A block of `total` bytes (header included, 16-aligned, its user pointer never page-aligned),
/// or `None` when `total` is too large or no memory could be mapped.
#[inline]
pub fn allocate(total: usize) -> Option<*mut u8> {
    if total > LARGEST_BLOCK {
        return None;
    }
    let class = class_of(total);
    let lists = &thread_heap().classes[class];
    let mut head = lists.active.get();
    let mut count = lists.active_count.get();
    if count == 0 {
        (head, count) = match lists.spare.replace(null_mut()) {
            spare if !spare.is_null() => (spare, batch_blocks(class)),
            _ => refill(class)?,
        };
    }
    // SAFETY: `head` is the first of `count > 0` free blocks this thread holds, linked by word 0.
    lists.active.set(unsafe { *word(head, 0) } as *mut u8);
    lists.active_count.set(count - 1);
    Some(head)
}

/// Takes back a block from [`allocate`] for `total` bytes.
///
/// # Safety
/// `block` came from [`allocate`] with the same `total`, its header is marked freed, and nobody
/// uses it any more.
#[inline]
pub unsafe fn free(block: *mut u8, total: usize) {
    let class = class_of(total);
    let lists = &thread_heap().classes[class];
    let mut head = lists.active.get();
    let mut count = lists.active_count.get();
    if count == batch_blocks(class) {
        retire_full_list(class, lists, head);
        (head, count) = (null_mut(), 0);
    }
    // SAFETY: guaranteed by the caller: the block is free and now this thread's.
    unsafe { *word(block, 0) = head as usize };
    lists.active.set(block);
    lists.active_count.set(count + 1);
}

/// A full active list becomes the spare; a spare already there goes back to the class.
#[cold]
#[inline(never)]
fn retire_full_list(class: usize, lists: &ThreadLists, full: *mut u8) {
    super::guard::arm_thread_exit();
    let spare = lists.spare.replace(full);
    if !spare.is_null() {
        give_back(
            class,
            List {
                head: spare,
                count: batch_blocks(class),
            },
        );
    }
}

/// A list for an empty thread: one given back by a thread, else freshly carved blocks.
#[cold]
#[inline(never)]
fn refill(class: usize) -> Option<(*mut u8, u32)> {
    super::guard::arm_thread_exit();
    let mut shared = shared(class);
    if !shared.lists.is_null() {
        let head = shared.lists;
        // SAFETY: the first block of a list on the shared stack, held under the class lock.
        unsafe {
            shared.lists = *word(head, 1) as *mut u8;
            return Some((head, *word(head, 2) as u32));
        }
    }
    let fresh = carve(&mut shared, class)?;
    Some((fresh.head, fresh.count))
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
            let start = map_span(span)?;
            shared.carve_next = start;
            shared.carve_end = start.wrapping_add(span);
            continue;
        }
        let block = shared.carve_next;
        shared.carve_next = block.wrapping_add(size);
        if (block as usize + super::header::HEADER_SIZE).is_multiple_of(PAGE_SIZE) {
            // A page-aligned user pointer would cost each of its frees a page probe (`header`).
            // Shifting the rest of the span by 16 bytes keeps the next ones off page starts too.
            shared.carve_next = block.wrapping_add(16);
            continue;
        }
        // SAFETY: a fresh block of this class inside our span, handed to nobody yet.
        unsafe { list.push(block) };
    }
    Some(list)
}

/// Each class carves spans of at least 256 KiB, and of at least four batches.
fn span_bytes(class: usize) -> usize {
    (256 * 1024)
        .max(4 * batch_blocks(class) as usize * class_size(class))
        .next_multiple_of(PAGE_SIZE)
}

/// Gives a list back to its class's shared stack.
fn give_back(class: usize, list: List) {
    let mut shared = shared(class);
    // SAFETY: the list's first block is free and ours until it is on the shared stack.
    unsafe {
        *word(list.head, 1) = shared.lists as usize;
        *word(list.head, 2) = list.count as usize;
    }
    shared.lists = list.head;
}

/// Regions mapped at once; spans are cut from them so that the heap makes few mappings.
const REGION_BYTES: usize = 64 * 1024 * 1024;

struct Region {
    next: usize,
    end: usize,
}

static REGION: Mutex<Region> = Mutex::new(Region { next: 0, end: 0 });

fn region() -> MutexGuard<'static, Region> {
    REGION.lock().unwrap_or_else(PoisonError::into_inner)
}

fn map_span(bytes: usize) -> Option<*mut u8> {
    let mut region = region();
    if region.end - region.next < bytes {
        let len = REGION_BYTES.max(bytes);
        let start = sys::map_pages(len);
        if start.is_null() {
            return None;
        }
        region.next = start as usize;
        region.end = start as usize + len;
    }
    let span = region.next;
    region.next += bytes;
    Some(span as *mut u8)
}

/// Thread exit (`guard`): the thread's lists go back to their classes.
pub fn give_back_thread_lists() {
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
                give_back(class, list);
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

    #[test]
    fn a_freed_block_is_reused_and_blocks_never_overlap() {
        let a = allocate(100).unwrap();
        let b = allocate(100).unwrap();
        assert!(b as usize + 112 <= a as usize || a as usize + 112 <= b as usize);
        assert!((a as usize).is_multiple_of(16));
        // SAFETY: both came from allocate(100) just above and are used by nobody.
        unsafe { free(a, 100) };
        assert_eq!(allocate(100), Some(a));
        // SAFETY: as above.
        unsafe {
            free(a, 100);
            free(b, 100);
        }
    }

    #[test]
    fn blocks_freed_by_an_exited_thread_are_handed_out_again() {
        let total = 30 * 1024; // a class no other test uses
        let blocks = std::thread::spawn(move || {
            let blocks: Vec<usize> = (0..20).map(|_| allocate(total).unwrap() as usize).collect();
            for &block in &blocks {
                // SAFETY: each came from allocate(total) on this thread and is used by nobody.
                unsafe { free(block as *mut u8, total) };
            }
            blocks
        })
        .join()
        .unwrap();
        let again: Vec<usize> = (0..20).map(|_| allocate(total).unwrap() as usize).collect();
        assert!(
            again.iter().any(|block| blocks.contains(block)),
            "the exited thread's free blocks were lost"
        );
    }
}
