//! The block header in front of every tracked block, and how a pointer handed to `delete` is
//! recognised as ours, already freed, or foreign.
//!
//! Layout (64 bytes, the user pointer follows it):
//!
//! | offset | field | note |
//! | --- | --- | --- |
//! | 0, 8 | `prev`, `next` | shard-list links; glibc's free lists reuse these bytes once a block of its is freed |
//! | 16 | `seq`, `thread` | the heap's free-list links reuse 16..40 in a free heap block |
//! | 24 | `line`, `shard`, `class`, `kind`, `placement` | |
//! | 32 | `file` | `__FILE__` of `K15_NEW`, or null |
//! | 40 | `size` | user-requested size |
//! | 48 | `alloc_stack` | stack depot id |
//! | 52 | `raw_offset` | user pointer − raw allocation |
//! | 56 | `cookie` | `LIVE`, `UNTRACKED`, `CLAIMED` or `FREED`, each `^ addr` |
//!
//! The size, stack and cookie sit in the last 24 bytes, so they survive a free list's links in a
//! freed block (the heap's use 16..40, glibc's at most 0..32): a second `delete` still finds
//! `FREED`. A free heap block also keeps its shard-list links (`heap`).

use super::raw::{self, RawBlock};
use crate::ffi::BlockKind;
use crate::stack::StackId;
use core::ffi::c_char;
use core::sync::atomic::{AtomicUsize, Ordering};

pub const HEADER_SIZE: usize = 64;

const LIVE: usize = 0x4b31_354d_454d_4f52; // "K15MEMOR"
const UNTRACKED: usize = LIVE ^ 0x00ff_00ff_00ff_00ff;
const FREED: usize = !LIVE;
/// Freed by a thread other than the block's shard owner, queued until settled (`live_list`).
const CLAIMED: usize = LIVE ^ 0x0f0f_0f0f_0f0f_0f0f;

/// Where the block's memory came from.
#[repr(u8)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Placement {
    Malloc = 0,
    Mapped = 1,
    /// Carved from the budget (`budget=` option).
    Budget = 2,
    /// From the small-block heap (`heap`).
    Heap = 3,
}

#[repr(C, align(16))]
pub struct BlockHeader {
    pub prev: *mut BlockHeader,
    pub next: *mut BlockHeader,
    pub seq: u32,
    pub thread: u32,
    pub line: u32,
    pub shard: u8,
    /// The heap's size class of a [`Placement::Heap`] block.
    pub class: u8,
    pub kind: BlockKind,
    pub placement: Placement,
    pub file: *const c_char,
    pub size: usize,
    pub alloc_stack: StackId,
    raw_offset: u32,
    /// Atomic only for [`BlockHeader::claim`]; everything else uses plain loads and stores.
    cookie: AtomicUsize,
}

const _: () = assert!(core::mem::size_of::<BlockHeader>() == HEADER_SIZE);

/// What the allocation call says about a new block.
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
}

/// What a pointer given to a free function turned out to be.
pub enum Lookup {
    /// A live tracked block.
    Live(*mut BlockHeader),
    /// A live block allocated while the tracker was busy (its own memory): freed without lists.
    Untracked(*mut BlockHeader),
    /// A block that was freed before; what its header still tells.
    Freed { size: usize, alloc_stack: StackId },
    /// Not from us at all.
    Foreign,
}

impl BlockHeader {
    /// The header in front of a user pointer.
    pub fn of(user: *mut u8) -> *mut BlockHeader {
        user.wrapping_sub(HEADER_SIZE) as *mut BlockHeader
    }

    pub fn user_ptr(header: *mut BlockHeader) -> *mut u8 {
        (header as *mut u8).wrapping_add(HEADER_SIZE)
    }

    pub fn raw_offset(&self) -> usize {
        self.raw_offset as usize
    }

    /// Writes the header of the new block in `raw`, all but its list links (a heap block is on
    /// its shard's list already; others are linked after this), and returns it: `owner` is
    /// `None` for the tracker's own (untracked) blocks, which are on no list.
    ///
    /// # Safety
    /// `raw` came from `raw::acquire*`, which reserved `HEADER_SIZE` writable bytes in front of
    /// its user pointer, and `block.file` is null or a NUL-terminated string that outlives the
    /// block.
    #[inline]
    pub unsafe fn write(
        raw: &RawBlock,
        block: &NewBlock,
        owner: Option<Owner>,
    ) -> *mut BlockHeader {
        let header = Self::of(raw.user);
        let user = raw.user as usize;
        let cookie = if owner.is_some() {
            LIVE ^ user
        } else {
            UNTRACKED ^ user
        };
        let owner = owner.unwrap_or_default();
        // SAFETY: guaranteed by the caller. Written field by field through raw places: the
        // links (and, for a fresh block, everything else) are not to be read or overwritten.
        unsafe {
            (&raw mut (*header).seq).write(owner.seq);
            (&raw mut (*header).thread).write(owner.thread);
            (&raw mut (*header).line).write(block.line);
            (&raw mut (*header).shard).write(owner.shard);
            (&raw mut (*header).class).write(raw.class);
            (&raw mut (*header).kind).write(block.kind);
            (&raw mut (*header).placement).write(raw.placement);
            (&raw mut (*header).file).write(block.file);
            (&raw mut (*header).size).write(block.size);
            (&raw mut (*header).alloc_stack).write(owner.alloc_stack);
            (&raw mut (*header).raw_offset).write(raw.raw_offset as u32);
            (&raw mut (*header).cookie).write(AtomicUsize::new(cookie));
        }
        header
    }

    fn address(&self) -> usize {
        Self::user_ptr(self as *const _ as *mut _) as usize
    }

    pub fn is_live(&self) -> bool {
        self.cookie.load(Ordering::Relaxed) == LIVE ^ self.address()
    }

    /// Marks the block freed: a later free of the same pointer finds `FREED`.
    pub fn mark_freed(&mut self) {
        self.cookie.store(FREED ^ self.address(), Ordering::Relaxed);
    }

    /// Claims a live block for a free by a thread that does not own its shard; false when
    /// another free got there first (a double free).
    pub fn claim(&self) -> bool {
        let address = self.address();
        self.cookie
            .compare_exchange(
                LIVE ^ address,
                CLAIMED ^ address,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Whether the block is still claimed and waiting to be settled.
    pub fn is_claimed(&self) -> bool {
        self.cookie.load(Ordering::Relaxed) == CLAIMED ^ self.address()
    }

    /// Classifies `user`. Reads memory only where it is known to be mapped: the cookie lies in
    /// the same page as `user` unless `user` is page-aligned, and page-aligned pointers (our
    /// large blocks, or foreign ones) are probed first.
    #[inline]
    pub fn lookup(user: *mut u8) -> Lookup {
        let addr = user as usize;
        if addr > crate::sys::PAGE_SIZE
            && !addr.is_multiple_of(crate::sys::PAGE_SIZE)
            && addr.is_multiple_of(16)
        {
            // SAFETY: the cookie word lies in the same (mapped) page as `user`.
            let cookie = unsafe { (*Self::of(user)).cookie.load(Ordering::Relaxed) };
            if cookie == LIVE ^ addr {
                return Lookup::Live(Self::of(user));
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
        if addr.is_multiple_of(crate::sys::PAGE_SIZE)
            && !crate::sys::page_is_mapped(addr - HEADER_SIZE)
        {
            return match raw::recently_unmapped(addr) {
                Some(freed) => Lookup::Freed {
                    size: freed.size,
                    alloc_stack: freed.alloc_stack,
                },
                None => Lookup::Foreign,
            };
        }
        let header = Self::of(user);
        // SAFETY: the cookie word is in a mapped page (see above); it is read as a plain value
        // and only trusted when it matches this very address.
        let cookie = unsafe { (*header).cookie.load(Ordering::Relaxed) };
        if cookie == LIVE ^ addr {
            Lookup::Live(header)
        } else if cookie == UNTRACKED ^ addr {
            Lookup::Untracked(header)
        } else if cookie == FREED ^ addr || cookie == CLAIMED ^ addr {
            // SAFETY: a FREED (or CLAIMED) cookie means bytes 40..64 are still our header (free
            // lists use at most the bytes before them; see the layout above).
            let h = unsafe { &*header };
            Lookup::Freed {
                size: h.size,
                alloc_stack: h.alloc_stack,
            }
        } else {
            Lookup::Foreign
        }
    }
}
