//! The record of live blocks: intrusive doubly linked lists, one per shard, each behind its own
//! small lock, with the shard's counters.
//!
//! A thread allocates into the shard of its thread number, so two threads never share a lock or
//! a counter cache line on the hot path; a free takes the lock of the block's own shard, which
//! is another thread's only for cross-thread frees. Counters are written only under the
//! shard's lock (plain load + store, no read-modify-write) and read without it.

use super::header::BlockHeader;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

pub const SHARD_COUNT: usize = 64;

/// A lock that knows its holder: the lock word is the holder's thread number (0 = free), so a
/// thread that finds its own number there knows it interrupted itself (a signal handler that
/// frees while the thread was inside the tracker) and must not wait. Uncontended it costs one
/// compare-and-swap; it never allocates.
pub struct SpinLock(AtomicU32);

/// The holder while `fork` runs (no thread has this number).
const FORK_HOLDER: u32 = u32::MAX;

impl SpinLock {
    const fn new() -> Self {
        SpinLock(AtomicU32::new(0))
    }

    #[inline]
    fn lock(&self, holder: u32) {
        if self
            .0
            .compare_exchange_weak(0, holder, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended(holder);
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self, holder: u32) {
        let mut spins = 0u32;
        loop {
            while self.0.load(Ordering::Relaxed) != 0 {
                spins += 1;
                if spins < 128 {
                    core::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if self
                .0
                .compare_exchange_weak(0, holder, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    #[inline]
    fn held_by(&self, holder: u32) -> bool {
        self.0.load(Ordering::Relaxed) == holder
    }

    #[inline]
    fn unlock(&self) {
        self.0.store(0, Ordering::Release);
    }
}

/// Live bytes are also summed process-wide for `peak_bytes`, but only in steps of this much per
/// shard, so threads do not fight over one counter's cache line.
const PEAK_FLUSH_BYTES: i64 = 32 * 1024;
static FLUSHED_LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static FLUSHED_PEAK_BYTES: AtomicU64 = AtomicU64::new(0);

#[repr(C, align(128))]
pub struct Shard {
    lock: SpinLock,
    head: UnsafeCell<*mut BlockHeader>,
    live_bytes: AtomicU64,
    peak_bytes: AtomicU64,
    allocations: AtomicU64,
    frees: AtomicU64,
    unflushed_bytes: AtomicI64,
}

// SAFETY: `head` and the links of the blocks on the list are only touched with `lock` held.
unsafe impl Sync for Shard {}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SHARD: Shard = Shard {
    lock: SpinLock::new(),
    head: UnsafeCell::new(core::ptr::null_mut()),
    live_bytes: AtomicU64::new(0),
    peak_bytes: AtomicU64::new(0),
    allocations: AtomicU64::new(0),
    frees: AtomicU64::new(0),
    unflushed_bytes: AtomicI64::new(0),
};

pub static SHARDS: [Shard; SHARD_COUNT] = [EMPTY_SHARD; SHARD_COUNT];

/// Every shard locked by the forking thread (see `tracker::fork`). No thread ever waits for a
/// second shard lock while holding one, so taking all of them cannot deadlock.
pub fn lock_all_shards_for_fork() {
    SHARDS.iter().for_each(|s| s.lock.lock(FORK_HOLDER));
}

pub fn unlock_all_shards_after_fork() {
    SHARDS.iter().for_each(|s| s.lock.unlock());
}

pub fn shard_of_thread(thread_number: u32) -> u16 {
    (thread_number as usize % SHARD_COUNT) as u16
}

/// Written only with the shard locked, so a plain load and store suffice.
#[inline]
fn bump(counter: &AtomicU64, by: u64) -> u64 {
    let value = counter.load(Ordering::Relaxed).wrapping_add(by);
    counter.store(value, Ordering::Relaxed);
    value
}

/// The shard's lock, held: list and counter changes go through it.
pub struct LockedShard<'a> {
    shard: &'a Shard,
}

impl Shard {
    /// Locks the shard for thread `me` (its thread number).
    #[inline]
    pub fn lock(&self, me: u32) -> LockedShard<'_> {
        self.lock.lock(me);
        LockedShard { shard: self }
    }

    /// Whether thread `me` holds the shard's lock (then it must not wait for it).
    #[inline]
    pub fn held_by(&self, me: u32) -> bool {
        self.lock.held_by(me)
    }

    /// Locks the shard, unless thread `me` holds it already: then `me` is a signal handler
    /// that interrupted its own thread inside the tracker, and waiting would never end.
    #[inline]
    pub fn lock_unless_held_by(&self, me: u32) -> Option<LockedShard<'_>> {
        (!self.held_by(me)).then(|| self.lock(me))
    }
}

impl LockedShard<'_> {
    /// Puts a new block at the head of the list and counts it.
    ///
    /// # Safety
    /// `header` is a fully written header of a block on no list.
    #[inline]
    pub unsafe fn link(&mut self, header: *mut BlockHeader, size: usize) {
        let s = self.shard;
        // SAFETY: the lock is held, so the list and its nodes are ours to change.
        unsafe {
            let head = *s.head.get();
            (*header).prev = core::ptr::null_mut();
            (*header).next = head;
            if !head.is_null() {
                (*head).prev = header;
            }
            *s.head.get() = header;
        }
        bump(&s.allocations, 1);
        let live = bump(&s.live_bytes, size as u64);
        if live > s.peak_bytes.load(Ordering::Relaxed) {
            s.peak_bytes.store(live, Ordering::Relaxed);
        }
        self.account_bytes(size as i64);
    }

    /// Takes a block off the list and counts the free.
    ///
    /// # Safety
    /// `header` is on this shard's list.
    #[inline]
    pub unsafe fn unlink(&mut self, header: *mut BlockHeader, size: usize) {
        let s = self.shard;
        // SAFETY: the lock is held and the block is on this list.
        unsafe {
            let (prev, next) = ((*header).prev, (*header).next);
            if prev.is_null() {
                *s.head.get() = next;
            } else {
                (*prev).next = next;
            }
            if !next.is_null() {
                (*next).prev = prev;
            }
        }
        bump(&s.frees, 1);
        bump(&s.live_bytes, (size as u64).wrapping_neg());
        self.account_bytes(-(size as i64));
    }

    #[inline]
    fn account_bytes(&mut self, delta: i64) {
        let pending = self.shard.unflushed_bytes.load(Ordering::Relaxed) + delta;
        if pending.abs() < PEAK_FLUSH_BYTES {
            self.shard.unflushed_bytes.store(pending, Ordering::Relaxed);
        } else {
            self.shard.unflushed_bytes.store(0, Ordering::Relaxed);
            flush_live_bytes(pending);
        }
    }

    /// Every block on the list, head first.
    pub fn blocks(&self) -> impl Iterator<Item = *mut BlockHeader> + '_ {
        // SAFETY: the lock is held for as long as the iterator borrows `self`.
        let mut node = unsafe { *self.shard.head.get() };
        core::iter::from_fn(move || {
            let current = node;
            // SAFETY: a non-null node is a live header on the locked list.
            (!current.is_null()).then(|| unsafe {
                node = (*current).next;
                current
            })
        })
    }
}

impl Drop for LockedShard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.shard.lock.unlock();
    }
}

#[cold]
fn flush_live_bytes(delta: i64) {
    let live = FLUSHED_LIVE_BYTES.fetch_add(delta, Ordering::Relaxed) + delta;
    FLUSHED_PEAK_BYTES.fetch_max(live.max(0) as u64, Ordering::Relaxed);
}

/// Sums of all shards' counters.
#[derive(Default, Clone, Copy)]
pub struct Totals {
    pub live_blocks: u64,
    pub live_bytes: u64,
    pub peak_bytes: u64,
    pub allocations: u64,
    pub frees: u64,
}

/// The counters of the whole process, read without locks (each value is exact once threads
/// are quiet). `peak_bytes` is exact for one thread and within 32 KiB per thread otherwise.
pub fn totals() -> Totals {
    let mut t = Totals {
        peak_bytes: FLUSHED_PEAK_BYTES.load(Ordering::Relaxed),
        ..Totals::default()
    };
    for s in &SHARDS {
        t.live_bytes = t
            .live_bytes
            .wrapping_add(s.live_bytes.load(Ordering::Relaxed));
        t.allocations += s.allocations.load(Ordering::Relaxed);
        t.frees += s.frees.load(Ordering::Relaxed);
        t.peak_bytes = t.peak_bytes.max(s.peak_bytes.load(Ordering::Relaxed));
    }
    // Read without locks, a free can be counted before its allocation: never below zero.
    t.live_blocks = t.allocations.saturating_sub(t.frees);
    t.peak_bytes = t.peak_bytes.max(t.live_bytes);
    t
}
