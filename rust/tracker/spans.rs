//! The heap's spans: one reserved range cut into spans, each serving one size class or free: a
//! 64 KiB unit for a small class, 16 units side by side for a large one; per class, the free
//! blocks of each of its spans; a span whose blocks have all come back is free for any class of
//! its kind, and past a few MiB kept ready its pages go back to the OS (`MADV_DONTNEED`), as do
//! the pages inside free blocks that hold whole pages.
//!
//! Blocks move here only in the heap's slow paths (a thread's list refilled or given back, a
//! block freed off another thread's list), under the class lock, so a `new`/`delete` pair of a
//! thread never comes here. A span counts the blocks it has handed out (live, on a thread's
//! lists, quarantined); when that count falls to 0 every block it ever carved is on its free
//! list, and the span leaves its class.
//!
//! Behind the last block carved from a span, and in the gaps carving leaves, lies a guard word
//! ([`GUARD`]), checked when the next block is carved there and by every walk
//! ([`for_each_block`]): the guard of a block whose class leaves it no slack is the next block's
//! header, and where there is no next block yet, this word. A span keeps [`GUARD_SIZE`] bytes
//! at its end for it.
//!
//! Behind the spans' range lie tables out of reach of an overrun: the side table, a word per 32
//! bytes ([`side_word`]), where compact blocks keep their header's word 0, and the record tables,
//! where every live block keeps its record ([`record_word`]: a word per block, touched only where
//! blocks lie).

use super::header::{BlockHeader, Layout, GUARD, GUARD_SIZE, HEADER_SIZE};
use super::heap::{self, List};
use crate::sys;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The span table's grain, and a small class's span (its alignment from the reservation's
/// start). Small classes share the heap's pages at this grain: a unit a class emptied serves
/// the next class that needs one while its pages are still resident. With 1 MiB spans for every
/// class, a class's emptied pages served only its own blocks until the whole MiB emptied, and
/// yaml-cpp's suite (tests each building some MiB of one class's nodes, then another's) faulted
/// 5,000 times against plain's 1,800; with units, 3,200 (`docs/benchmark-history.md`, stop 47).
pub const UNIT_BYTES: usize = 64 << 10;

/// A large class's span (and its alignment from the reservation's start, so that any of its
/// units finds the first, which holds its [`Span`]), 8 of the largest class's blocks.
const BIG_SPAN_BYTES: usize = 1 << 20;

/// Whether class `class` is large: its spans are [`BIG_SPAN_BYTES`] (a unit holds 7 blocks of
/// 8 KiB behind its colour, fewer of larger ones), never cut into units for small classes, nor
/// units joined for it.
const fn is_big(class: usize) -> bool {
    heap::size_of_class(class) > UNIT_BYTES / 8
}

/// The bytes of a span serving class `class`.
pub const fn span_bytes(class: usize) -> usize {
    span_size(is_big(class))
}

/// The first unit of the span serving `class` that unit `index` lies in.
const fn first_unit(index: u32, class: usize) -> u32 {
    index & !((span_bytes(class) / UNIT_BYTES) as u32 - 1)
}

/// Bytes of free spans whose pages stay resident (but those inside blocks that hold pages of
/// their own, see `return_inner_pages`), ready for the next class that needs a span: a program
/// whose classes take turns does not pay a page fault per page each time. Spans freed beyond
/// these go back to the OS at once, so that memory a program freed comes back
/// (`tests/memory_back.rs`: at most glibc's and these once everything is freed). yaml-cpp's
/// suite faulted 2,940 times with 4 MiB kept, 2,410 with 8, 2,290 with every span kept, 6,000
/// with none (plain 1,800); with 8, its peak RSS crossed 1.5x plain's (21.2 MiB against 14.1,
/// 20.9 with 4). Keeping as
/// many as ever served at once was tried (with 1 MiB spans): phases of 8 MB that take turns
/// between three classes faulted 28,000 times instead of 180,000 (glibc 42,000), but the
/// memory of a program that freed everything stayed resident.
const KEPT_FREE_BYTES: usize = 4 << 20;

/// The pages of free spans of one kind (small or large) kept resident that go back to the OS
/// when a span of the other kind is taken from memory not resident, and of either kind (small
/// first) when a block is mapped alone: a program whose phases move from small blocks to large
/// ones (or back) would else hold both at its peak (Bullet's scenes: 0.7 MiB more than with no
/// span kept, and 0.7 MiB more at stop 49 with the first rule alone). As much as a new span is
/// likely to touch soon (yaml-cpp, which takes large spans now and then between its tests' small
/// ones, faulted 2,780 times so with 8 MiB kept, 3,750 with a large span's 1 MiB sent back).
const ROOM_MADE_BYTES: usize = 256 << 10;

/// How much of a kept free span stays resident, from its first block, when another class takes
/// it: what that class's first lists carve (a full list is at most 64 blocks or 64 KiB). The
/// rest of what its last class used goes back: the new class may use the span for a few blocks,
/// and the old class's pages beyond them would stay resident, unused, for as long as the span
/// serves it (Bullet's scenes held 380 KiB so at their peak). A class that has filled a span
/// already keeps them: it will carve this one through too.
const KEPT_SPAN_BYTES: usize = 64 * 1024;

/// The heap's address space is reserved once, inaccessible, and made usable a region at a time:
/// one range, so that whether an address is the heap's is a subtraction and a compare
/// ([`contains`]). Its size (with the side and record tables, half more) is this, or the first
/// of [`reserve_sizes`] the OS grants.
const MOST_RESERVED: usize = 64 << 30;
/// Bytes made usable at once.
const REGION_BYTES: usize = 64 * 1024 * 1024;

/// Where the heap's spans lie, side by side so that [`contains`] finds both with one address.
struct Carved {
    /// Start of the reservation; 0 until the first span.
    base: AtomicUsize,
    /// Bytes from `base` handed out as spans so far (only grows: free spans stay in it).
    bytes: AtomicUsize,
    /// Start of the side table ([`side_word`]), reserved behind the spans' range.
    side: AtomicUsize,
}

static CARVED: Carved = Carved {
    base: AtomicUsize::new(0),
    bytes: AtomicUsize::new(0),
    side: AtomicUsize::new(0),
};

/// The side table has a word for every [`SIDE_STRIDE`] bytes of the spans' range: a compact
/// block's word 0 (`header`), one per 32-byte slot. Made usable with the spans' range, touched
/// only where compact blocks lie, and given back to the OS with their span.
const SIDE_STRIDE: usize = 32;

/// The side-table word of the compact block whose user pointer is `user`, an address of the
/// heap's spans (the word of another address is another's, or out of the table).
#[inline(always)]
pub fn side_word(user: usize) -> *mut usize {
    let offset = user.wrapping_sub(CARVED.base.load(Ordering::Relaxed)) / SIDE_STRIDE;
    (CARVED.side.load(Ordering::Relaxed) as *mut usize).wrapping_add(offset)
}

/// Where the blocks of a class keep their records: a word for each `1 << shift` bytes of the
/// spans' range, `shift` the largest power of two that the class's blocks reach, so that every
/// block has a word of its own (at most twice the words a block number would take: a 240-byte
/// class, 8 bytes per 128), in a table of its own for each shift (behind the side table). The
/// spans' range starts on a span boundary, so that a block's word is `origin + (user >> shift)
/// * 8`: two loads and two steps on every `new` and `delete`.
struct RecordTable {
    /// The table's start less the word the range's first byte would have (0 until reserved).
    origin: AtomicUsize,
    shift: u32,
}

const FIRST_SHIFT: u32 = 5;
const LAST_SHIFT: u32 =
    usize::BITS - 1 - heap::size_of_class(heap::CLASS_COUNT - 1).leading_zeros();

const fn record_shift(class: usize) -> u32 {
    usize::BITS - 1 - heap::size_of_class(class).leading_zeros()
}

static RECORD_TABLES: [RecordTable; heap::CLASS_COUNT] = {
    let mut tables = [const {
        RecordTable {
            origin: AtomicUsize::new(0),
            shift: FIRST_SHIFT,
        }
    }; heap::CLASS_COUNT];
    let mut class = 0;
    while class < heap::CLASS_COUNT {
        let shift = record_shift(class);
        tables[class].shift = if shift < FIRST_SHIFT {
            FIRST_SHIFT
        } else {
            shift
        };
        class += 1;
    }
    tables
};

/// Where the record table of `shift` starts, behind the side table of a reservation of `bytes`
/// starting at `base`: the tables of smaller shifts come first.
fn record_table_start(base: usize, bytes: usize, shift: u32) -> usize {
    let tables: usize = (FIRST_SHIFT..shift)
        .map(|s| record_table_bytes(bytes, s))
        .sum();
    base + bytes + side_bytes(bytes) + tables
}

/// The bytes of the record table of `shift` for `bytes` of the spans' range.
const fn record_table_bytes(bytes: usize, shift: u32) -> usize {
    (bytes >> shift) * size_of::<usize>()
}

/// The word where the live block of class `class` whose user pointer is `user` keeps its record
/// (`header`), an address of a span serving that class.
#[inline(always)]
pub fn record_word(user: usize, class: u8) -> *mut usize {
    let table = &RECORD_TABLES[class as usize];
    (table.origin.load(Ordering::Relaxed) as *mut usize).wrapping_add(user >> table.shift)
}

/// One byte per span of the reservation, read without a lock (bad frees, heap checks): 0 where
/// no span was ever handed out, `class + 1` for a span serving `class`, [`FREE`]` | class` for a
/// free span that last served `class`.
static OWNERS: AtomicPtr<AtomicU8> = AtomicPtr::new(null_mut());
const FREE: u8 = 0x80;
const _: () = assert!(heap::CLASS_COUNT < FREE as usize);

/// What a span knows of its blocks; under its class's lock while it serves a class, under the
/// region lock while it is free.
struct Span {
    /// Its free blocks, linked as a heap list.
    free: List,
    /// Blocks handed out of it and not yet back.
    handed_out: u32,
    /// Offset of its first byte never carved into blocks.
    carved: u32,
    /// Neighbours in its class's list of spans with blocks to hand out, or in a free-span stack.
    prev: u32,
    next: u32,
}

const NO_SPAN: u32 = u32::MAX;

/// One [`Span`] per span of the reservation (mapped with it, touched as spans are used).
static SPANS: AtomicPtr<Span> = AtomicPtr::new(null_mut());

/// The span record of span `index`.
///
/// # Safety
/// `index` is a span handed out (below [`CARVED`]) and the caller holds the lock that guards
/// it (its class's, or the region's for a free span).
#[allow(clippy::mut_from_ref)] // the lock the caller holds makes the reference exclusive
unsafe fn span(index: u32) -> &'static mut Span {
    // SAFETY: guaranteed by the caller; the table has an entry per span of the reservation.
    unsafe { &mut *SPANS.load(Ordering::Relaxed).add(index as usize) }
}

fn owner(index: u32) -> &'static AtomicU8 {
    // SAFETY: callers pass spans below CARVED, whose entries exist.
    unsafe { &*OWNERS.load(Ordering::Relaxed).add(index as usize) }
}

/// Where unit `index` starts (a span's start, for its first unit).
fn span_start(index: u32) -> usize {
    CARVED.base.load(Ordering::Relaxed) + index as usize * UNIT_BYTES
}

/// The unit `addr` lies in (an address of the heap).
fn unit_index(addr: usize) -> u32 {
    ((addr - CARVED.base.load(Ordering::Relaxed)) / UNIT_BYTES) as u32
}

/// The first unit of the span of class `class` that `addr` lies in.
fn span_index(addr: usize, class: usize) -> u32 {
    first_unit(unit_index(addr), class)
}

/// Whether `addr` lies in a span of the heap (a block of it, or a free part of its spans).
#[inline(always)]
pub fn contains(addr: usize) -> bool {
    addr.wrapping_sub(CARVED.base.load(Ordering::Relaxed)) < CARVED.bytes.load(Ordering::Acquire)
}

/// Whether the heap's address space is reserved (else every block comes from elsewhere).
pub fn reserved() -> bool {
    CARVED.base.load(Ordering::Relaxed) != 0
}

/// Whether `len` bytes from `addr` (an address of the heap) lie within its unit, and so within
/// its span (a large class's bytes across the end of a unit inside its span answer no too).
#[inline]
pub fn span_holds(addr: usize, len: usize) -> bool {
    (addr - CARVED.base.load(Ordering::Relaxed)) % UNIT_BYTES + len <= UNIT_BYTES
}

/// The start and class of the span serving a class that `addr` lies in; `None` outside the heap
/// and in free spans.
pub fn serving_span(addr: usize) -> Option<(usize, usize)> {
    if !contains(addr) {
        return None;
    }
    match owner(unit_index(addr)).load(Ordering::Acquire) {
        0 => None,
        byte if byte & FREE != 0 => None,
        byte => {
            let class = byte as usize - 1;
            Some((span_start(span_index(addr, class)), class))
        }
    }
}

/// The start and former class of the free span `addr` lies in: its blocks are all freed, and its
/// pages may be gone back to the OS (their headers with them).
pub fn free_span(addr: usize) -> Option<(usize, usize)> {
    if !contains(addr) {
        return None;
    }
    let byte = owner(unit_index(addr)).load(Ordering::Acquire);
    (byte & FREE != 0).then(|| {
        let class = (byte & !FREE) as usize;
        (span_start(span_index(addr, class)), class)
    })
}

/// A class lock, unless it stays held past the tracker's patience (`live_list::lock_within`).
fn class_lock_within(class: usize) -> Option<MutexGuard<'static, ClassSpans>> {
    super::live_list::lock_within(&CLASSES[class])
}

/// What a class's lock protects: its spans with blocks to hand out (free or never carved),
/// linked through [`Span::next`] and [`Span::prev`].
struct ClassSpans {
    with_blocks: u32,
    /// How many spans serve the class.
    spans: u32,
}

static CLASSES: [Mutex<ClassSpans>; heap::CLASS_COUNT] = [const {
    Mutex::new(ClassSpans {
        with_blocks: NO_SPAN,
        spans: 0,
    })
}; heap::CLASS_COUNT];

/// A class lock. Nobody waits for a shard while holding one, so it may be taken with a shard
/// held or the world stopped; the region lock nests inside it.
fn class_lock(class: usize) -> MutexGuard<'static, ClassSpans> {
    CLASSES[class]
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

impl ClassSpans {
    /// # Safety
    /// `index` serves this class and is on no list; the class lock is held.
    unsafe fn push(&mut self, index: u32) {
        // SAFETY: guaranteed by the caller.
        unsafe {
            let s = span(index);
            s.prev = NO_SPAN;
            s.next = self.with_blocks;
            if self.with_blocks != NO_SPAN {
                span(self.with_blocks).prev = index;
            }
        }
        self.with_blocks = index;
    }

    /// # Safety
    /// `index` is on this class's list; the class lock is held.
    unsafe fn remove(&mut self, index: u32) {
        // SAFETY: guaranteed by the caller.
        unsafe {
            let (prev, next) = (span(index).prev, span(index).next);
            if prev == NO_SPAN {
                self.with_blocks = next;
            } else {
                span(prev).next = next;
            }
            if next != NO_SPAN {
                span(next).prev = prev;
            }
        }
    }
}

/// Up to `wanted` free blocks of class `class`, marked freed and on no list: first those that
/// came back to its spans, then fresh ones carved from them, then from a new span. Empty when no
/// memory could be had.
pub fn take_blocks(class: usize, wanted: u32) -> List {
    let size = heap::class_size(class);
    let layout = Layout::of_class(class);
    let bytes = span_bytes(class);
    let mut class_spans = class_lock(class);
    let mut list = heap::EMPTY;
    while list.count < wanted {
        let index = match class_spans.with_blocks {
            NO_SPAN => match new_span(class, class_spans.spans) {
                Some(index) => {
                    class_spans.spans += 1;
                    // SAFETY: a span just given to this class, on no list; its lock is held.
                    unsafe { class_spans.push(index) };
                    index
                }
                None => break,
            },
            index => index,
        };
        // SAFETY: a span of this class, under its lock.
        let s = unsafe { span(index) };
        let start = span_start(index);
        while list.count < wanted && s.free.count > 0 {
            // SAFETY: the span's free blocks are this class's, held under its lock.
            let Some(block) = (unsafe { s.free.pop_checked(start..start + bytes, layout) }) else {
                break; // a damaged link: the blocks behind it stay unused
            };
            // SAFETY: a free block of this class, now the caller's.
            unsafe { list.push(block, layout) };
            s.handed_out += 1;
        }
        while list.count < wanted && can_carve(s, size, bytes) {
            let block = start + s.carved as usize;
            check_guard_word(block);
            if heap::carve_skips(block, class) {
                s.carved += heap::LARGEST_ALIGN as u32;
                write_guard_word(start + s.carved as usize);
                continue;
            }
            s.carved += size as u32;
            let header = (block - heap::header_before_block(class)) as *mut BlockHeader;
            // SAFETY: a block of this class inside the span, never handed to anyone (or handed
            // out before the span was freed, all of them back since); pushing marks it freed.
            unsafe {
                BlockHeader::carve(header, layout);
                list.push(header.cast(), layout);
            }
            write_guard_word(start + s.carved as usize);
            s.handed_out += 1;
        }
        if s.free.count == 0 && !can_carve(s, size, bytes) {
            // SAFETY: on this class's list, under its lock.
            unsafe { class_spans.remove(index) };
        }
    }
    list
}

/// Whether a block of `size` bytes can still be carved from span `s` of `bytes`, leaving room
/// for the guard word behind it.
fn can_carve(s: &Span, size: usize, bytes: usize) -> bool {
    s.carved as usize + size + GUARD_SIZE <= bytes
}

/// Writes the guard word at `at`, behind the last block carved from a span (or a gap).
fn write_guard_word(at: usize) {
    // SAFETY: `at` lies in a span, below its end by at least the guard word (`can_carve`),
    // under its class lock: bytes nobody else uses.
    unsafe { (at as *mut u64).write(GUARD) };
}

/// Checks the guard word at `at` before a block is carved there: a write past the end of the
/// block in front reached it (recorded, for the report).
fn check_guard_word(at: usize) {
    // SAFETY: as in write_guard_word.
    let found = unsafe { (at as *const u64).read() };
    if found != GUARD {
        super::integrity::found_front_overrun(
            at,
            super::header::FirstWordDamage {
                found: found.to_ne_bytes(),
                was: GUARD.to_ne_bytes(),
            },
        );
    }
}

/// What a walk of the heap finds.
pub enum Found {
    /// The header of a block carved from a span (in any state), and its layout.
    Block(*mut BlockHeader, Layout),
    /// The guard word behind the last block carved from a span, or in a gap carving left.
    GuardWord(*mut u64),
}

/// What lies at `at`, right behind a block of class `class` that fills its class, as the span
/// table says now (read without the class lock: a block may be carved there meanwhile): the
/// header of the next block, or a guard word. `None` outside the heap.
pub fn behind(at: usize, class: usize) -> Option<Found> {
    if !contains(at) {
        return None;
    }
    let index = span_index(at, class);
    let start = span_start(index);
    let carved = carved_now(index);
    if at + GUARD_SIZE > start + span_bytes(class) {
        return None;
    }
    Some(if heap::carve_skips(at, class) || at >= start + carved {
        Found::GuardWord(at as *mut u64)
    } else {
        Found::Block(
            (at - heap::header_before_block(class)) as *mut BlockHeader,
            Layout::of_class(class),
        )
    })
}

/// Walks every span serving a class, with the world stopped (so no thread changes a header
/// but through a claim, or by giving blocks back to a class, whose lock is taken for each span).
/// `visit` learns whether the span was held still: not when `locked` is false (an exit from a
/// signal handler that may hold a class lock) or its class lock stayed held past the tracker's
/// patience (its holder is this very thread, interrupted, or stuck); the span table is then read
/// as it is.
pub fn for_each_block(locked: bool, mut visit: impl FnMut(Found, bool)) {
    let units = (CARVED.bytes.load(Ordering::Acquire) / UNIT_BYTES) as u32;
    for index in 0..units {
        let class = match owner(index).load(Ordering::Acquire) {
            0 => continue,
            byte if byte & FREE != 0 => continue,
            byte => byte as usize - 1,
        };
        if first_unit(index, class) != index {
            continue; // walked from its span's first unit
        }
        let class_lock = locked.then(|| class_lock_within(class)).flatten();
        let still = class_lock.is_some();
        if owner(index).load(Ordering::Acquire) != class as u8 + 1 {
            continue; // freed before the lock was had
        }
        // The class lock, when held, keeps it still.
        blocks_of_span(index, class, carved_now(index), |found| visit(found, still));
    }
}

/// How far span `index` (one handed out) is carved, read as one value without its class lock.
fn carved_now(index: u32) -> usize {
    // SAFETY: the table has an entry per span of the reservation; the field is read as one
    // value, whoever holds the class lock.
    (unsafe {
        (&raw const (*SPANS.load(Ordering::Relaxed).add(index as usize)).carved).read_volatile()
    }) as usize
}

/// The blocks and guard words of span `index`, carved for `class` up to `carved` bytes from its
/// start, in address order.
fn blocks_of_span(index: u32, class: usize, carved: usize, mut visit: impl FnMut(Found)) {
    let start = span_start(index);
    let end = start + carved;
    let size = heap::class_size(class);
    let layout = Layout::of_class(class);
    let header_before = heap::header_before_block(class);
    let mut block = start + heap::first_block_offset(start, class);
    while block < end {
        if heap::carve_skips(block, class) {
            visit(Found::GuardWord(block as *mut u64));
            block += heap::LARGEST_ALIGN;
        } else {
            let header = (block - header_before) as *mut BlockHeader;
            visit(Found::Block(header, layout));
            block += size;
        }
    }
    if block == end && end + GUARD_SIZE <= start + span_bytes(class) {
        visit(Found::GuardWord(end as *mut u64));
    }
}

/// Gives blocks of class `class` back to their spans: each span whose blocks are then all back
/// is freed.
///
/// # Safety
/// The list's blocks were handed out by [`take_blocks`] for this class, are marked freed, on no
/// list, checked (`List::checked`), and nobody uses them any more.
pub unsafe fn give_back(class: usize, list: List) {
    let size = heap::class_size(class);
    let layout = Layout::of_class(class);
    let bytes = span_bytes(class);
    let mut class_spans = class_lock(class);
    // SAFETY: guaranteed by the caller; `blocks` reads each link before the block is relinked.
    for block in unsafe { list.blocks(layout) } {
        let index = span_index(block as usize, class);
        // SAFETY: a span of this class (its block was handed out by it), under its lock.
        let s = unsafe { span(index) };
        if s.handed_out == 0 {
            // More blocks back than handed out: the count went wrong, and the span must never
            // go back to the OS on it (a live block may lie there). The block stays unused.
            super::integrity::found_corruption(
                block as usize,
                super::integrity::Corrupted::FreeList,
            );
            continue;
        }
        let had_blocks = s.free.count > 0 || can_carve(s, size, bytes);
        // SAFETY: the block is free and the caller's to give.
        unsafe { s.free.push(block, layout) };
        s.handed_out -= 1;
        if holds_pages(size) && s.free.count as usize > resident_free_blocks(class) {
            let start = span_start(index);
            // SAFETY: the span's free blocks are this class's, held under its lock.
            let older = unsafe { s.free.vouched_blocks(start..start + bytes, layout) }
                .nth(resident_free_blocks(class));
            if let Some(older) = older {
                // SAFETY: as above.
                unsafe { return_inner_pages(older, size) };
            }
        }
        // SAFETY: the span serves this class; on its list exactly when it had blocks.
        unsafe {
            if !had_blocks {
                class_spans.push(index);
            }
            if s.handed_out == 0 {
                class_spans.remove(index);
                class_spans.spans -= 1;
                free(index, class);
            }
        }
    }
}

/// Whether the blocks of a class of `size` bytes hold whole pages behind their header, which
/// go back to the OS while the block is free in its span (see [`return_inner_pages`]).
fn holds_pages(size: usize) -> bool {
    size >= 2 * sys::PAGE_SIZE
}

/// How many of a span's free blocks, the last given back, keep their pages (for a class whose
/// blocks hold pages): two full lists, which a thread may soon take again.
fn resident_free_blocks(class: usize) -> usize {
    2 * heap::batch_blocks(class) as usize
}

/// Gives the whole pages inside free block `block` (its header's address) of `size` bytes back
/// to the OS. Its header (link, cookie, site and stack) lies in its first bytes and stays: the
/// heap reads nothing else of a free block, and a block handed out again reads zeros there.
///
/// # Safety
/// `block` is a free block of the heap on a span's free list, whose class lock is held.
unsafe fn return_inner_pages(block: *mut u8, size: usize) {
    let first = (block as usize + HEADER_SIZE).next_multiple_of(sys::PAGE_SIZE);
    let end = (block as usize + size) & !(sys::PAGE_SIZE - 1);
    if first < end {
        // SAFETY: whole pages inside a free block behind its header, read by nobody until the
        // block is handed out again (guaranteed by the caller).
        unsafe { sys::return_pages(first as *mut u8, end - first) };
    }
}

/// Gives the pages inside the free blocks of class `class`'s spans that still hold theirs (the
/// last two lists' worth each span was given) back to the OS, for a class whose blocks hold
/// pages: a class the calling thread stopped using (`heap::give_back_idle_lists`), whose spans
/// stay for the blocks still live in them.
pub fn return_free_block_pages(class: usize) {
    let size = heap::class_size(class);
    if !holds_pages(size) {
        return;
    }
    let layout = Layout::of_class(class);
    let class_spans = class_lock(class);
    let mut index = class_spans.with_blocks;
    while index != NO_SPAN {
        // SAFETY: a span on this class's list, under its lock.
        let s = unsafe { span(index) };
        let start = span_start(index);
        // The blocks given back before these gave their pages back then.
        // SAFETY: the span's free blocks are this class's, held under its lock.
        for block in unsafe {
            s.free
                .vouched_blocks(start..start + span_bytes(class), layout)
        }
        .take(resident_free_blocks(class))
        {
            // SAFETY: as above.
            unsafe { return_inner_pages(block, size) };
        }
        index = s.next;
    }
}

/// What the region lock protects: how much of the reservation is usable, and the free spans.
struct Region {
    /// Bytes of the reservation in all; 0 until it is made.
    reserved: usize,
    /// Bytes from the base made usable (a multiple of [`REGION_BYTES`]).
    usable: usize,
    /// Free spans whose pages are still resident (see [`KEPT_FREE_BYTES`]), and those whose
    /// pages went back to the OS, small ones and large ones apart (indexed by `big`); each a
    /// stack linked through [`Span::next`].
    kept: [u32; 2],
    returned: [u32; 2],
}

/// The pages of the free spans kept resident ([`carved_pages`] of each): changed under the region
/// lock only, read without it where none kept means nothing to do
/// ([`make_room_for_mapped_block`], on every large block's path).
static KEPT_BYTES: AtomicUsize = AtomicUsize::new(0);

impl Region {
    /// The top of the free spans, large (`big`) or small, kept resident (`kept`) or returned to
    /// the OS.
    fn pop_free(&mut self, kept: bool, big: bool) -> Option<u32> {
        let stack = if kept {
            &mut self.kept[big as usize]
        } else {
            &mut self.returned[big as usize]
        };
        let top = *stack;
        if top == NO_SPAN {
            return None;
        }
        // SAFETY: a free span, on that stack, under the region lock.
        *stack = unsafe { span(top).next };
        if kept {
            // SAFETY: as above.
            KEPT_BYTES.fetch_sub(unsafe { carved_pages(top) }, Ordering::Relaxed);
        }
        Some(top)
    }

    /// Puts free span `index`, large (`big`) or small, on the stack of those kept resident
    /// (`kept`) or returned.
    ///
    /// # Safety
    /// `index` is a free span on no stack, and the region lock is held (`self`).
    unsafe fn push_free(&mut self, index: u32, kept: bool, big: bool) {
        let stack = if kept {
            // SAFETY: guaranteed by the caller.
            KEPT_BYTES.fetch_add(unsafe { carved_pages(index) }, Ordering::Relaxed);
            &mut self.kept[big as usize]
        } else {
            &mut self.returned[big as usize]
        };
        // SAFETY: guaranteed by the caller.
        unsafe { span(index).next = *stack };
        *stack = index;
    }

    /// Gives the pages of the free spans kept resident, large (`big`) or small, back to the OS,
    /// the last kept first, until those of `bytes` or all of them went back: the bytes that went.
    fn return_kept(&mut self, big: bool, bytes: usize) -> usize {
        let mut returned = 0;
        while returned < bytes {
            let Some(index) = self.pop_free(true, big) else {
                break;
            };
            // SAFETY: a free span, under the region lock: nobody serves it, so its pages may go.
            unsafe {
                returned += carved_pages(index);
                return_span_pages(index, last_class(index));
                self.push_free(index, false, big);
            }
        }
        returned
    }

    /// Whether free span `index` stays resident beside those kept already.
    ///
    /// # Safety
    /// `index` is a free span, and the region lock is held (`self`).
    unsafe fn keeps(&self, index: u32) -> bool {
        // SAFETY: guaranteed by the caller.
        KEPT_BYTES.load(Ordering::Relaxed) + unsafe { carved_pages(index) } <= KEPT_FREE_BYTES
    }
}

/// The bytes of free span `index` that its last class touched (at most: the pages inside its
/// free blocks may have gone back already): what it keeps resident, counted against
/// [`KEPT_FREE_BYTES`].
///
/// # Safety
/// `index` is a free span, and the region lock is held.
unsafe fn carved_pages(index: u32) -> usize {
    // SAFETY: guaranteed by the caller.
    (unsafe { span(index) }.carved as usize + GUARD_SIZE).next_multiple_of(sys::PAGE_SIZE)
}

/// The bytes of a large span (`big`) or a small one.
const fn span_size(big: bool) -> usize {
    if big {
        BIG_SPAN_BYTES
    } else {
        UNIT_BYTES
    }
}

static REGION: Mutex<Region> = Mutex::new(Region {
    reserved: 0,
    usable: 0,
    kept: [NO_SPAN; 2],
    returned: [NO_SPAN; 2],
});

fn region() -> MutexGuard<'static, Region> {
    REGION.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A span for class `class` (called under its lock), which `serving` spans serve already: a
/// free one (kept resident first), else a new one from the reservation.
fn new_span(class: usize, serving: u32) -> Option<u32> {
    let big = is_big(class);
    let mut region = region();
    let index = match region.pop_free(true, big) {
        Some(index) => {
            let last = last_class(index);
            // A class with a span full already will fill this one too: the pages stay.
            if last != class && serving == 0 {
                // SAFETY: a free span under the region lock: nobody uses its pages.
                unsafe { return_pages_beyond_first_lists(index, last) };
            }
            if RECORD_TABLES[last].shift != RECORD_TABLES[class].shift {
                // SAFETY: a free span under the region lock: nobody uses its old class's records
                // or side words.
                unsafe { return_class_tables(index, last) };
            }
            // Its records need no clearing: every block it handed out came back (a span is free
            // only then), and each cleared its record as it was freed. Cleared all the same, the
            // smallest classes' 64 pages of records came back at once on every reuse (20,000
            // short threads: 394,000 page faults against 141,000).
            index
        }
        // Pages given back to the OS, or never used: their side words read 0. The other kind's
        // kept spans make room for them (see `ROOM_MADE_BYTES`).
        None => {
            region.return_kept(!big, ROOM_MADE_BYTES);
            match region.pop_free(false, big) {
                Some(index) => index,
                None => fresh_span(&mut region, big)?,
            }
        }
    };
    // SAFETY: a span nobody serves, under the region lock; the class lock (held by the caller)
    // guards it from now on.
    unsafe {
        *span(index) = Span {
            free: heap::EMPTY,
            handed_out: 0,
            carved: heap::first_block_offset(span_start(index), class) as u32,
            prev: NO_SPAN,
            next: NO_SPAN,
        };
    }
    // SAFETY: a span nobody serves yet, whose `carved` was just set.
    write_guard_word(span_start(index) + unsafe { span(index) }.carved as usize);
    mark_owner(index, class, class as u8 + 1);
    Some(index)
}

/// Marks every unit of the span of `class` at `index` with owner byte `byte`.
fn mark_owner(index: u32, class: usize, byte: u8) {
    for unit in index..index + (span_bytes(class) / UNIT_BYTES) as u32 {
        owner(unit).store(byte, Ordering::Release);
    }
}

/// A span never used before, large (`big`) or small, from the reservation (made now if
/// needed). A large span starts on its own size: the units skipped to get there are left free
/// for small classes.
fn fresh_span(region: &mut Region, big: bool) -> Option<u32> {
    if region.reserved == 0 {
        reserve(region)?;
    }
    let base = CARVED.base.load(Ordering::Relaxed);
    let skipped_from = CARVED.bytes.load(Ordering::Relaxed);
    let carved = skipped_from.next_multiple_of(span_size(big));
    let end = carved.checked_add(span_size(big))?;
    while end > region.usable {
        let more = REGION_BYTES.min(region.reserved - region.usable);
        let side = CARVED.side.load(Ordering::Relaxed) + side_bytes(region.usable);
        if more == 0
            || !sys::commit_pages((base + region.usable) as *mut u8, more)
            || !sys::commit_pages(side as *mut u8, side_bytes(more))
        {
            return None;
        }
        region.usable += more;
    }
    for unit in (skipped_from..carved).step_by(UNIT_BYTES) {
        // SAFETY: a unit never handed out (its pages never touched), on no stack, under the
        // region lock.
        unsafe { region.push_free((unit / UNIT_BYTES) as u32, false, false) };
    }
    CARVED.bytes.store(end, Ordering::Release);
    Some((carved / UNIT_BYTES) as u32)
}

/// Gives back the pages of free span `index`, which last served `class`, beyond what another
/// class's first lists carve from it ([`KEPT_SPAN_BYTES`]): the headers there are of blocks
/// of `class`, which no bad free can name any more once the span serves another class.
///
/// # Safety
/// The span is free: nobody uses its pages.
unsafe fn return_pages_beyond_first_lists(index: u32, class: usize) {
    let start = span_start(index);
    let kept_end = (start + heap::first_block_offset(start, class) + KEPT_SPAN_BYTES)
        .next_multiple_of(sys::PAGE_SIZE);
    // SAFETY: the span is free; its `carved` is its last class's.
    let carved = unsafe { span(index).carved } as usize;
    let carved_end = (start + carved + GUARD_SIZE).next_multiple_of(sys::PAGE_SIZE);
    if kept_end < carved_end {
        // SAFETY: guaranteed by the caller.
        unsafe { sys::return_pages(kept_end as *mut u8, carved_end - kept_end) };
    }
}

/// Frees span `index`, whose blocks of class `class` are all back: it stays resident if
/// [`KEPT_FREE_BYTES`] allows, else its pages go back to the OS.
///
/// # Safety
/// The span serves `class`, is on no list, and the class lock is held.
unsafe fn free(index: u32, class: usize) {
    // The last look at what its blocks left behind: its memory goes to another class or back to
    // the OS, where a write past the end of a block that filled its class would be lost.
    // SAFETY: under the class lock, with every block of the span back on its free list.
    let carved = unsafe { span(index).carved };
    blocks_of_span(index, class, carved as usize, |found| {
        // SAFETY: as above: nobody else reads or writes these headers and words meanwhile.
        unsafe { super::integrity::check_left_behind(found) }
    });
    mark_owner(index, class, FREE | class as u8);
    let size = heap::class_size(class);
    // SAFETY: a free span now (its owner says so), under the region lock.
    if holds_pages(size) && unsafe { region().keeps(index) } {
        // Likely kept: the pages inside its blocks go, their headers stay (a second `delete`
        // reads one). Not under the region lock: a few hundred calls at most, which every
        // thread taking a span would wait for.
        blocks_of_span(index, class, carved as usize, |found| {
            if let Found::Block(header, _) = found {
                // SAFETY: a free block of a span nobody serves and no list holds but its own.
                unsafe { return_inner_pages(header.cast(), size) };
            }
        });
    }
    let mut region = region();
    // SAFETY: as above.
    let keep = unsafe { region.keeps(index) };
    if !keep {
        // SAFETY: the span's blocks are all free and on no list but its own, which goes away.
        unsafe { return_span_pages(index, class) };
    }
    // SAFETY: a free span now, under the region lock.
    unsafe { region.push_free(index, keep, is_big(class)) };
}

/// [`ROOM_MADE_BYTES`] of the free spans kept resident go back to the OS, small ones first: the
/// program took a block mapped alone, which no span serves. Nothing when the region lock is
/// held: the caller may be a signal handler whose thread holds it, or the thread that suspended
/// its holder for a leak scan.
pub fn make_room_for_mapped_block() {
    if KEPT_BYTES.load(Ordering::Relaxed) == 0 {
        return;
    }
    let Ok(mut region) = REGION.try_lock() else {
        return;
    };
    let returned = region.return_kept(false, ROOM_MADE_BYTES);
    region.return_kept(true, ROOM_MADE_BYTES.saturating_sub(returned));
}

/// Every free span's pages go back to the OS, the kept ones too (at exit, before the report:
/// memory the heap will hardly need again, and the symbolizer will).
pub fn return_kept_spans() {
    let mut region = region();
    for big in [false, true] {
        region.return_kept(big, usize::MAX);
    }
}

/// Gives the pages of span `index`, which last served `class`, and of what that class used of
/// the side and record tables back to the OS: few calls, as this runs under the class and region
/// locks (a signal handler that forks waits for them).
///
/// # Safety
/// The span is free: nobody uses its blocks or their side words.
unsafe fn return_span_pages(index: u32, class: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        sys::return_pages(span_start(index) as *mut u8, span_bytes(class));
        return_class_tables(index, class);
    }
}

/// Gives back what class `class` used of the side and record tables for span `index`.
///
/// # Safety
/// Nobody uses the span's side words or its records of that class.
unsafe fn return_class_tables(index: u32, class: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        if Layout::of_class(class) == Layout::Compact {
            return_side_words(index, class);
        }
        return_records(index, class);
    }
}

/// Gives the pages of the side table's part for span `index`, which last served `class`, back
/// to the OS.
///
/// # Safety
/// Nobody uses the span's side words.
unsafe fn return_side_words(index: u32, class: usize) {
    let side = CARVED.side.load(Ordering::Relaxed) + side_bytes(index as usize * UNIT_BYTES);
    // SAFETY: guaranteed by the caller.
    unsafe { sys::return_pages(side as *mut u8, side_bytes(span_bytes(class))) };
}

/// Gives the pages of span `index`'s part of the record table of `class` back to the OS, where
/// it fills whole pages (the tables of the largest classes share pages between spans).
///
/// # Safety
/// Nobody uses the span's records of that class.
unsafe fn return_records(index: u32, class: usize) {
    let bytes = record_table_bytes(span_bytes(class), RECORD_TABLES[class].shift);
    if bytes.is_multiple_of(sys::PAGE_SIZE) {
        let first = record_word(span_start(index), class as u8);
        // SAFETY: guaranteed by the caller.
        unsafe { sys::return_pages(first.cast(), bytes) };
    }
}

/// The class a free span last served.
fn last_class(index: u32) -> usize {
    (owner(index).load(Ordering::Acquire) & !FREE) as usize
}

/// The side table's bytes for `bytes` of the spans' range.
const fn side_bytes(bytes: usize) -> usize {
    bytes / SIDE_STRIDE * size_of::<usize>()
}

/// The sizes of the spans' range to try, largest first: [`MOST_RESERVED`], or under an
/// address-space limit (`ulimit -v`) a quarter of the limit (the range and its tables then take
/// three eighths of it, the tracker's other tables an eighth at most, and the program's own
/// mappings, thread stacks and large blocks the rest), then halves of that down to a region.
/// Whole spans each.
fn reserve_sizes() -> impl Iterator<Item = usize> {
    let whole_spans = |bytes: usize| bytes.max(REGION_BYTES) / BIG_SPAN_BYTES * BIG_SPAN_BYTES;
    let first =
        sys::address_space_limit().map_or(MOST_RESERVED, |limit| (limit / 4).min(MOST_RESERVED));
    core::iter::successors(Some(whole_spans(first)), move |&bytes| {
        (bytes > REGION_BYTES).then(|| whole_spans(bytes / 2))
    })
}

/// Reserves the heap's address space and its span tables.
#[cold]
fn reserve(region: &mut Region) -> Option<()> {
    for bytes in reserve_sizes() {
        let units = bytes / UNIT_BYTES;
        let table_bytes = (units * (size_of::<Span>() + 1)).next_multiple_of(sys::PAGE_SIZE);
        // A large span more, so that the range starts on a large span's boundary (see
        // `RecordTable`, `BIG_SPAN_BYTES`).
        let reserved = record_table_start(0, bytes, LAST_SHIFT + 1) + table_bytes + BIG_SPAN_BYTES;
        let start = sys::reserve_pages(reserved);
        if start.is_null() {
            continue;
        }
        let base = (start as usize).next_multiple_of(BIG_SPAN_BYTES);
        // The record tables in one piece (a mapping of their own each, per region, would be 26
        // more mappings for `fork` to copy); only their pages that records are written to are
        // ever resident. The span table behind them: in a mapping of its own, it could lie
        // right behind a large block's, where a long overrun of the block would rewrite how far
        // spans are carved, and the walks would leave the heap.
        let records = record_table_start(base, bytes, FIRST_SHIFT);
        let table = record_table_start(base, bytes, LAST_SHIFT + 1);
        if !sys::commit_pages(records as *mut u8, table + table_bytes - records) {
            // SAFETY: the reservation was made just above and is used by nobody.
            unsafe { sys::unmap_pages(start, reserved) };
            continue;
        }
        let table = table as *mut u8;
        CARVED.side.store(base + bytes, Ordering::Relaxed);
        for table in &RECORD_TABLES {
            let first_word = (base >> table.shift) * size_of::<usize>();
            let origin = record_table_start(base, bytes, table.shift).wrapping_sub(first_word);
            table.origin.store(origin, Ordering::Relaxed);
        }
        SPANS.store(table.cast(), Ordering::Relaxed);
        OWNERS.store(
            table.wrapping_add(units * size_of::<Span>()).cast(),
            Ordering::Relaxed,
        );
        CARVED.base.store(base, Ordering::Relaxed);
        region.reserved = bytes;
        return Some(());
    }
    None
}

/// Every lock of the heap, held by `fork` (see `tracker::fork`), in the order they nest: the
/// class locks (never more than one at a time otherwise), then the region.
pub(crate) fn lock_for_fork() -> (
    Vec<MutexGuard<'static, impl Sized>>,
    MutexGuard<'static, impl Sized>,
) {
    let classes = (0..heap::CLASS_COUNT).map(class_lock).collect();
    (classes, region())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fully_carved_span_keeps_a_guard_word_behind_its_last_block_that_walks_visit() {
        let class = heap::class_for(50 * 1024 - crate::tracker::header::HEADER_SIZE, 16, false)
            .unwrap() as usize; // a class no other test uses
        let size = heap::class_size(class);
        // More blocks than one span holds: the first span is carved to its end.
        let list = take_blocks(class, (span_bytes(class) / size) as u32 + 4);
        // SAFETY: the list's blocks are free and this test's.
        let blocks: Vec<usize> = unsafe { list.blocks(Layout::Full) }
            .map(|b| b as usize)
            .collect();
        let first = blocks.iter().map(|&b| span_index(b, class)).min().unwrap();
        let (carved, full) = {
            let _lock = class_lock(class);
            // SAFETY: a span of this class, under its lock.
            let s = unsafe { span(first) };
            (
                span_start(first) + s.carved as usize,
                !can_carve(s, size, span_bytes(class)),
            )
        };
        assert!(full, "the first span was not carved to its end");
        let last = blocks
            .iter()
            .copied()
            .filter(|&b| span_index(b, class) == first)
            .max();
        assert_eq!(
            last.map(|b| b + size),
            Some(carved),
            "no block ends where carving did"
        );
        assert!(carved + GUARD_SIZE <= span_start(first) + span_bytes(class));
        // SAFETY: inside the span, below its end (checked above).
        assert_eq!(unsafe { (carved as *const u64).read() }, GUARD);
        let mut visited = false;
        for_each_block(true, |found, _| {
            if let Found::GuardWord(word) = found {
                visited |= word as usize == carved;
            }
        });
        assert!(
            visited,
            "the walk skipped the guard word behind the span's last block"
        );
        // SAFETY: the blocks came from take_blocks for this class, free, checked and unused.
        unsafe { give_back(class, list) };
    }
}
