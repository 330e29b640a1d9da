//! The block header in front of every tracked block, and how a pointer handed to `delete` is
//! recognised as ours, already freed, or foreign.
//!
//! Full layout (32 bytes, the user pointer follows it):
//!
//! | offset | field | note |
//! | --- | --- | --- |
//! | 0 | `seq`, `thread` | a free heap block's free-list link reuses these bytes |
//! | 8 | `site`, `alloc_stack` | `site`: `K15_NEW`'s file and line (or an allocator's name) as an id (`site`) in its low half, the block's tag (`tags`) in its high half |
//! | 16 | `packed` | `shard` (16), `kind` (17), `class` and `placement` (18: 6 and 2 bits), the size (bytes 19..24) |
//! | 24 | `cookie` | `LIVE`, `UNTRACKED`, `CLAIMED` or `FREED`, each `^ addr`; all but `FREED` also `^` the three words in front (less the stack id); `FREED` of a heap block `^` its free-list link (word 0) |
//!
//! Compact layout ([`Layout::Compact`]): the heap's blocks of 1 to 16 bytes without a site (no
//! `K15_NEW` file), the most numerous of all, take a 32-byte slot, 16 header bytes and 16 user
//! bytes, where the full layout would take 48. The header pointer is still the user pointer less
//! [`HEADER_SIZE`], but only its last 16 bytes are the block's: `packed` (the size in byte 19
//! alone, the stack in bytes 20..24 where the full layout keeps the size's high bytes; no site,
//! no tag: a tagged block is never compact) and the cookie. Word 0 (`seq`, `thread`, or the free-list link) lies in the heap's side table
//! (`spans::side_word`), out of reach of any overrun. Both layouts keep `packed`'s low three bytes
//! and the cookie at the same place in front of the user pointer, so the class byte tells which
//! layout a header has ([`BlockHeader::layout`]); a cold path that cannot trust it asks the span
//! table (`heap::layout_at`), and the cookie decides either way.
//!
//! There are no list links: a block of the heap (every block up to 128 KiB aligned up to 64,
//! nearly all) is found by walking the heap's spans (`spans::for_each_block`), whose table knows
//! each span's class and how far it was carved. Blocks outside the heap (large, over-aligned, the
//! tracker's own) are few: their shard-list links lie in the [`FAR_PREFIX`] in front of the
//! header ([`FarLinks`]), behind a copy of the header ([`far_copy`]: an underrun over the
//! whole header leaves the block known, as a heap block's record does), and in front of the
//! offset of their memory.
//!
//! The size, stack, site and cookie sit in the last 24 bytes, so they survive a free list's link
//! in a freed block (the heap's uses word 0; the own heap's, `sys::own_heap`, lies in front of
//! the [`FAR_PREFIX`]): a second `delete` still finds `FREED`.
//!
//! Every cookie covers the header's exposed word (the first thing a write past the end of the
//! block in front reaches: word 0 in full, `packed` in compact) unrotated: a cookie whose other
//! words still hold gives back that word as it was ([`BlockHeader::front_overrun`]), so such
//! damage is told from a foreign pointer, repaired and blamed on the block in front. A free heap
//! block's cookie covers its free-list link the same way (a compact one's, `packed` too), so the
//! heap follows a link only when the block holding it vouches for it
//! ([`BlockHeader::free_link`]).
//!
//! A live cookie covers the other words too: a block whose kind, class, placement or size changed
//! is no longer taken for a live block, instead of being freed into the wrong place.
//!
//! The cookie is also the check in front of the user's bytes: an underrun changes its top bytes
//! first (they lie next to the user pointer), so a cookie whose low bytes still match names the
//! block and how far the underrun reached. Behind the user's bytes lies a guard of
//! [`GUARD_BYTE`]s (not aligned: it starts right at the requested size): [`GUARD_SIZE`] bytes for
//! a block from outside the heap, and for a heap block what its class leaves, at most
//! [`GUARD_SIZE`]. Where the class leaves nothing, the next block's header is the guard (its
//! cookie covers its exposed word), and behind the last block carved from a span lies a guard
//! word (`spans`).

use super::raw::{self, RawBlock};
use super::tags::TagId;
use super::BlockKind;
use crate::stack::StackId;
use core::ffi::c_char;
use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

pub const HEADER_SIZE: usize = 32;
/// Bytes kept in front of the header of a block from outside the heap: the copy of its header
/// ([`far_copy`]), its shard-list links ([`FarLinks`]) and, last, the offset of the block's
/// memory from its user pointer.
pub const FAR_PREFIX: usize = 64;
/// Sizes from this one on cannot be tracked (the header keeps 40 bits of size): refused like
/// any allocation the address space cannot hold.
pub const SIZE_LIMIT: usize = 1 << SIZE_BITS;
const SIZE_BITS: u32 = 40;
/// The guard behind a block's user bytes, at most (MSVC's debug heap has 4 such bytes, ASan a
/// redzone): a heap block's is what its class leaves, up to this.
pub const GUARD_SIZE: usize = 8;
/// The guard's fill, the CRT debug heap's "no man's land".
pub const GUARD_BYTE: u8 = 0xfd;
pub const GUARD: u64 = u64::from_ne_bytes([GUARD_BYTE; GUARD_SIZE]);
/// Cookie bytes (from the low end) that must still match for a damaged cookie to count as an
/// underrun of that block rather than a foreign pointer: a chance of 2^-32 to be fooled.
const UNDERRUN_INTACT_BYTES: u32 = 4;

const LIVE: usize = 0x4b31_354d_454d_4f52; // "K15MEMOR"
const UNTRACKED: usize = LIVE ^ 0x00ff_00ff_00ff_00ff;
const FREED: usize = !LIVE;
/// Freed by a thread other than the block's shard owner, queued until settled (`live_list`).
const CLAIMED: usize = LIVE ^ 0x0f0f_0f0f_0f0f_0f0f;
/// A heap block whose header was found damaged beyond repair and reported: left alone (never
/// freed, never listed) from then on, so that it is reported once.
const DAMAGED: usize = LIVE ^ 0x3c3c_3c3c_3c3c_3c3c;

/// The heap's class of compact blocks ([`Layout::Compact`]): 32-byte slots.
pub const COMPACT_CLASS: u8 = 1;
/// The user bytes a compact block holds at most.
pub const COMPACT_ROOM: usize = 16;
/// Byte [`CLASS_BYTE`] of a compact block's `packed`.
const COMPACT_BYTE: u8 = COMPACT_CLASS | (Placement::Heap as u8) << CLASS_BITS;

/// How a header is laid out (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Layout {
    Full,
    Compact,
}

impl Layout {
    /// The header's bytes that lie in the block, in front of the user pointer.
    #[inline(always)]
    pub const fn front(self) -> usize {
        match self {
            Layout::Full => HEADER_SIZE,
            Layout::Compact => HEADER_SIZE - 16,
        }
    }

    /// The layout of the blocks of heap class `class`.
    #[inline(always)]
    pub const fn of_class(class: usize) -> Layout {
        if class == COMPACT_CLASS as usize {
            Layout::Compact
        } else {
            Layout::Full
        }
    }
}

/// Where the block's memory came from.
#[repr(u8)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Placement {
    Malloc = 0,
    Mapped = 1,
    /// From the small-block heap (`heap`).
    Heap = 3,
}

/// A full header as it lies in memory; a compact one uses its last two words only (its fields
/// are read through the accessors, which know both layouts).
#[repr(C, align(16))]
pub struct BlockHeader {
    seq: u32,
    thread: u32,
    /// The allocation site's id (`site`) in the low [`SITE_BITS`], read through
    /// [`BlockHeader::file`] and `line`; the block's tag above them ([`BlockHeader::tag`]).
    site: u32,
    alloc_stack: StackId,
    /// The size and four small fields in one word, read through their accessors: a stray write
    /// may leave any value in a freed block's header, which the cookie no longer covers.
    packed: u64,
    /// Atomic only for [`BlockHeader::claim`]; everything else uses plain loads and stores.
    cookie: AtomicUsize,
}

/// The shard-list links of a block from outside the heap, in its [`FAR_PREFIX`].
#[repr(C)]
pub struct FarLinks {
    pub prev: *mut BlockHeader,
    pub next: *mut BlockHeader,
}

/// The shard-list links of a block from outside the heap, in front of its header, a word apart
/// from the offset of its memory (behind the copy of the header: an underrun reaches them first).
pub fn far_links(header: *mut BlockHeader) -> *mut FarLinks {
    header.cast::<u8>().wrapping_sub(HEADER_SIZE).cast()
}

/// The copy of the header of a block from outside the heap as it was written (thread and
/// number; site, tag and stack; `packed`; the live cookie, which vouches for the other three),
/// at the start of its [`FAR_PREFIX`]: an underrun that replaces the header, up to its 32
/// bytes, leaves it ([`BlockHeader::restore_far_copy`]), and one that reaches it has cut the
/// block from its list on the way (the links lie in between), so a block found tied into its
/// list never has a damaged copy.
fn far_copy(header: *mut BlockHeader) -> *mut [usize; 4] {
    header.cast::<u8>().wrapping_sub(FAR_PREFIX).cast()
}

/// The start of the [`FAR_PREFIX`] of a block from outside the heap.
pub fn far_prefix(header: *mut BlockHeader) -> *mut u8 {
    far_copy(header).cast()
}
const _: () = assert!(FAR_PREFIX == size_of::<[usize; 4]>() + HEADER_SIZE);
const _: () = assert!(size_of::<FarLinks>() + size_of::<usize>() < HEADER_SIZE);

/// The bytes of [`BlockHeader::packed`] below the size, each read with one load on the free
/// path; the size above them is one shift away.
const SHARD_BYTE: usize = 0;
const KIND_BYTE: usize = 1;
/// The class (6 bits) and, above it, the placement (2 bits).
const CLASS_BYTE: usize = 2;
const CLASS_BITS: u32 = 6;
const SIZE_SHIFT: u32 = 64 - SIZE_BITS;
const _: () = assert!(SIZE_SHIFT as usize == 8 * (CLASS_BYTE + 1));

/// The word [`BlockHeader::packed`] of a block (`class` below `1 << CLASS_BITS`: the heap has
/// 64 classes).
#[inline(always)]
fn pack(size: usize, shard: u8, class: u8, kind: BlockKind, placement: Placement) -> u64 {
    let class_and_placement = class as u64 | (placement as u64) << CLASS_BITS;
    (size as u64) << SIZE_SHIFT | low_bytes(shard, kind, class_and_placement as u8)
}

/// The `packed` word of a compact block: its size in byte [`COMPACT_SIZE_BYTE`], its stack above.
#[inline(always)]
fn pack_compact(size: usize, shard: u8, kind: BlockKind, alloc_stack: StackId) -> u64 {
    (alloc_stack.0 as u64) << 32
        | (size as u64) << (8 * COMPACT_SIZE_BYTE)
        | low_bytes(shard, kind, COMPACT_BYTE)
}

/// The bytes of `packed` that both layouts share.
#[inline(always)]
fn low_bytes(shard: u8, kind: BlockKind, class_and_placement: u8) -> u64 {
    (shard as u64) << (8 * SHARD_BYTE)
        | (kind as u64) << (8 * KIND_BYTE)
        | (class_and_placement as u64) << (8 * CLASS_BYTE)
}

/// The byte of a compact block's `packed` that holds its size.
const COMPACT_SIZE_BYTE: usize = CLASS_BYTE + 1;

/// A live heap block's record, kept in the record table (`spans::record_word`) out of reach of
/// any overrun, so that a header damaged beyond repair is rebuilt from it
/// ([`BlockHeader::rebuild`]); 0 for a free block. A compact block's is its `packed` (which
/// the class byte makes nonzero); a full block's has its shard and kind where `packed` has them
/// (bytes 0 and 1, the kind in 4 bits: built from the same value), the size in bits 12..29 (a
/// heap block holds less than 128 KiB) and bit 30 set. Both keep the stack field in bits 32..64
/// (a ring's tag until its stack is interned: [`BlockHeader::record_stack_interned`]).
#[derive(Clone, Copy)]
struct Record(usize);

const RECORD_SIZE_SHIFT: u32 = 12;
const RECORD_SIZE_BITS: u32 = 17;
const RECORD_LIVE: usize = 1 << (RECORD_SIZE_SHIFT + RECORD_SIZE_BITS + 1);
const _: () = assert!((BlockKind::Named as u32) < 1 << (RECORD_SIZE_SHIFT - 8 * KIND_BYTE as u32));
const _: () = assert!(RECORD_LIVE < 1 << 32);

impl Record {
    /// A full block's record, `shard_and_kind` as `packed` holds them ([`low_bytes`]).
    #[inline(always)]
    fn of(size: usize, shard_and_kind: u64, alloc_stack: StackId) -> Record {
        Record(
            (alloc_stack.0 as usize) << 32
                | size << RECORD_SIZE_SHIFT
                | shard_and_kind as usize
                | RECORD_LIVE,
        )
    }

    fn is_live(self) -> bool {
        self.0 != 0
    }

    fn size(self) -> usize {
        (self.0 >> RECORD_SIZE_SHIFT) & ((1 << RECORD_SIZE_BITS) - 1)
    }

    fn shard(self) -> u8 {
        self.0.to_le_bytes()[SHARD_BYTE]
    }

    fn kind(self) -> BlockKind {
        BlockKind::from_byte(self.0.to_le_bytes()[KIND_BYTE] & 0xf)
    }

    fn stack(self) -> StackId {
        StackId((self.0 >> 32) as u32)
    }
}

/// The record word of the heap block of class `class` at user pointer `user`.
#[inline(always)]
fn record_at(user: usize, class: u8) -> &'static AtomicUsize {
    // SAFETY: a word of the side table, committed with the span (`spans::record_word`), only
    // ever accessed as an atomic or by its block's owner; `AtomicUsize` has `usize`'s layout.
    unsafe { &*super::spans::record_word(user, class).cast::<AtomicUsize>() }
}

const _: () = assert!(core::mem::size_of::<BlockHeader>() == HEADER_SIZE);

/// The bits of the header's `site` word that hold the site's id; the tag's id lies above.
const SITE_BITS: u32 = 16;
const SITE_MASK: u32 = (1 << SITE_BITS) - 1;
const _: () = assert!(super::site::CAPACITY < SITE_MASK as usize);
const _: () = assert!(super::tags::MAX_TAGS <= 1 << (32 - SITE_BITS));

/// What the allocation call says about a new block.
#[derive(Clone, Copy)]
pub struct NewBlock {
    pub size: usize,
    pub kind: BlockKind,
    pub file: *const c_char,
    pub line: u32,
}

/// Who allocated a tracked block.
#[derive(Default, Clone, Copy)]
pub struct Owner {
    pub thread: u32,
    pub seq: u32,
    pub shard: u8,
    pub alloc_stack: StackId,
    /// The allocating thread's innermost tag scope (0: none).
    pub tag: TagId,
}

/// What a pointer given to a free function turned out to be.
pub enum Lookup {
    /// A live tracked block, and its cookie as seen (a free checks it again once it holds the
    /// block's shard, without recomputing it).
    Live(*mut BlockHeader, usize),
    /// A live block allocated while the tracker was busy (its own memory): freed without lists.
    Untracked(*mut BlockHeader),
    /// A live tracked block whose cookie's top `damaged` bytes were overwritten (an underrun).
    Underrun {
        header: *mut BlockHeader,
        damaged: usize,
    },
    /// A block that was freed before; what its header (and, for a large block, the record of
    /// its unmapping) still tells.
    Freed {
        size: usize,
        alloc_stack: StackId,
        previous_free_stack: StackId,
    },
    /// A heap block whose header was damaged beyond repair, reported already: left alone.
    Damaged,
    /// Not from us at all.
    Foreign,
}

/// What a cookie covers besides its state and address: the header's exposed word as is, and its
/// other words rotated by odd amounts (so that equal words do not cancel out), folded into one.
/// Full: word 0 (`seq`, `thread`), word 1 (`site`, `alloc_stack`) and word 2 (`packed`);
/// compact: `packed` and the side word. The stack's half of its word ([`STACK_BITS`]) is left
/// out: a stack captured into a ring is interned later, and its tag in the header replaced by
/// its id while other threads may check the cookie (`pending_stacks`).
///
/// # Safety
/// The header's words of `layout` are readable (for a compact header, its block lies in the
/// heap, whose side table covers it).
#[inline(always)]
unsafe fn covered(header: *const BlockHeader, layout: Layout) -> usize {
    // SAFETY: guaranteed by the caller.
    unsafe {
        exposed_part(exposed_word(header, layout).read(), layout)
            ^ covered_beyond_exposed_word(header, layout)
    }
}

/// The bits of the word that holds the stack (word 1 in full, `packed` in compact) that are the
/// stack: the high half.
const STACK_BITS: usize = 0xffff_ffff << 32;

/// What a cookie covers of the exposed word `word`: all of it in full; in compact (`packed`) all
/// but the stack.
#[inline(always)]
fn exposed_part(word: usize, layout: Layout) -> usize {
    match layout {
        Layout::Full => word,
        Layout::Compact => word & !STACK_BITS,
    }
}

/// The words of [`covered`] other than the exposed one.
///
/// # Safety
/// As [`covered`].
#[inline(always)]
unsafe fn covered_beyond_exposed_word(header: *const BlockHeader, layout: Layout) -> usize {
    let words = header as *const usize;
    // SAFETY: guaranteed by the caller; plain reads of words the header holds.
    unsafe {
        match layout {
            Layout::Full => cover_full(0, words.add(1).read(), words.add(2).read()),
            Layout::Compact => cover_compact(0, first_word(header, layout).read()),
        }
    }
}

/// [`covered`] of a full header holding these words.
#[inline(always)]
fn cover_full(word0: usize, word1: usize, packed: usize) -> usize {
    word0 ^ (word1 & !STACK_BITS).rotate_left(23) ^ packed.rotate_left(41)
}

/// [`covered`] of a compact header holding `packed`, its side word being `side`.
#[inline(always)]
fn cover_compact(packed: usize, side: usize) -> usize {
    exposed_part(packed, Layout::Compact) ^ side.rotate_left(23)
}

/// The header's word that a write past the end of the block in front reaches first: word 0 in
/// full, `packed` in compact (whose word 0 lies in the side table).
#[inline(always)]
fn exposed_word(header: *const BlockHeader, layout: Layout) -> *mut usize {
    let words = header as *mut usize;
    match layout {
        Layout::Full => words,
        Layout::Compact => words.wrapping_add(2),
    }
}

/// The header's word 0: `seq` and `thread` while the block is live, its free-list link while it
/// is a free heap block. In the header in full, in the heap's side table in compact.
#[inline(always)]
fn first_word(header: *const BlockHeader, layout: Layout) -> *mut usize {
    match layout {
        Layout::Full => header as *mut usize,
        Layout::Compact => {
            super::spans::side_word(BlockHeader::user_ptr(header as *mut _) as usize)
        }
    }
}

/// What a free heap block's cookie covers beside `FREED` and its address, its free-list link
/// being `link`: the link, and in compact `packed` too (the exposed word, which the link does
/// not share).
///
/// # Safety
/// As [`covered`].
#[inline(always)]
unsafe fn freed_cover(header: *const BlockHeader, layout: Layout, link: usize) -> usize {
    match layout {
        Layout::Full => link,
        Layout::Compact => {
            // SAFETY: guaranteed by the caller.
            exposed_part(unsafe { exposed_word(header, layout).read() }, layout)
                ^ link.rotate_left(23)
        }
    }
}

/// Whether `word` could be a compact block's `packed`: its class byte and a size it holds.
fn is_compact_packed(word: usize) -> bool {
    let bytes = word.to_le_bytes();
    bytes[CLASS_BYTE] == COMPACT_BYTE && bytes[COMPACT_SIZE_BYTE] as usize <= COMPACT_ROOM
}

/// What [`BlockHeader::guard_check`] found.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum GuardCheck {
    Intact,
    Damaged,
    NoGuard,
}

/// What a write past the end of the block in front did to a header's first word: found, and
/// as its cookie says it was (written back by [`BlockHeader::front_overrun`]).
#[derive(Clone, Copy, Debug)]
pub struct FirstWordDamage {
    pub found: [u8; 8],
    pub was: [u8; 8],
}

/// How many guard bytes lie behind the `size` user bytes of a block placed so: what a heap
/// block's class leaves, up to [`GUARD_SIZE`]; [`GUARD_SIZE`] elsewhere (reserved with the block).
#[inline(always)]
fn guard_len(class_and_placement: u8, size: usize) -> usize {
    (ROOM[class_and_placement as usize] as usize - size).min(GUARD_SIZE)
}

/// The bytes for user bytes and guard by byte [`CLASS_BYTE`] of [`BlockHeader::packed`] (class
/// and placement), so that the guard's length takes one load and no decoding: a heap class's
/// room (its size less the header), and for other placements room for any size and the guard.
static ROOM: [u64; 256] = {
    let mut room = [(SIZE_LIMIT + GUARD_SIZE) as u64; 256];
    let mut class = 0;
    while class < super::heap::CLASS_COUNT {
        let byte = class | (Placement::Heap as usize) << CLASS_BITS;
        // Classes smaller than a header serve no block.
        room[byte] = super::heap::size_of_class(class)
            .saturating_sub(Layout::of_class(class).front()) as u64;
        class += 1;
    }
    room
};

/// The bits of a guard of each length (the index) in the 8 bytes that end where it ends.
const GUARD_MASKS: [u64; GUARD_SIZE + 1] = {
    let mut masks = [0; GUARD_SIZE + 1];
    let mut len = 1;
    while len <= GUARD_SIZE {
        masks[len] = u64::MAX << (8 * (GUARD_SIZE - len));
        len += 1;
    }
    masks
};

impl BlockHeader {
    /// The header in front of a user pointer.
    pub fn of(user: *mut u8) -> *mut BlockHeader {
        user.wrapping_sub(HEADER_SIZE) as *mut BlockHeader
    }

    pub fn user_ptr(header: *mut BlockHeader) -> *mut u8 {
        (header as *mut u8).wrapping_add(HEADER_SIZE)
    }

    /// How far the block's memory starts in front of its user pointer: the header for a heap
    /// block, a page for a mapped one, and what a block from the own heap keeps in front
    /// of its header ([`FAR_PREFIX`]).
    pub fn raw_offset(&self) -> usize {
        match self.placement() {
            Placement::Heap => HEADER_SIZE,
            Placement::Mapped => crate::sys::PAGE_SIZE,
            // SAFETY: such a block was written with its offset in the word before its header.
            Placement::Malloc => unsafe { (self as *const Self).cast::<usize>().sub(1).read() },
        }
    }

    /// The header's layout, as its class byte says: compact only for a block of the heap (the
    /// side table covers no other), so that a stray pointer's bytes never lead outside it.
    #[inline(always)]
    pub fn layout(&self) -> Layout {
        if self.packs_compact() && super::heap::contains(self.address()) {
            Layout::Compact
        } else {
            Layout::Full
        }
    }

    /// Whether `packed` is laid out as a compact block's: what the fields read from it alone
    /// (size, stack, site) go by, without the heap's bounds that [`BlockHeader::layout`] reads
    /// before it lets anyone read a side word.
    #[inline(always)]
    fn packs_compact(&self) -> bool {
        self.packed_byte(CLASS_BYTE) == COMPACT_BYTE
    }

    /// The size the program asked for.
    #[inline(always)]
    pub fn size(&self) -> usize {
        if self.packs_compact() {
            self.packed_byte(COMPACT_SIZE_BYTE) as usize
        } else {
            (self.packed >> SIZE_SHIFT) as usize
        }
    }

    /// The stack of the allocation; one still in its ring is interned now.
    #[inline]
    pub fn alloc_stack(&self) -> StackId {
        let id = StackId(self.stack_field().load(Ordering::Acquire));
        if super::pending_stacks::is_pending(id) {
            super::pending_stacks::resolve(self, id)
        } else {
            id
        }
    }

    /// Where the header keeps its stack (a depot id or a ring's tag): the high half of `packed`
    /// in compact, `alloc_stack` in full.
    pub fn stack_field(&self) -> &AtomicU32 {
        self.stack_field_as(if self.packs_compact() {
            Layout::Compact
        } else {
            Layout::Full
        })
    }

    /// [`BlockHeader::stack_field`] of a header laid out as `layout`.
    pub fn stack_field_as(&self, layout: Layout) -> &AtomicU32 {
        let at = match layout {
            Layout::Full => core::ptr::addr_of!(self.alloc_stack).cast::<u8>(),
            Layout::Compact => core::ptr::addr_of!(self.packed)
                .cast::<u8>()
                .wrapping_add(4),
        };
        // SAFETY: four aligned bytes of this header (the stack's), changed only through atomics
        // once the header is written (a ring's owner or a reader settling a tag).
        unsafe { &*at.cast::<AtomicU32>() }
    }

    /// Word 0 of a live block: `seq` and `thread`.
    fn first_word_value(&self) -> usize {
        // SAFETY: the header is readable (we are reading it), and so is a compact one's side
        // word (`layout`).
        unsafe { first_word(self, self.layout()).read() }
    }

    /// The allocation's number on its thread.
    pub fn seq(&self) -> u32 {
        self.first_word_value() as u32
    }

    /// The allocating thread's number.
    pub fn thread(&self) -> u32 {
        (self.first_word_value() >> 32) as u32
    }

    /// The site's id (none for a compact block).
    fn site(&self) -> u32 {
        if self.packs_compact() {
            0
        } else {
            self.site & SITE_MASK
        }
    }

    /// The tag of the block (0: untagged, as every compact block is).
    #[inline(always)]
    pub fn tag(&self) -> TagId {
        if self.packs_compact() {
            0
        } else {
            (self.site >> SITE_BITS) as TagId
        }
    }

    /// Byte `index` of [`BlockHeader::packed`].
    #[inline(always)]
    fn packed_byte(&self, index: usize) -> u8 {
        // SAFETY: a plain read of one of the word's bytes (x86-64 is little-endian).
        unsafe { (&raw const self.packed).cast::<u8>().add(index).read() }
    }

    /// The shard whose list holds the block.
    #[inline(always)]
    pub fn shard(&self) -> u8 {
        self.packed_byte(SHARD_BYTE)
    }

    /// The heap's size class of a [`Placement::Heap`] block.
    #[inline(always)]
    pub fn class(&self) -> u8 {
        self.packed_byte(CLASS_BYTE) & ((1 << CLASS_BITS) - 1)
    }

    /// Where the block's memory came from.
    #[inline(always)]
    pub fn placement(&self) -> Placement {
        match self.packed_byte(CLASS_BYTE) >> CLASS_BITS {
            0 => Placement::Malloc,
            1 => Placement::Mapped,
            _ => Placement::Heap,
        }
    }

    fn kind_byte(&self) -> u8 {
        self.packed_byte(KIND_BYTE)
    }

    /// How the block was allocated.
    #[inline]
    pub fn kind(&self) -> BlockKind {
        BlockKind::from_byte(self.kind_byte())
    }

    /// Whether a free through `kind` suits the block: its own kind, or one of its family.
    /// Compared as stored first, so that the free path decodes nothing.
    #[inline]
    pub fn freed_by_its_family(&self, kind: BlockKind) -> bool {
        self.kind_byte() == kind as u8 || super::malloc::same_family(self.kind(), kind)
    }

    /// `K15_NEW`'s `__FILE__` (an engine allocator's name for [`BlockKind::Named`]), or null.
    pub fn file(&self) -> *const c_char {
        super::site::resolve(self.site()).0
    }

    /// `K15_NEW`'s `__LINE__`, or 0.
    pub fn line(&self) -> u32 {
        super::site::resolve(self.site()).1
    }

    /// Whether the site id is one the table gave out (a check of a header that may have been
    /// overwritten).
    pub fn site_is_known(&self) -> bool {
        super::site::is_known(self.site())
    }

    /// Writes the header of the new block in `raw` and its guard, and returns it (a block from
    /// outside the heap is linked on its shard's list after this): `owner` is `None` for the
    /// tracker's own (untracked) blocks, which are on no list.
    ///
    /// # Safety
    /// `raw` came from `raw::acquire*`, which reserved `HEADER_SIZE` writable bytes in front of
    /// its user pointer, and `block.file` is null or a NUL-terminated string that outlives the
    /// block.
    #[inline(always)]
    pub unsafe fn write(
        raw: &RawBlock,
        block: &NewBlock,
        owner: Option<Owner>,
    ) -> *mut BlockHeader {
        let header = Self::of(raw.user);
        let user = raw.user as usize;
        let state = if owner.is_some() { LIVE } else { UNTRACKED };
        let owner = owner.unwrap_or_default();
        let first_word_value = owner.seq as usize | (owner.thread as usize) << 32;
        let layout = if raw.class == COMPACT_CLASS && raw.placement == Placement::Heap {
            Layout::Compact
        } else {
            Layout::Full
        };
        // SAFETY: guaranteed by the caller. Written field by field through raw places: the
        // links (and, for a fresh block, everything else) are not to be read or overwritten.
        // A compact header's first 16 bytes are not the block's: never written.
        // The cookie is folded from the values written, not read back: a load of words just
        // written in narrower stores waits for them (store forwarding fails).
        let (packed, cover) = unsafe {
            if layout == Layout::Compact {
                first_word(header, layout).write(first_word_value);
                let packed = pack_compact(block.size, owner.shard, block.kind, owner.alloc_stack);
                (&raw mut (*header).packed).write(packed);
                if state == LIVE {
                    record_at(user, COMPACT_CLASS).store(packed as usize, Ordering::Relaxed);
                }
                (packed, cover_compact(packed as usize, first_word_value))
            } else {
                let packed = pack(
                    block.size,
                    owner.shard,
                    raw.class,
                    block.kind,
                    raw.placement,
                );
                let site =
                    super::site::intern(block.file, block.line) | u32::from(owner.tag) << SITE_BITS;
                // `site` and `alloc_stack` in one store, as `covered` reads them.
                let word1 = site as usize | (owner.alloc_stack.0 as usize) << 32;
                let words = header.cast::<usize>();
                words.write(first_word_value);
                words.add(1).write(word1);
                (&raw mut (*header).packed).write(packed);
                if raw.placement == Placement::Malloc {
                    words.sub(1).write(raw.raw_offset);
                } else if raw.placement == Placement::Heap && state == LIVE {
                    let shard_and_kind = low_bytes(owner.shard, block.kind, 0);
                    let record = Record::of(block.size, shard_and_kind, owner.alloc_stack);
                    record_at(user, raw.class).store(record.0, Ordering::Relaxed);
                }
                (packed, cover_full(first_word_value, word1, packed as usize))
            }
        };
        // SAFETY: as above; a block of the program's from outside the heap has its `FAR_PREFIX`
        // in front (the tracker's own, untracked, the offset of its memory alone).
        unsafe {
            let cookie = state ^ user ^ cover;
            (&raw mut (*header).cookie).write(AtomicUsize::new(cookie));
            if raw.placement != Placement::Heap && state == LIVE {
                far_copy(header).write(header.cast::<[usize; 4]>().read());
            }
            // One store of the 8 bytes that end where the guard ends: a short guard (the class
            // leaves under 8 bytes, so the block holds more than 8) takes the user's last bytes
            // with it, which the program has not written yet.
            let guard_end = block.size + guard_len((packed >> (8 * CLASS_BYTE)) as u8, block.size);
            raw.user
                .wrapping_add(guard_end - GUARD_SIZE)
                .cast::<u64>()
                .write_unaligned(GUARD);
        }
        header
    }

    /// Prepares a block just carved from a span, before it goes on a free list: a compact one's
    /// `packed` (where the span's guard word lay) gets its class, so that the block is a free
    /// compact block from the first (the full layout's free blocks need nothing more than their
    /// link).
    ///
    /// # Safety
    /// `header` is a header of a block of the heap laid out as `layout`, never handed out since
    /// it was carved, that nobody else uses.
    pub unsafe fn carve(header: *mut BlockHeader, layout: Layout) {
        if layout == Layout::Compact {
            let packed = pack_compact(0, 0, BlockKind::New, StackId(0));
            // SAFETY: guaranteed by the caller.
            unsafe { (&raw mut (*header).packed).write(packed) };
        }
    }

    /// The user's bytes of a live block: `size` of them, then the guard.
    fn guard(&self) -> *mut u8 {
        Self::user_ptr(self as *const _ as *mut _).wrapping_add(self.size())
    }

    /// How many guard bytes lie behind the user's bytes.
    #[inline(always)]
    pub fn guard_len(&self) -> usize {
        guard_len(self.packed_byte(CLASS_BYTE), self.size())
    }

    /// Whether `packed` reads as that of a heap block of class `class` (its class and placement,
    /// a size the class holds): how far a write past the end of the block in front reached
    /// into a header whose cookie no longer vouches for it (`overrun_reach`).
    pub fn packed_fits_heap_class(&self, class: u8) -> bool {
        self.packed_byte(CLASS_BYTE) == class | (Placement::Heap as u8) << CLASS_BITS
            && self.size() <= self.heap_room()
    }

    /// The bytes a heap block's class holds for user bytes and guard (a block resized in place
    /// may take any size up to it: `resize`).
    #[inline]
    pub fn heap_room(&self) -> usize {
        ROOM[self.packed_byte(CLASS_BYTE) as usize] as usize
    }

    /// Whether the guard behind the user's bytes is as written. Reads the 8 bytes that end where
    /// the guard ends, as `write` wrote them, so never the next block's header (another cache
    /// line, maybe another thread's): the guard is their top `guard_len` bytes.
    #[inline]
    pub fn guard_intact(&self) -> bool {
        self.guard_intact_of(self.guard_len())
    }

    /// [`BlockHeader::guard_intact`] for a guard of `len` bytes (`guard_len()`).
    #[inline(always)]
    fn guard_intact_of(&self, len: usize) -> bool {
        // SAFETY: a live block's header was written with its guard behind its user bytes, and
        // the block holds 8 bytes up to the guard's end (see `write`).
        let word = unsafe {
            self.guard()
                .wrapping_add(len)
                .wrapping_sub(GUARD_SIZE)
                .cast::<u64>()
                .read_unaligned()
        };
        (word ^ GUARD) & GUARD_MASKS[len] == 0
    }

    /// The guard behind the user's bytes, as a `delete` checks it: as written, damaged, or none
    /// at all (a heap block whose size fills its class: the next block's header is its guard).
    #[inline(always)]
    pub fn guard_check(&self) -> GuardCheck {
        match self.guard_len() {
            0 => GuardCheck::NoGuard,
            len if self.guard_intact_of(len) => GuardCheck::Intact,
            _ => GuardCheck::Damaged,
        }
    }

    /// The guard's bytes as they are now.
    pub fn guard_bytes(&self) -> Vec<u8> {
        // SAFETY: as in guard_intact.
        unsafe { core::slice::from_raw_parts(self.guard(), self.guard_len()) }.to_vec()
    }

    /// Writes the guard again (after its damage was reported), so it is reported once.
    pub fn restore_guard(&mut self) {
        // SAFETY: as in guard_intact; only the guard's own bytes are written (the user's in
        // front of it and the next block's behind it are left as they are).
        unsafe { core::ptr::write_bytes(self.guard(), GUARD_BYTE, self.guard_len()) }
    }

    /// The cookie's bytes as they are now (the 8 bytes in front of the user pointer).
    pub fn cookie_bytes(&self) -> [u8; 8] {
        self.cookie.load(Ordering::Relaxed).to_ne_bytes()
    }

    /// Writes a live block's cookie again (after an underrun was reported).
    pub fn restore_live_cookie(&mut self) {
        self.cookie.store(self.expected(LIVE), Ordering::Relaxed);
    }

    /// How many of the cookie's top bytes an underrun changed, when the cookie is a live one
    /// with at least its low [`UNDERRUN_INTACT_BYTES`] bytes intact and the rest of the header
    /// holds together (`integrity::fields_hold_together`: the cookie covers those fields, so
    /// once it is damaged they are checked one by one); `None` for an intact cookie or one
    /// damaged too far to tell.
    ///
    /// A heap block's underrun of 5 bytes or more leaves too little of the cookie to tell, but
    /// its record beside the heap can: [`BlockHeader::underrun_bytes_by_record`].
    pub fn underrun_bytes(&self) -> Option<usize> {
        self.underrun_bytes_leaving(UNDERRUN_INTACT_BYTES)
            .or_else(|| self.underrun_bytes_by_record())
    }

    /// The top bytes of the cookie of a live heap block that an underrun changed, told by its
    /// record where the cookie no longer can: every field in front of the cookie that the
    /// record keeps is as it says (`packed` whole, the stack, in full the thread a thread
    /// number given out), and the fields it does not keep hold together. A write from the front
    /// (an overrun of the block there) crosses all of those fields before it reaches the
    /// cookie, and would have to write them back as they were; a change of the cookie alone is
    /// the block's underrun. `None` for a free block, one outside the heap, or an intact cookie.
    #[cold]
    fn underrun_bytes_by_record(&self) -> Option<usize> {
        let user = self.address();
        let block = super::heap::block_containing(user).filter(|block| block.user() == user)?;
        let class = block.class;
        let record = record_at(user, class).load(Ordering::Acquire);
        let layout = Layout::of_class(class as usize);
        // SAFETY: the header of a block carved in a span, readable.
        let (word0, word1, packed) = unsafe {
            let words = self as *const Self as *const usize;
            (words.read(), words.add(1).read(), words.add(2).read())
        };
        let holds = match layout {
            Layout::Compact => is_compact_packed(record) && packed == record,
            Layout::Full => {
                let record = Record(record);
                record.is_live()
                    && record.size() as u64
                        <= ROOM[(class | (Placement::Heap as u8) << CLASS_BITS) as usize]
                    && packed
                        == pack(
                            record.size(),
                            record.shard(),
                            class,
                            record.kind(),
                            Placement::Heap,
                        ) as usize
                    && (word1 >> 32) as u32 == record.stack().0
                    && (1..super::guard::next_thread_number()).contains(&((word0 >> 32) as u32))
            }
        };
        // A cookie of any state of ours (a claimed block's, waiting to be settled) is no
        // damage; nor is one that gives back a first word with a thread number given out: a
        // write from the front that changed that word alone (`front_overrun` puts it back).
        if !holds || self.cookie_valid_where(layout, true) {
            return None;
        }
        let cookie = self.cookie.load(Ordering::Relaxed);
        if layout == Layout::Full {
            // SAFETY: as above.
            let beyond = unsafe { covered_beyond_exposed_word(self, layout) };
            let threads = 1..super::guard::next_thread_number();
            let first_word_back = |state: usize| cookie ^ state ^ user ^ beyond;
            if [LIVE, CLAIMED]
                .into_iter()
                .any(|state| threads.contains(&((first_word_back(state) >> 32) as u32)))
            {
                return None;
            }
        }
        let changed = cookie ^ self.expected_as(LIVE, layout);
        (changed != 0 && super::integrity::fields_hold_together(self))
            .then(|| 8 - (changed.trailing_zeros() / 8) as usize)
    }

    /// [`BlockHeader::underrun_bytes`] of a block outside the heap found on its shard's list,
    /// which says it is ours and live where its cookie no longer can: any change to the cookie
    /// counts (an underrun of 5 bytes or more leaves too little of it to name the block), as
    /// long as it is no state of ours (a claimed block's, waiting to be settled) and the rest of
    /// the header holds together.
    pub fn underrun_bytes_of_listed(&self) -> Option<usize> {
        if self.cookie_valid(Layout::Full) {
            return None;
        }
        self.underrun_bytes_leaving(0)
    }

    /// The shard that the copy of the header of a block from outside the heap names
    /// ([`far_copy`]): its list is where the block is, where an underrun replaced more of its
    /// header than the check word.
    ///
    /// # Safety
    /// `header` is readable with its [`FAR_PREFIX`] (`integrity::could_be_far_block`).
    pub unsafe fn far_copy_shard(header: *mut BlockHeader) -> u8 {
        // SAFETY: guaranteed by the caller.
        let [_, _, packed, _] = unsafe { far_copy(header).read() };
        packed.to_le_bytes()[SHARD_BYTE]
    }

    /// Whether the copy of the header of a block from outside the heap ([`far_copy`]) is a live
    /// block's, as written at this address (its cookie vouches for it), and the header no freed
    /// block's: what names the block where an underrun replaced its header.
    ///
    /// # Safety
    /// `header` is readable with its [`FAR_PREFIX`] (`integrity::could_be_far_block`).
    pub unsafe fn far_copy_vouches(header: *mut BlockHeader) -> bool {
        // SAFETY: guaranteed by the caller.
        let [first, second, packed, cookie] = unsafe { far_copy(header).read() };
        let user = Self::user_ptr(header) as usize;
        // As `placement` reads it: above `Mapped` is the heap's.
        cookie == LIVE ^ user ^ cover_full(first, second, packed)
            && packed.to_le_bytes()[CLASS_BYTE] >> CLASS_BITS <= Placement::Mapped as u8
            // SAFETY: as above.
            && unsafe { !(*header).is_marked_freed() }
    }

    /// Puts back the header of a block from outside the heap, on the list of shard `shard`,
    /// from its copy ([`far_copy`]), as a live block's: where an underrun replaced more of it
    /// than the check word, so that [`BlockHeader::underrun_bytes_of_listed`] cannot tell. The
    /// header's bytes as found; `None`, with nothing changed, where the copy does not vouch for
    /// itself ([`BlockHeader::far_copy_vouches`]) or names another shard, the header it gives
    /// does not hold together (`integrity::fields_hold_together`), or the header was as the copy
    /// gives it already.
    ///
    /// # Safety
    /// `header` is a block on `shard`'s list, readable with its [`FAR_PREFIX`], and nobody else
    /// changes it meanwhile (the world is stopped).
    pub unsafe fn restore_far_copy(
        header: *mut BlockHeader,
        shard: u8,
    ) -> Option<[u8; HEADER_SIZE]> {
        // SAFETY: guaranteed by the caller.
        unsafe {
            if !Self::far_copy_vouches(header) || Self::far_copy_shard(header) != shard {
                return None;
            }
            let found = header.cast::<[u8; HEADER_SIZE]>().read();
            header.cast::<[usize; 4]>().write(far_copy(header).read());
            if found == header.cast::<[u8; HEADER_SIZE]>().read()
                || !super::integrity::fields_hold_together(&*header)
            {
                header.cast::<[u8; HEADER_SIZE]>().write(found);
                return None;
            }
            Some(found)
        }
    }

    /// The top bytes of the cookie that an underrun changed, where at least `intact` low bytes
    /// of a live cookie are left and the rest of the header holds together.
    fn underrun_bytes_leaving(&self, intact: u32) -> Option<usize> {
        let changed = self.cookie.load(Ordering::Relaxed) ^ self.expected(LIVE);
        let left = changed.trailing_zeros() / 8;
        (changed != 0 && left >= intact && super::integrity::fields_hold_together(self))
            .then(|| 8 - left as usize)
    }

    /// Whether the cookie says the block is one of ours in any state (live, freed, claimed,
    /// untracked, damaged and reported), its header laid out as `layout`: the check a header must
    /// pass before its links are followed.
    pub fn cookie_valid(&self, layout: Layout) -> bool {
        let in_heap = super::heap::contains(self as *const Self as usize);
        self.cookie_valid_where(layout, in_heap)
    }

    /// [`BlockHeader::cookie_valid`] of a header known to lie in the heap or not (`in_heap`).
    #[inline(always)]
    pub fn cookie_valid_where(&self, layout: Layout, in_heap: bool) -> bool {
        let state = self.cookie.load(Ordering::Relaxed) ^ self.address();
        // SAFETY: the header is readable (we are reading it), and the caller's layout is one
        // the heap's side table covers. Each word is read once (an exact fit's `delete` asks).
        let (exposed, beyond) = unsafe {
            (
                exposed_part(exposed_word(self, layout).read(), layout),
                covered_beyond_exposed_word(self, layout),
            )
        };
        let covered = exposed ^ beyond;
        // What a freed block's cookie covers ([`BlockHeader::freed_cookie_at`]): a heap block's
        // link (word 0 in full; in compact with `packed`, the very words `covered` holds).
        let freed_cover = match layout {
            Layout::Compact => covered,
            Layout::Full if in_heap => exposed,
            Layout::Full => 0,
        };
        // A damaged mark covers what a freed cookie covers (`mark_damaged`).
        let uncovered = state ^ freed_cover;
        uncovered == FREED
            || uncovered == DAMAGED
            || [LIVE, CLAIMED, UNTRACKED].contains(&(state ^ covered))
    }

    /// Marks a heap block whose header was reported damaged beyond repair: it is left alone from
    /// then on (its memory stays unused). The mark covers what a freed block's cookie covers,
    /// the exposed word among them, so that a later write past the end of the block in front
    /// is seen there again and its block named (`integrity::blame_in_front`).
    pub fn mark_damaged(&mut self, layout: Layout) {
        // SAFETY: the header of a heap block laid out as `layout` (the span table's word, which
        // a damaged class byte cannot change), readable with its side word.
        let damaged = unsafe { Self::freed_cookie_at(self, layout) } ^ FREED ^ DAMAGED;
        self.cookie.store(damaged, Ordering::Relaxed);
    }

    /// Repairs a header whose exposed word alone was changed (a write past the end of the block
    /// in front of it, which reaches that word first) from its cookie, which covers the word
    /// unrotated: the cookie of any state, xor what it covers beyond the word, gives the word
    /// back. Taken as such only when the word it gives back makes sense (a free heap block's
    /// link: null or a block of the heap, or anything for a freed block the quarantine holds,
    /// which is on no list; a live or claimed block's thread: one that has run; a
    /// compact block's `packed`: its class and a size it holds) and, for a live or claimed
    /// block, the other fields hold together; `None` otherwise.
    ///
    /// # Safety
    /// `header` is a block of the heap (readable) laid out as `layout`, and nobody else changes
    /// it meanwhile.
    #[cold]
    pub unsafe fn front_overrun(
        header: *mut BlockHeader,
        layout: Layout,
    ) -> Option<FirstWordDamage> {
        // SAFETY: guaranteed by the caller.
        let h = unsafe { &mut *header };
        let cookie = h.cookie.load(Ordering::Relaxed);
        let exposed = exposed_word(header, layout);
        // SAFETY: guaranteed by the caller (this word and those below).
        let (found, beyond, first) = unsafe {
            (
                exposed.read(),
                covered_beyond_exposed_word(header, layout),
                first_word(header, layout).read(),
            )
        };
        let address = h.address();
        let is_link =
            |link: usize| link.is_multiple_of(16) && (link == 0 || super::heap::contains(link));
        // A write past the end of the block in front changes a compact `packed` from its low
        // bytes up (shard, kind, class, size); one that left them as they were and changed only
        // the stack's bytes is no such write, but an underrun, which changes the cookie's top
        // bytes: a change those bytes alone would undo is not taken for one.
        let from_front = |packed: usize| is_compact_packed(packed) && (packed ^ found) as u32 != 0;
        // A compact cookie does not cover the stack's bytes: a free block's are taken as found
        // where they still name a stack of this block, else as lost (0), and counted as damaged
        // (a live block's `packed` is its record, stack and all).
        let found_stack = StackId((found >> 32) as u32);
        let recorded = match layout {
            Layout::Compact => Some(record_at(address, COMPACT_CLASS).load(Ordering::Relaxed))
                .filter(|&record| is_compact_packed(record)),
            Layout::Full => None,
        };
        if let Some(record) = recorded {
            // A live compact block's `packed` is its record: put back where the cookie still
            // vouches for the rest (the side word).
            let vouched = [LIVE, CLAIMED]
                .into_iter()
                .any(|state| cookie == state ^ address ^ exposed_part(record, layout) ^ beyond);
            if !vouched || record == found {
                return None;
            }
            // SAFETY: as above.
            unsafe { exposed.write(record) };
            return Some(FirstWordDamage {
                found: found.to_ne_bytes(),
                was: record.to_ne_bytes(),
            });
        }
        let stack_held = layout == Layout::Compact
            && super::pending_stacks::names_block(found_stack, header, layout);
        let with_stack = |was: usize| match layout {
            Layout::Compact if stack_held => was | found & STACK_BITS,
            _ => was,
        };
        // A freed block the quarantine holds is on no list: its first word is what its owner
        // left there, not a link.
        let held = || super::quarantine::free_stack_of_without_waiting(header).is_some();
        let as_freed = match layout {
            Layout::Full => Some(cookie ^ FREED ^ address).filter(|&link| is_link(link) || held()),
            Layout::Compact => Some(with_stack(cookie ^ FREED ^ address ^ beyond))
                .filter(|&packed| (is_link(first) || held()) && from_front(packed)),
        };
        let was = match as_freed.filter(|&was| was != found) {
            Some(was) => was,
            None => {
                let threads = 1..super::guard::next_thread_number();
                [LIVE, CLAIMED]
                    .into_iter()
                    .map(|state| with_stack(cookie ^ state ^ address ^ beyond))
                    .find(|&was| {
                        was != found
                            && match layout {
                                Layout::Full => {
                                    threads.contains(&((was >> 32) as u32))
                                        && super::integrity::fields_hold_together(h)
                                }
                                // The fields to check lie in the word itself: tried in place.
                                Layout::Compact => {
                                    from_front(was)
                                        && threads.contains(&((first >> 32) as u32))
                                        && {
                                            // SAFETY: as above; put back unless it holds.
                                            unsafe { exposed.write(was) };
                                            let holds = super::integrity::fields_hold_together(h);
                                            // SAFETY: as above.
                                            unsafe { exposed.write(found) };
                                            holds
                                        }
                                }
                            }
                    })?
            }
        };
        // SAFETY: as above.
        unsafe { exposed.write(was) };
        Some(FirstWordDamage {
            found: found.to_ne_bytes(),
            was: was.to_ne_bytes(),
        })
    }

    /// Where the header's exposed word lies ([`BlockHeader::front_overrun`] repairs it): the
    /// start of its block.
    pub fn exposed_word_at(header: *mut BlockHeader, layout: Layout) -> usize {
        exposed_word(header, layout) as usize
    }

    /// The cookie a freed block at `header` carries: a heap block's covers its free-list link
    /// ([`freed_cover`]), other blocks' only their address.
    ///
    /// # Safety
    /// The header's words of `layout` are readable.
    unsafe fn freed_cookie_at(header: *const BlockHeader, layout: Layout) -> usize {
        let address = Self::user_ptr(header as *mut _) as usize;
        // SAFETY: guaranteed by the caller.
        let cover = unsafe {
            if super::heap::contains(header as usize) || layout == Layout::Compact {
                freed_cover(header, layout, first_word(header, layout).read())
            } else {
                0
            }
        };
        FREED ^ address ^ cover
    }

    /// Sets a free heap block's free-list link to `next` and its cookie to the freed one that
    /// covers it: every change of a free heap block's link goes through here.
    ///
    /// # Safety
    /// `header` is a block of the heap laid out as `layout`, free and held by the caller.
    #[inline(always)]
    pub unsafe fn set_free_link(header: *mut BlockHeader, next: *mut u8, layout: Layout) {
        let address = Self::user_ptr(header) as usize;
        // SAFETY: guaranteed by the caller.
        unsafe {
            first_word(header, layout).write(next as usize);
            let cookie = FREED ^ address ^ freed_cover(header, layout, next as usize);
            (&raw mut (*header).cookie).write(AtomicUsize::new(cookie));
        }
    }

    /// The free-list link of the free heap block at `header`, when its freed cookie vouches for
    /// it; `None` when the block is no free block or its link was changed behind the cookie's
    /// back (an overrun of the block in front reaches the link before the cookie).
    ///
    /// # Safety
    /// `header` is a block of the heap (readable) laid out as `layout`.
    #[inline(always)]
    pub unsafe fn free_link(header: *const BlockHeader, layout: Layout) -> Option<*mut u8> {
        let address = Self::user_ptr(header as *mut _) as usize;
        // SAFETY: guaranteed by the caller.
        let (link, cookie, cover) = unsafe {
            let link = first_word(header, layout).read();
            (
                link,
                (*header).cookie.load(Ordering::Relaxed),
                freed_cover(header, layout, link),
            )
        };
        (cookie ^ cover == FREED ^ address).then_some(link as *mut u8)
    }

    /// The free-list link of a free heap block as it is, unchecked (a list already checked).
    ///
    /// # Safety
    /// As [`BlockHeader::free_link`].
    pub unsafe fn free_link_unchecked(header: *const BlockHeader, layout: Layout) -> *mut u8 {
        // SAFETY: guaranteed by the caller.
        unsafe { first_word(header, layout).read() as *mut u8 }
    }

    fn address(&self) -> usize {
        Self::user_ptr(self as *const _ as *mut _) as usize
    }

    /// Whether the cookie is a freed block's (of a header laid out in full).
    pub fn is_marked_freed(&self) -> bool {
        // SAFETY: the header is readable (we are reading it).
        self.cookie.load(Ordering::Relaxed) == unsafe { Self::freed_cookie_at(self, Layout::Full) }
    }

    pub fn is_live(&self) -> bool {
        self.cookie.load(Ordering::Relaxed) == self.expected(LIVE)
    }

    /// The cookie of this block while it is live.
    pub fn live_cookie(&self) -> usize {
        self.expected(LIVE)
    }

    /// Whether the cookie is still `seen` (nobody freed or claimed the block since).
    #[inline]
    pub fn cookie_is(&self, seen: usize) -> bool {
        self.cookie.load(Ordering::Relaxed) == seen
    }

    /// The cookie of a block in `state` (other than `FREED`) with this header's contents.
    #[inline(always)]
    fn expected(&self, state: usize) -> usize {
        self.expected_as(state, self.layout())
    }

    /// [`BlockHeader::expected`] for a header laid out as `layout`.
    #[inline(always)]
    fn expected_as(&self, state: usize, layout: Layout) -> usize {
        // SAFETY: the header is readable (we are reading it), and so are the words of `layout`
        // (the callers' layout is `layout()`'s or the span table's).
        state ^ self.address() ^ unsafe { covered(self, layout) }
    }

    /// Marks the block freed: a later free of the same pointer finds `FREED`, and a heap block's
    /// record says it is no live block.
    pub fn mark_freed(&mut self) {
        let layout = self.layout();
        if self.placement() == Placement::Heap {
            Self::clear_record(self.address(), self.class());
        }
        // SAFETY: the header is readable (we are writing it).
        let freed = unsafe { Self::freed_cookie_at(self, layout) };
        self.cookie.store(freed, Ordering::Relaxed);
    }

    /// Clears the record of the heap block of class `class` at user pointer `user`, freed.
    #[inline(always)]
    pub fn clear_record(user: usize, class: u8) {
        record_at(user, class).store(0, Ordering::Relaxed);
    }

    /// Rebuilds the header of the heap block at `header` (of class `class`, as the span table
    /// says), damaged beyond repair, from its record, where it is a live block's: its size,
    /// kind, shard and stack as allocated; a compact block's thread and sequence number too (in
    /// the side table), a full block's are lost with its site and tag (0). False where the
    /// record says no live block is there.
    ///
    /// # Safety
    /// `header` is the header of a block carved from a span of class `class`, and nobody else
    /// writes it meanwhile (the caller holds the found log, or the world is stopped).
    #[cold]
    pub unsafe fn rebuild(header: *mut BlockHeader, class: u8) -> bool {
        let user = Self::user_ptr(header) as usize;
        let record = Record(record_at(user, class).load(Ordering::Acquire));
        if Layout::of_class(class as usize) == Layout::Compact {
            if !is_compact_packed(record.0) {
                return false;
            }
            // SAFETY: guaranteed by the caller; the side word of a compact block of the heap.
            unsafe {
                let side = first_word(header, Layout::Compact).read();
                (&raw mut (*header).packed).write(record.0 as u64);
                let cookie = LIVE ^ user ^ cover_compact(record.0, side);
                (*header).cookie.store(cookie, Ordering::Relaxed);
            }
            return true;
        }
        let byte = class | (Placement::Heap as u8) << CLASS_BITS;
        if !record.is_live() || record.size() as u64 > ROOM[byte as usize] {
            return false;
        }
        let packed = pack(
            record.size(),
            record.shard(),
            class,
            record.kind(),
            Placement::Heap,
        );
        let word1 = (record.stack().0 as usize) << 32;
        let words = header.cast::<usize>();
        // SAFETY: guaranteed by the caller: the header's words are ours to write.
        unsafe {
            words.write(0);
            words.add(1).write(word1);
            (&raw mut (*header).packed).write(packed);
            let cookie = LIVE ^ user ^ cover_full(0, word1, packed as usize);
            (*header).cookie.store(cookie, Ordering::Relaxed);
        }
        true
    }

    /// The stack of the heap block of header `h` (its cookie checked) was interned as `id` in
    /// place of the ring's `tag`: its record learns it too, where it still holds the tag.
    pub fn record_stack_interned(h: &BlockHeader, tag: StackId, id: StackId) {
        if h.placement() != Placement::Heap {
            return;
        }
        let record = record_at(h.address(), h.class());
        let _ = record.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
            let held = Record(word);
            (held.is_live() && held.stack() == tag)
                .then_some(word & 0xffff_ffff | (id.0 as usize) << 32)
        });
    }

    /// Claims a live block for a free by a thread that does not own its shard; false when
    /// another free got there first (a double free).
    pub fn claim(&self) -> bool {
        self.cookie
            .compare_exchange(
                self.expected(LIVE),
                self.expected(CLAIMED),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Whether the block is still claimed and waiting to be settled.
    pub fn is_claimed(&self) -> bool {
        self.cookie.load(Ordering::Relaxed) == self.expected(CLAIMED)
    }

    /// Classifies `user`. Reads memory only where it is known to be mapped: the header lies in
    /// the same page as `user` unless `user` is within its first 64 bytes, and such pointers
    /// (our large blocks, or foreign ones) are looked up in the heap or probed first.
    #[inline]
    pub fn lookup(user: *mut u8) -> Lookup {
        let addr = user as usize;
        if addr > crate::sys::PAGE_SIZE
            && addr % crate::sys::PAGE_SIZE >= HEADER_SIZE.next_power_of_two()
            && addr.is_multiple_of(16)
        {
            // SAFETY: the header lies in the same (mapped) page as `user`.
            let h = unsafe { &*Self::of(user) };
            let cookie = h.cookie.load(Ordering::Relaxed);
            if cookie == h.expected(LIVE) {
                return Lookup::Live(Self::of(user), cookie);
            }
        }
        Self::lookup_slow(user)
    }

    #[cold]
    #[inline(never)]
    fn lookup_slow(user: *mut u8) -> Lookup {
        let addr = user as usize;
        if !addr.is_multiple_of(16) || addr < crate::sys::PAGE_SIZE {
            return Lookup::Foreign;
        }
        // A page-aligned block's header lies in the page before: ours if a live mapped block
        // starts here, else probed (once: the test below then knows the page is mapped).
        let page_aligned = addr.is_multiple_of(crate::sys::PAGE_SIZE);
        if page_aligned
            && !super::mapped_blocks::holds(addr)
            && !crate::sys::page_is_mapped(addr - HEADER_SIZE)
        {
            return match raw::recently_unmapped(addr) {
                Some(freed) => Lookup::Freed {
                    size: freed.size,
                    alloc_stack: freed.alloc_stack,
                    previous_free_stack: freed.free_stack,
                },
                None => Lookup::Foreign,
            };
        }
        let header = Self::of(user);
        if !page_aligned
            && addr % crate::sys::PAGE_SIZE < HEADER_SIZE
            && !super::heap::contains(header as usize)
            && !crate::sys::page_is_mapped(header as usize)
        {
            return Lookup::Foreign;
        }
        // The span table's word on the layout: the class byte may be what is damaged.
        let layout = super::heap::layout_at(addr);
        // SAFETY: the header is in mapped pages (see above); it is read as plain values and
        // only trusted when the cookie matches this very address and header.
        let h = unsafe { &*header };
        let cookie = h.cookie.load(Ordering::Relaxed);
        if cookie == h.expected_as(LIVE, layout) {
            Lookup::Live(header, cookie)
        } else if cookie == h.expected_as(UNTRACKED, layout) {
            Lookup::Untracked(header)
        } else if cookie == {
            // SAFETY: as above.
            (unsafe { Self::freed_cookie_at(header, layout) }) ^ FREED ^ DAMAGED
        } {
            Lookup::Damaged
        } else if let Some(damage) = super::heap::contains(header as usize)
            .then(|| {
                // SAFETY: a block of the heap, in mapped pages; repaired only when its cookie
                // vouches for what it writes back.
                unsafe { Self::front_overrun(header, layout) }
            })
            .flatten()
        {
            // A write past the end of the block in front is that block's error: reported now,
            // while it may still be live (a signal handler inside the tracker leaves it to the
            // next report); the block is what its repaired header says.
            super::integrity::found_front_overrun(Self::exposed_word_at(header, layout), damage);
            if !super::guard::inside() {
                super::integrity::report_found();
            }
            Self::lookup(user)
        } else if let Some(damaged) = {
            // SAFETY: as above: the header's words are readable.
            unsafe { &*header }.underrun_bytes()
        } {
            Lookup::Underrun { header, damaged }
        } else if cookie == {
            // SAFETY: as above.
            unsafe { Self::freed_cookie_at(header, layout) }
        } || cookie == h.expected_as(CLAIMED, layout)
        {
            // SAFETY: a FREED (or CLAIMED) cookie means bytes 8..32 are still our header (the
            // heap's free lists use the bytes before them, or the side table; see the layout
            // above).
            let h = unsafe { &*header };
            Lookup::Freed {
                size: h.size(),
                alloc_stack: h.alloc_stack(),
                previous_free_stack: if super::heap::contains(addr) {
                    // SAFETY: a freed block of the heap.
                    unsafe { super::recorded_free_stack(user) }
                } else if h.placement() == Placement::Mapped {
                    // Its pages kept for the next large block (`kept_mappings`): its free was
                    // remembered as an unmapping is.
                    raw::recently_unmapped(addr).map_or(StackId(0), |freed| freed.free_stack)
                } else {
                    StackId(0)
                },
            }
        } else if let Some(block) = super::heap::block_of_free_span(addr) {
            // Its span's blocks all came back and its pages may be gone with the header: the
            // size is the class's room, the stacks unknown.
            Lookup::Freed {
                size: block.room(),
                alloc_stack: StackId(0),
                previous_free_stack: StackId(0),
            }
        } else {
            Lookup::Foreign
        }
    }
}
