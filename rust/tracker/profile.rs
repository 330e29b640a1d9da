//! `profile=1`: per allocating stack (with stacks off, per `K15_NEW` site), the allocations, bytes and temporary allocations, and what it held at the process's peak.
//!
//! Each stack has an entry in a table mapped once at set-up (open addressing by its key, no
//! lock, no allocation), counted at every allocation and free with relaxed atomic adds.
//!
//! **Temporary**, as heaptrack counts it: an allocation freed before the thread's next
//! allocation (other frees may come in between). A thread remembers the block it allocated
//! last; a free of that very block counts as temporary. (heaptrack remembers one block for the
//! whole process, its events being serialized; here each thread has its own.)
//!
//! **The peak's consumers** without a snapshot at every new peak: the process's live bytes
//! (one exact atomic counter) and their peak carry an epoch, which each new peak advances. An
//! entry whose live figures are about to change in a later epoch than the one it last changed
//! in copies them first (they are what it held at the latest peak, since it did not change
//! between that peak and now). At exit, an entry that changed since the latest peak gives its
//! copy, any other its live figures: what each stack held at the peak, exactly, for the cost of
//! a compare per event. Among threads the peak and the copies race (a thread may change an entry
//! between another thread's new peak and its epoch): exact for one thread, close for several.

use super::header::BlockHeader;
use super::site;
use super::tags::TagId;
use crate::stack::StackId;
use core::cell::Cell;
use core::ffi::c_char;
use core::sync::atomic::{AtomicI64, AtomicPtr, AtomicU32, AtomicU64, Ordering::Relaxed};

/// Entries: far more than the distinct allocating stacks of yaml-cpp's suite (174,000); a stack
/// beyond them is counted in no entry (and the report says how many allocations were).
const CAPACITY: usize = 1 << 20;
/// Keys of `K15_NEW` sites (stacks off): above every depot id (below 2^24).
const SITE_KEY: u32 = 1 << 30;

/// One stack's figures. `key` is the stack's key + 1 (0: a free entry), set once.
struct Entry {
    key: AtomicU32,
    /// The tag of its latest allocation (a stack is nearly always under one scope).
    tag: AtomicU32,
    allocations: AtomicU64,
    bytes: AtomicU64,
    temporary: AtomicU64,
    live_blocks: AtomicI64,
    live_bytes: AtomicI64,
    /// What it held at the latest peak before `epoch` ended (see the module doc).
    peak_blocks: AtomicI64,
    peak_bytes: AtomicI64,
    epoch: AtomicU64,
}

type Table = [Entry; CAPACITY];

static TABLE: AtomicPtr<Table> = AtomicPtr::new(core::ptr::null_mut());
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static PEAK_BYTES: AtomicI64 = AtomicI64::new(0);
/// Advanced at every new peak.
static EPOCH: AtomicU64 = AtomicU64::new(0);
/// The frame in which the peak was reached (`frame_mark()`s before it; 0: start-up).
static PEAK_FRAME: AtomicU64 = AtomicU64::new(0);
/// Allocations of stacks that found no entry (the table full).
static UNCOUNTED: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// The user pointer of the thread's latest allocation.
    static LAST_ALLOCATION: Cell<usize> = const { Cell::new(0) };
}

/// Maps the table (once, at the tracker's set-up); false if it cannot be (profiling is off).
pub(super) fn set_up() -> bool {
    !crate::sys::map_once(&TABLE, core::mem::size_of::<Table>()).is_null()
}

/// What a block's figures are kept under: its stack, or with none its `K15_NEW` site.
fn key_of(h: &BlockHeader) -> u32 {
    match h.alloc_stack() {
        StackId(0) => SITE_KEY | site::intern(h.file(), h.line()),
        stack => stack.0,
    }
}

/// The entry of `key`, claimed if it has none yet; `None` when the table is full.
fn entry(key: u32) -> Option<&'static Entry> {
    // SAFETY: mapped at set-up before any block was counted (`HOT_PROFILE` is set after), zeroed
    // (every entry free), never unmapped; entries are only accessed through atomics.
    let table = unsafe { TABLE.load(Relaxed).as_ref()? };
    let stored = key + 1;
    let mut index = (stored.wrapping_mul(0x9E37_79B9) >> 12) as usize % CAPACITY;
    for _ in 0..CAPACITY {
        let e = &table[index];
        let found = match e.key.load(Relaxed) {
            0 => match e.key.compare_exchange(0, stored, Relaxed, Relaxed) {
                Ok(_) => stored,
                Err(other) => other,
            },
            found => found,
        };
        if found == stored {
            return Some(e);
        }
        index = (index + 1) % CAPACITY;
    }
    None
}

impl Entry {
    /// Before a change of its live figures: keeps them as the latest peak's if they have not
    /// changed since it.
    fn keep_peak(&self) {
        let epoch = EPOCH.load(Relaxed);
        if self.epoch.load(Relaxed) != epoch {
            self.peak_blocks
                .store(self.live_blocks.load(Relaxed), Relaxed);
            self.peak_bytes
                .store(self.live_bytes.load(Relaxed), Relaxed);
            self.epoch.store(epoch, Relaxed);
        }
    }
}

/// Counts the new block at `header` (its stack settled, its user pointer `user`).
pub(super) fn count_allocation(header: &BlockHeader, user: *mut u8) {
    LAST_ALLOCATION.set(user as usize);
    let size = header.size() as i64;
    let Some(e) = entry(key_of(header)) else {
        UNCOUNTED.fetch_add(1, Relaxed);
        return;
    };
    e.keep_peak();
    e.tag.store(header.tag() as u32, Relaxed);
    e.allocations.fetch_add(1, Relaxed);
    e.bytes.fetch_add(size as u64, Relaxed);
    e.live_blocks.fetch_add(1, Relaxed);
    e.live_bytes.fetch_add(size, Relaxed);
    let live = LIVE_BYTES.fetch_add(size, Relaxed) + size;
    if live > PEAK_BYTES.fetch_max(live, Relaxed) {
        // Every entry now holds what it held at this peak: the next change of each copies it.
        EPOCH.fetch_add(1, Relaxed);
        PEAK_FRAME.store(super::frames::marks_so_far(), Relaxed);
    }
}

/// Counts the free of the live block at `header`, by the calling thread.
pub(super) fn count_free(header: *mut BlockHeader) {
    let user = BlockHeader::user_ptr(header) as usize;
    // Forgotten once freed: its address may serve another thread's block next.
    let temporary = LAST_ALLOCATION.get() == user;
    if temporary {
        LAST_ALLOCATION.set(0);
    }
    // SAFETY: a live block the caller frees: its header is readable.
    let h = unsafe { &*header };
    let size = h.size() as i64;
    let Some(e) = entry(key_of(h)) else {
        return;
    };
    e.keep_peak();
    if temporary {
        e.temporary.fetch_add(1, Relaxed);
    }
    e.live_blocks.fetch_sub(1, Relaxed);
    e.live_bytes.fetch_sub(size, Relaxed);
    LIVE_BYTES.fetch_sub(size, Relaxed);
}

/// One stack's figures, as the report reads them.
#[derive(Clone, Copy, Debug)]
pub struct SiteFigures {
    /// The allocating stack; `StackId(0)` with stacks off, where `file` and `line` name the
    /// `K15_NEW` site (null and 0 for a plain `new` or `malloc`).
    pub stack: StackId,
    pub file: *const c_char,
    pub line: u32,
    pub tag: TagId,
    pub allocations: u64,
    pub bytes: u64,
    pub temporary: u64,
    /// What it held at the process's peak.
    pub peak_blocks: u64,
    pub peak_bytes: u64,
}

/// Everything profiled so far.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub sites: Vec<SiteFigures>,
    /// The process's peak of live bytes, and the frame it was reached in.
    pub peak_bytes: u64,
    pub peak_frame: u64,
    /// Allocations of stacks beyond the table's room (in no site).
    pub uncounted: u64,
}

/// Every stack's figures (in no order), or `None` when profiling is off. Read while threads run,
/// each figure is as it was at some moment of the read.
pub fn read() -> Option<Profile> {
    // SAFETY: as in `entry`.
    let table = unsafe { TABLE.load(Relaxed).as_ref()? };
    let epoch = EPOCH.load(Relaxed);
    let sites = table
        .iter()
        .filter_map(|e| {
            let key = e.key.load(Relaxed).checked_sub(1)?;
            let (stack, file, line) = if key & SITE_KEY != 0 {
                let (file, line) = site::resolve(key & !SITE_KEY);
                (StackId(0), file, line)
            } else {
                (StackId(key), core::ptr::null(), 0)
            };
            let (peak_blocks, peak_bytes) = if e.epoch.load(Relaxed) == epoch {
                (&e.peak_blocks, &e.peak_bytes)
            } else {
                (&e.live_blocks, &e.live_bytes)
            };
            Some(SiteFigures {
                stack,
                file,
                line,
                tag: e.tag.load(Relaxed) as TagId,
                allocations: e.allocations.load(Relaxed),
                bytes: e.bytes.load(Relaxed),
                temporary: e.temporary.load(Relaxed),
                peak_blocks: peak_blocks.load(Relaxed).max(0) as u64,
                peak_bytes: peak_bytes.load(Relaxed).max(0) as u64,
            })
        })
        .collect();
    Some(Profile {
        sites,
        peak_bytes: PEAK_BYTES.load(Relaxed).max(0) as u64,
        peak_frame: PEAK_FRAME.load(Relaxed),
        uncounted: UNCOUNTED.load(Relaxed),
    })
}
