//! Shards: each thread's counters, its queue of frees of other threads' blocks, the list of its
//! live blocks from outside the heap (intrusive, doubly linked through [`FarLinks`] in front of
//! their headers), and how threads take turns on them. Blocks of the heap are on no list: the
//! heap's spans are walked instead (`spans::for_each_block`), with the world stopped, and a
//! shard held is what keeps its thread from changing heap headers meanwhile.
//!
//! Each thread owns a shard (claimed at its first allocation, given back at its exit) and
//! changes it without any atomic read-modify-write: it sets the shard's `busy` flag with a plain
//! store and checks that nobody has `revoked` the shard. (A locked instruction per `new` and per
//! `delete` was the largest single cost of a tracked pair.) Whoever needs shards it does not
//! own — the report, `stats()`, `fork`, settling frees of other threads' blocks — stops the
//! world: takes every shard's lock, sets `revoked`, runs one `membarrier` (which orders the
//! owners' plain stores against it: an asymmetric Dekker handshake) and waits until no owner is
//! busy. That costs microseconds, so a `delete` of another thread's block only claims the block
//! (a compare-and-swap of its cookie) and queues it on the freeing thread's own shard; queued
//! frees are settled in one stop every [`PENDING_CAPACITY`] of them, and before every report,
//! `stats()` and `fork`.
//!
//! Shards below [`GUEST_SHARDS`] are never owned: threads beyond the owned shards, and every
//! thread where `membarrier` is unavailable, share them, each behind its spinlock.

use super::header::{far_links, BlockHeader};
use core::cell::UnsafeCell;
use core::sync::atomic::{compiler_fence, AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};

pub const SHARD_COUNT: usize = 256;
const _: () = assert!(SHARD_COUNT == u8::MAX as usize + 1, "a shard index is a u8");
/// Shards `0..GUEST_SHARDS` are shared, behind their locks; the others are owned by one thread.
pub const GUEST_SHARDS: usize = 16;
/// Frees of other threads' blocks a shard queues before they are settled.
pub const PENDING_CAPACITY: usize = 256;

/// A lock that knows its holder: the lock word is the holder's thread number (0 = free), so a
/// thread that finds its own number there knows it interrupted itself (a signal handler that
/// frees while the thread was inside the tracker) and must not wait. Uncontended it costs one
/// compare-and-swap; it never allocates.
pub struct SpinLock(AtomicU32);

/// The holder while `fork` runs (no thread has this number).
pub const FORK_HOLDER: u32 = u32::MAX;

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

    /// Locks, unless the lock stays held for longer than [`PATIENCE`] (its holder is gone or
    /// stuck), or `gives_way` and another stop waits (see [`WAITING_STOPPERS`]): then false.
    #[cold]
    fn lock_within(&self, holder: u32, gives_way: bool) -> bool {
        let mut waited = Patience::new();
        waited.gives_way = gives_way;
        loop {
            if self
                .0
                .compare_exchange_weak(0, holder, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return true;
            }
            if !waited.more() {
                return false;
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
const PEAK_FLUSH_BYTES: u64 = 32 * 1024;
static FLUSHED_LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static FLUSHED_PEAK_BYTES: AtomicU64 = AtomicU64::new(0);

/// `owner` of a shard nobody owns (guest shards among them: they are told by their index).
const NO_OWNER: u32 = 0;

#[repr(C, align(128))]
pub struct Shard {
    lock: SpinLock,
    /// The owning thread's number or [`NO_OWNER`]; changed only under `lock`.
    owner: AtomicU32,
    /// Written by the owner only, with plain stores: it is changing the shard. A word of its
    /// own: a load of `revoked` right after a byte store into the same 8 bytes cannot take its
    /// value from the store and stalls (a store-to-load interlock, on every `new` and `delete`).
    busy: AtomicU64,
    /// Set by a thread stopping the world (holding `lock`): the owner must take `lock` too.
    revoked: AtomicBool,
    /// Queued frees in `pending` (read by `stats()` to know whether to settle).
    pending_len: AtomicU32,
    head: UnsafeCell<*mut BlockHeader>,
    /// The list's last block: a list whose links were damaged is rebuilt from both ends.
    tail: UnsafeCell<*mut BlockHeader>,
    live_bytes: AtomicU64,
    peak_bytes: AtomicU64,
    allocations: AtomicU64,
    frees: AtomicU64,
    /// The band around `live_bytes` as last added to the process-wide sum (`flush_above` less
    /// [`PEAK_FLUSH_BYTES`]) inside which changes are not flushed: one compare per `new` or
    /// `delete`.
    flush_above: AtomicU64,
    flush_below: AtomicU64,
}

/// Blocks of other shards a shard's owner freed, claimed and waiting to be settled: the first
/// `pending_len` of them. Kept apart from the shards so that stopping the world, which touches
/// every shard, touches 32 KiB rather than the half megabyte of mostly unused queues (a page
/// fault for each page on the first report or `stats()`).
struct PendingQueue(UnsafeCell<[*mut BlockHeader; PENDING_CAPACITY]>);

// SAFETY: `head`, the links of the blocks on the list and the shard's pending queue are only
// touched by the owner while `busy` and not `revoked`, or with `lock` held after the owner was
// excluded (see the module docs); the rest is atomic.
unsafe impl Sync for Shard {}
// SAFETY: as the shard's own fields (above): a queue is touched by whoever holds its shard.
unsafe impl Sync for PendingQueue {}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SHARD: Shard = Shard {
    lock: SpinLock::new(),
    owner: AtomicU32::new(NO_OWNER),
    busy: AtomicU64::new(0),
    revoked: AtomicBool::new(false),
    pending_len: AtomicU32::new(0),
    head: UnsafeCell::new(core::ptr::null_mut()),
    tail: UnsafeCell::new(core::ptr::null_mut()),
    live_bytes: AtomicU64::new(0),
    peak_bytes: AtomicU64::new(0),
    allocations: AtomicU64::new(0),
    frees: AtomicU64::new(0),
    // 0: the shard's first allocation flushes, and sets the band.
    flush_above: AtomicU64::new(0),
    flush_below: AtomicU64::new(0),
};

/// All zeros at start, so that they lie in `.bss` (557 KB of `.data` in every program linked
/// with the library before, and a copy-on-write fault for each page first written).
pub static SHARDS: [Shard; SHARD_COUNT] = [EMPTY_SHARD; SHARD_COUNT];

/// By shard index; all zeros at start, in `.bss` like the shards.
#[allow(clippy::declare_interior_mutable_const)]
static PENDING: [PendingQueue; SHARD_COUNT] =
    [const { PendingQueue(UnsafeCell::new([core::ptr::null_mut(); PENDING_CAPACITY])) };
        SHARD_COUNT];

/// Where the shards and their queues lie: their list ends and queues hold header addresses,
/// not the program's pointers, so a leak scan skips them.
pub fn shards_ranges() -> [core::ops::Range<usize>; 2] {
    [
        crate::sys::bytes_of(&SHARDS),
        crate::sys::bytes_of(&PENDING),
    ]
}

impl Shard {
    /// This shard's queue of pending frees.
    fn pending(&self) -> *mut [*mut BlockHeader; PENDING_CAPACITY] {
        let index = (self as *const Shard as usize - SHARDS.as_ptr() as usize)
            / core::mem::size_of::<Shard>();
        PENDING[index].0.get()
    }
}

/// Written only by whoever holds the shard, so a plain load and store suffice.
#[inline]
fn bump(counter: &AtomicU64, by: u64) -> u64 {
    let value = counter.load(Ordering::Relaxed).wrapping_add(by);
    counter.store(value, Ordering::Relaxed);
    value
}

/// The shard a thread works on: its own, or a guest shard it shares.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ThreadShard {
    pub index: u8,
    pub owned: bool,
}

/// A shard for thread `me`: one nobody owns, else a guest shard. Cold: once per thread.
#[cold]
pub fn claim_shard(me: u32) -> ThreadShard {
    if crate::sys::process_barrier_available() {
        let owned = SHARD_COUNT - GUEST_SHARDS;
        for step in 0..owned {
            let index = GUEST_SHARDS + (me as usize + step) % owned;
            let shard = &SHARDS[index];
            if shard.owner.load(Ordering::Relaxed) != NO_OWNER {
                continue;
            }
            shard.lock.lock(me);
            let free = shard.owner.load(Ordering::Relaxed) == NO_OWNER;
            if free {
                shard.owner.store(me, Ordering::Relaxed);
            }
            shard.lock.unlock();
            if free {
                return ThreadShard {
                    index: index as u8,
                    owned: true,
                };
            }
        }
    }
    ThreadShard {
        index: (me as usize % GUEST_SHARDS) as u8,
        owned: false,
    }
}

/// Thread exit: settles the thread's queued frees and gives its shard back; its blocks stay
/// on the shard's list for the next owner.
pub fn leave_shard(me: u32, shard: ThreadShard) {
    if !shard.owned {
        return;
    }
    let s = &SHARDS[shard.index as usize];
    if s.pending_len.load(Ordering::Relaxed) > 0 {
        drop(StoppedWorld::stop(me)); // settles them
    }
    s.lock.lock(me);
    s.owner.store(NO_OWNER, Ordering::Relaxed);
    s.lock.unlock();
}

/// Why [`Shard::lock_unowned`] did not lock.
pub enum NotHeld {
    /// Another thread owns the shard.
    Owned,
    /// The calling thread holds it already (a signal handler inside the tracker).
    Reentered,
}

/// A shard held for changes, by its owner (`busy`) or under its lock.
pub struct HeldShard<'a> {
    shard: &'a Shard,
    how: Held,
}

/// What letting go of a [`HeldShard`] takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Held {
    ByOwner,
    ByLock,
    /// Part of a [`StoppedWorld`], which lets go of every shard at once.
    InStoppedWorld,
    /// Part of a [`StoppedWorld`] that could not settle it: its owner may be in the middle of
    /// a change, so the list is only read, never repaired.
    Unsettled,
}

impl Shard {
    /// Adds the change of the shard's live bytes since the last flush to the process-wide sum
    /// (for `peak_bytes`), once it is [`PEAK_FLUSH_BYTES`] either way. Called by the holder.
    #[cold]
    #[inline(never)]
    fn flush_live_bytes(&self, live: u64) {
        // Nothing flushed yet while `flush_above` is 0.
        let flushed = self
            .flush_above
            .load(Ordering::Relaxed)
            .saturating_sub(PEAK_FLUSH_BYTES);
        let delta = live.wrapping_sub(flushed) as i64;
        let total = FLUSHED_LIVE_BYTES.fetch_add(delta, Ordering::Relaxed) + delta;
        FLUSHED_PEAK_BYTES.fetch_max(total.max(0) as u64, Ordering::Relaxed);
        self.flush_above
            .store(live + PEAK_FLUSH_BYTES, Ordering::Relaxed);
        self.flush_below
            .store(live.saturating_sub(PEAK_FLUSH_BYTES), Ordering::Relaxed);
    }

    /// Holds the shard for thread `me`, as its owner if `owned`, else under its lock; `None` when `me`
    /// holds it already (a signal handler interrupting its own thread inside the tracker,
    /// which must not wait).
    #[inline]
    pub fn hold(&self, me: u32, owned: bool) -> Option<HeldShard<'_>> {
        if owned {
            if self.busy.load(Ordering::Relaxed) != 0 {
                return None;
            }
            if let Some(held) = self.take_as_owner() {
                return Some(held);
            }
        }
        if self.lock.held_by(me) {
            return None;
        }
        self.lock.lock(me);
        Some(HeldShard {
            shard: self,
            how: Held::ByLock,
        })
    }

    /// [`Shard::hold`] by its owner, when nobody else is on it: `None`, with nothing changed,
    /// otherwise. Calls nothing.
    #[inline(always)]
    pub fn hold_as_owner(&self) -> Option<HeldShard<'_>> {
        if self.busy.load(Ordering::Relaxed) != 0 {
            return None;
        }
        self.take_as_owner()
    }

    /// The owner's hold of a shard it is not on: `None` (and not on it) when stopping the world
    /// revoked it.
    #[inline(always)]
    fn take_as_owner(&self) -> Option<HeldShard<'_>> {
        self.busy.store(1, Ordering::Relaxed);
        // The store above and the load below are ordered by the stopping thread's membarrier,
        // which makes this compiler fence a full one (see the module docs).
        compiler_fence(Ordering::SeqCst);
        if self.revoked.load(Ordering::Relaxed) {
            self.busy.store(0, Ordering::Release);
            return None;
        }
        Some(HeldShard {
            shard: self,
            how: Held::ByOwner,
        })
    }

    /// Locks another thread's shard if nobody owns it (an exited owner, a guest shard):
    /// `None` when a thread owns it, or `me` holds the lock already.
    pub fn lock_unowned(&self, me: u32) -> Result<HeldShard<'_>, NotHeld> {
        if self.lock.held_by(me) {
            return Err(NotHeld::Reentered);
        }
        self.lock.lock(me);
        if self.owner.load(Ordering::Relaxed) == NO_OWNER {
            return Ok(HeldShard {
                shard: self,
                how: Held::ByLock,
            });
        }
        self.lock.unlock();
        Err(NotHeld::Owned)
    }
}

impl HeldShard<'_> {
    /// Puts a block at the head of the list.
    ///
    /// # Safety
    /// `header` is a header of ours on no list.
    #[inline]
    pub unsafe fn link(&mut self, header: *mut BlockHeader) {
        let s = self.shard;
        // SAFETY: the shard is held, so the list and its nodes are ours to change.
        unsafe {
            let head = *s.head.get();
            (*far_links(header)).prev = core::ptr::null_mut();
            (*far_links(header)).next = head;
            if head.is_null() {
                *s.tail.get() = header;
            } else {
                (*far_links(head)).prev = header;
            }
            // The block is complete before the head names it: an exit report run by a signal
            // handler that interrupted this thread here walks the list as it stands.
            compiler_fence(Ordering::Release);
            *s.head.get() = header;
        }
    }

    /// Takes a block off the list. Its links are checked against its neighbours' first (an
    /// overrun of the block in front of it in memory may have reached them): a damaged list is
    /// repaired and reported (`integrity`), and a block no longer on it is left alone.
    ///
    /// # Safety
    /// `header` is a header of ours that was linked on this shard's list.
    #[inline]
    pub unsafe fn unlink(&mut self, header: *mut BlockHeader) {
        let s = self.shard;
        // SAFETY: the shard is held; links are followed only once they look like pointers and
        // agree with the neighbours they lead to.
        unsafe {
            if !self.links_agree(header) {
                super::integrity::repair_list(self);
                if !self.links_agree(header) {
                    return;
                }
            }
            let (prev, next) = ((*far_links(header)).prev, (*far_links(header)).next);
            if prev.is_null() {
                *s.head.get() = next;
            } else {
                (*far_links(prev)).next = next;
            }
            if next.is_null() {
                *s.tail.get() = prev;
            } else {
                (*far_links(next)).prev = prev;
            }
        }
    }

    /// Whether the block's neighbours (or the list's ends) link back to it: whether it is tied
    /// into the list.
    ///
    /// # Safety
    /// `header` is a header of ours; the shard is held.
    #[inline]
    pub unsafe fn links_agree(&self, header: *mut BlockHeader) -> bool {
        let s = self.shard;
        // SAFETY: a neighbour is read only once it passes `could_be_neighbour`.
        unsafe {
            let (prev, next) = ((*far_links(header)).prev, (*far_links(header)).next);
            let prev_agrees = if prev.is_null() {
                *s.head.get() == header
            } else {
                super::integrity::could_be_neighbour(prev) && (*far_links(prev)).next == header
            };
            let next_agrees = if next.is_null() {
                *s.tail.get() == header
            } else {
                super::integrity::could_be_neighbour(next) && (*far_links(next)).prev == header
            };
            prev_agrees && next_agrees
        }
    }

    /// The list's first and last blocks.
    pub fn ends(&self) -> (*mut BlockHeader, *mut BlockHeader) {
        // SAFETY: the shard is held.
        unsafe { (*self.shard.head.get(), *self.shard.tail.get()) }
    }

    /// Sets the list's first and last blocks (`integrity`, rebuilding a damaged list).
    pub fn set_ends(&self, head: *mut BlockHeader, tail: *mut BlockHeader) {
        // SAFETY: the shard is held.
        unsafe {
            *self.shard.head.get() = head;
            *self.shard.tail.get() = tail;
        }
    }

    /// Counts a new block of `size` bytes.
    #[inline]
    pub fn count_allocation(&mut self, size: usize) {
        let live = self.count_allocation_unflushed(size);
        if live >= self.shard.flush_above.load(Ordering::Relaxed) {
            self.shard.flush_live_bytes(live);
        }
    }

    /// Whether an allocation of `size` bytes counted now leaves the process-wide sum alone
    /// (see [`Shard::flush_live_bytes`]).
    #[inline(always)]
    pub fn counts_unflushed(&self, size: usize) -> bool {
        let s = self.shard;
        s.live_bytes.load(Ordering::Relaxed) + (size as u64) < s.flush_above.load(Ordering::Relaxed)
    }

    /// [`HeldShard::count_allocation`] but for the process-wide sum, which
    /// [`HeldShard::counts_unflushed`] said it does not need; the shard's live bytes.
    #[inline(always)]
    pub fn count_allocation_unflushed(&mut self, size: usize) -> u64 {
        let s = self.shard;
        bump(&s.allocations, 1);
        let live = bump(&s.live_bytes, size as u64);
        if live > s.peak_bytes.load(Ordering::Relaxed) {
            s.peak_bytes.store(live, Ordering::Relaxed);
        }
        live
    }

    /// Counts the free of a block of `size` bytes.
    #[inline]
    pub fn count_free(&mut self, size: usize) {
        let s = self.shard;
        bump(&s.frees, 1);
        let live = bump(&s.live_bytes, (size as u64).wrapping_neg());
        if live < s.flush_below.load(Ordering::Relaxed) {
            s.flush_live_bytes(live);
        }
    }

    /// Queues a claimed block of another shard; false when the queue is full (settle it, and
    /// queue again).
    pub fn queue_pending(&mut self, header: *mut BlockHeader) -> bool {
        let s = self.shard;
        let len = s.pending_len.load(Ordering::Relaxed) as usize;
        if len == PENDING_CAPACITY {
            return false;
        }
        // SAFETY: the shard is held; `len` is below the capacity.
        unsafe { (*s.pending())[len] = header };
        s.pending_len.store(len as u32 + 1, Ordering::Relaxed);
        true
    }

    /// The index of the held shard in [`SHARDS`] (a cold path's: a search).
    pub fn index(&self) -> u8 {
        SHARDS
            .iter()
            .position(|shard| core::ptr::eq(shard, self.shard))
            .map_or(0, |index| index as u8)
    }

    /// Whether the list and its blocks' headers may be repaired: nobody can be in the middle of
    /// a change of them (not a shard a stopped world had to read as it stood).
    pub fn may_repair(&self) -> bool {
        self.how != Held::Unsettled
    }

    /// Every block on the list, head first. Each link is checked before it is followed; a
    /// damaged list is repaired and reported (`integrity`) on the way.
    pub fn blocks(&self) -> impl Iterator<Item = *mut BlockHeader> + '_ {
        // SAFETY: the shard is held for as long as the iterator borrows `self`.
        let mut node = unsafe { *self.shard.head.get() };
        let mut repaired = false;
        core::iter::from_fn(move || {
            let current = node;
            if current.is_null() {
                return None;
            }
            // SAFETY: `current` is a header on the held list (checked when it was reached).
            unsafe {
                node = (*far_links(current)).next;
                if !node.is_null()
                    && !super::integrity::links_back(node, current)
                    && !repaired
                    && self.may_repair()
                {
                    super::integrity::repair_list(self);
                    repaired = true;
                    node = (*far_links(current)).next;
                }
                if !node.is_null() && !super::integrity::links_back(node, current) {
                    node = core::ptr::null_mut(); // still damaged after a repair: stop here
                }
            }
            Some(current)
        })
    }
}

impl Drop for HeldShard<'_> {
    /// The owner's store inline (every `new` and `delete` ends here); the rest out of line.
    #[inline]
    fn drop(&mut self) {
        if self.how == Held::ByOwner {
            self.shard.busy.store(0, Ordering::Release);
        } else {
            self.let_go_otherwise();
        }
    }
}

impl HeldShard<'_> {
    #[cold]
    #[inline(never)]
    fn let_go_otherwise(&self) {
        match self.how {
            Held::ByLock => self.shard.lock.unlock(),
            Held::ByOwner | Held::InStoppedWorld | Held::Unsettled => {}
        }
    }
}

/// A set of shards, one bit each.
#[derive(Clone, Copy, Default)]
struct ShardSet([u64; SHARD_COUNT / 64]);

impl ShardSet {
    fn insert(&mut self, index: usize) {
        self.0[index / 64] |= 1 << (index % 64);
    }

    fn contains(&self, index: usize) -> bool {
        self.0[index / 64] & (1 << (index % 64)) != 0
    }
}

/// Set when the exit report runs on a thread that a signal handler interrupted inside the
/// tracker: that thread may hold a heap class lock or be in the middle of a list, so from then
/// on queued frees are no longer settled (they stay claimed: no report lists them).
static SETTLING_STOPPED: AtomicBool = AtomicBool::new(false);

/// Stops settling queued frees for the rest of the process (see [`SETTLING_STOPPED`]).
pub fn stop_settling() {
    SETTLING_STOPPED.store(true, Ordering::Relaxed);
}

/// Whether [`stop_settling`] was called.
pub fn settling_stopped() -> bool {
    SETTLING_STOPPED.load(Ordering::Relaxed)
}

/// Whether thread `me` is in the middle of a change of its shard `shard` (a signal handler
/// interrupted it there).
pub fn is_changing(me: u32, shard: ThreadShard) -> bool {
    let s = &SHARDS[shard.index as usize];
    (shard.owned && s.busy.load(Ordering::Relaxed) != 0) || s.lock.held_by(me)
}

/// How long stopping the world waits for one shard before it gives up on it: its holder is
/// gone (a thread that ended inside the tracker) or not coming back. A live holder lets go
/// within microseconds, or at worst after another stopped world's walk or a `fork`.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Every shard held by one thread, its owner excluded: for the report, `stats()`, `fork` and
/// settling queued frees. Never taken while the thread holds a shard, except by a signal
/// handler (an `exit` in a handler runs the report): shards the calling thread itself holds,
/// and shards whose holder does not let go within [`PATIENCE`], are left *unsettled* (not
/// held; their lists read as they are) rather than waited for forever.
pub struct StoppedWorld {
    locked: ShardSet,
    unsettled: ShardSet,
    /// Taken inside the calling thread's own stop (a signal handler interrupted it there): the
    /// outer stop keeps [`STOPPER`].
    nested: bool,
    /// Stopping waits (`nanosleep`) on a program's thread, maybe one it cancels.
    _cancellation: crate::sys::CancellationHeld,
}

/// The one thread stopping the world (its number, [`FORK_HOLDER`], or 0: nobody): two stops at
/// once waited on each other's shards, each for its whole [`PATIENCE`], and a report started
/// inside another stop waited for shards its own thread held.
static STOPPER: SpinLock = SpinLock::new();
/// Threads waiting to stop the world: a stop under way stops waiting for a busy shard after
/// [`GIVE_WAY`] (its holder may be the very thread waiting, interrupted by a signal handler
/// that exits), and leaves that shard unsettled.
static WAITING_STOPPERS: AtomicU32 = AtomicU32::new(0);
/// See [`WAITING_STOPPERS`]: far longer than any live holder keeps a shard.
const GIVE_WAY: std::time::Duration = std::time::Duration::from_millis(20);

/// Takes [`STOPPER`] for `holder`; false when `holder` has it already (a nested stop), or it
/// stays held past [`PATIENCE`] (by a `fork` this very thread was preparing when a signal
/// handler interrupted it): the stop then goes on without it, as a nested one.
fn take_stopper(holder: u32) -> bool {
    if holder != FORK_HOLDER && STOPPER.held_by(holder) {
        return false;
    }
    // Those already waiting go first: a report must not wait behind a stream of stops that
    // settle frees, each thread taking its turn again as soon as it let go.
    let mut waited = Patience::new();
    while WAITING_STOPPERS.load(Ordering::SeqCst) > 0 && waited.more() {}
    WAITING_STOPPERS.fetch_add(1, Ordering::SeqCst);
    let taken = STOPPER.lock_within(holder, false);
    WAITING_STOPPERS.fetch_sub(1, Ordering::SeqCst);
    taken
}

impl StoppedWorld {
    /// Stops every owner at its next change of its shard (and waits for changes under way),
    /// then settles every queued free it can, so the lists and counters are exact unless some
    /// shard is [`unsettled`](Self::unsettled_threads). `holder` is the calling thread's number,
    /// or [`FORK_HOLDER`].
    pub fn stop(holder: u32) -> StoppedWorld {
        let cancellation = crate::sys::CancellationHeld::hold();
        let nested = !take_stopper(holder);
        let mut world = StoppedWorld {
            locked: ShardSet::default(),
            unsettled: ShardSet::default(),
            nested,
            _cancellation: cancellation,
        };
        // A fork must hold every shard it can (its child inherits them); other stops give way.
        let gives_way = holder != FORK_HOLDER;
        // In index order; nobody waits for a second shard lock while holding one otherwise.
        for (index, shard) in SHARDS.iter().enumerate() {
            // Held by this very thread: a signal handler interrupted it inside the tracker.
            let mine = holder != FORK_HOLDER && shard.lock.held_by(holder);
            if mine || !shard.lock.lock_within(holder, gives_way) {
                world.unsettled.insert(index);
                continue;
            }
            world.locked.insert(index);
            shard.revoked.store(true, Ordering::Relaxed);
        }
        crate::sys::process_barrier();
        for (index, shard) in SHARDS.iter().enumerate() {
            if world.locked.contains(index) && !shard.wait_until_idle(holder, gives_way) {
                world.unsettled.insert(index);
            }
        }
        if !settling_stopped() {
            world.settle_pending();
        }
        world
    }

    /// Whether this stop holds the world alone: not taken inside another stop.
    pub fn is_outermost(&self) -> bool {
        !self.nested
    }

    /// Whether every shard is held: no thread may be in the middle of a change.
    pub fn all_settled(&self) -> bool {
        self.unsettled.0.iter().all(|&bits| bits == 0)
    }

    /// Whether blocks of shard `index` may be taken off its list: the shard is held, and
    /// settling was not stopped for an exit from a signal handler.
    pub fn can_settle(&self, index: u8) -> bool {
        !self.unsettled.contains(index as usize) && !settling_stopped()
    }

    pub fn shards(&self) -> impl Iterator<Item = HeldShard<'static>> + '_ {
        SHARDS.iter().enumerate().map(|(index, shard)| HeldShard {
            shard,
            how: if self.unsettled.contains(index) {
                Held::Unsettled
            } else {
                Held::InStoppedWorld
            },
        })
    }

    /// The owners of the shards that could not be settled, in order, each once (0: a shard
    /// without one owner: its thread has exited, or threads share it): their lists were read
    /// as they were, which may be in the middle of a change.
    pub fn unsettled_threads(&self) -> Vec<u32> {
        let mut owners: Vec<u32> = (0..SHARD_COUNT)
            .filter(|&index| self.unsettled.contains(index))
            // A shard nobody owns reads NO_OWNER, 0.
            .map(|index| SHARDS[index].owner.load(Ordering::Relaxed))
            .collect();
        owners.sort_unstable();
        owners.dedup();
        owners
    }

    /// Takes every queued block off its list and frees it; blocks whose cookie no longer says
    /// they were claimed are skipped (a racing second free got there first, or the block was
    /// freed and reused since: a double free reported then). Queues of unsettled shards, and
    /// blocks on unsettled shards, stay queued for the next stop.
    fn settle_pending(&self) {
        for (index, queue) in SHARDS.iter().enumerate() {
            if self.unsettled.contains(index) {
                continue;
            }
            let len = queue.pending_len.load(Ordering::Relaxed) as usize;
            let mut kept = 0;
            for at in 0..len {
                // SAFETY: the world is stopped; entries below `len` were written by the owner.
                let header = unsafe { (*queue.pending())[at] };
                // SAFETY: a claimed block is ours, not yet given back, and on its shard's list.
                let shard = unsafe { (*header).shard() } as usize;
                if self.unsettled.contains(shard) {
                    // SAFETY: as above; `kept <= at`.
                    unsafe { (*queue.pending())[kept] = header };
                    kept += 1;
                    continue;
                }
                // SAFETY: the block was claimed (so it is ours and not yet given back); the
                // cookie check tells whether it still is.
                unsafe { super::settle_claimed_block(header, self) };
            }
            queue.pending_len.store(kept as u32, Ordering::Relaxed);
        }
    }

    /// The shard `index`, held (the world is stopped).
    pub fn shard(&self, index: u8) -> HeldShard<'static> {
        HeldShard {
            shard: &SHARDS[index as usize],
            how: Held::InStoppedWorld,
        }
    }

    /// After `fork`, in the child: the other threads are gone, and so is their ownership.
    pub fn forget_other_owners(&self, survivor: u32) {
        for shard in &SHARDS[GUEST_SHARDS..] {
            if shard.owner.load(Ordering::Relaxed) != survivor {
                shard.owner.store(NO_OWNER, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for StoppedWorld {
    fn drop(&mut self) {
        for (index, shard) in SHARDS.iter().enumerate() {
            if self.locked.contains(index) {
                shard.revoked.store(false, Ordering::Relaxed);
                shard.lock.unlock();
            }
        }
        if !self.nested {
            STOPPER.unlock();
        }
    }
}

impl Shard {
    /// Waits, the shard's lock held and `revoked` set, until its owner is not in the middle of
    /// a change; false when it never will be: the owner is the calling thread (interrupted by a
    /// signal handler mid-change), has exited mid-change, or does not finish within
    /// [`PATIENCE`].
    fn wait_until_idle(&self, holder: u32, gives_way: bool) -> bool {
        let mut waited = Patience::new();
        waited.gives_way = gives_way;
        while self.busy.load(Ordering::Acquire) != 0 {
            let owner = self.owner.load(Ordering::Relaxed);
            if owner == NO_OWNER || owner == holder || !waited.more() {
                return false;
            }
        }
        true
    }
}

/// A bounded spin: spins, then yields, until [`PATIENCE`] is spent.
pub(crate) struct Patience {
    spins: u32,
    since: Option<std::time::Instant>,
    /// Ends after [`GIVE_WAY`] once another thread waits to stop the world.
    gives_way: bool,
}

impl Patience {
    pub(crate) fn new() -> Self {
        Patience {
            spins: 0,
            since: None,
            gives_way: false,
        }
    }

    /// Waits a little; false once the patience is spent.
    pub(crate) fn more(&mut self) -> bool {
        self.spins += 1;
        if self.spins < 128 {
            core::hint::spin_loop();
            return true;
        }
        std::thread::yield_now();
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        let waited = since.elapsed();
        waited < PATIENCE
            && !(self.gives_way
                && waited >= GIVE_WAY
                && WAITING_STOPPERS.load(Ordering::Relaxed) > 0)
    }
}

/// `lock`, unless it stays held past the tracker's patience: by a thread that will never let go
/// (the very thread a signal handler interrupted inside it to call `exit`).
pub(crate) fn lock_within<T>(lock: &std::sync::Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    use std::sync::TryLockError;
    let mut waited = Patience::new();
    loop {
        match lock.try_lock() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) if waited.more() => {}
            Err(TryLockError::WouldBlock) => return None,
        }
    }
}

/// `lock` for code that a signal handler may run on a thread it `interrupted` inside the tracker
/// (`guard::inside()` before the caller entered it), perhaps inside this very lock: then it is
/// waited for only as long as [`lock_within`] waits (a plain wait would last forever), else as
/// any lock.
pub(crate) fn lock_unless_interrupted<T>(
    interrupted: bool,
    lock: &std::sync::Mutex<T>,
) -> Option<std::sync::MutexGuard<'_, T>> {
    if interrupted {
        lock_within(lock)
    } else {
        Some(
            lock.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// Whether any shard has queued frees to settle.
pub fn any_pending() -> bool {
    SHARDS
        .iter()
        .any(|s| s.pending_len.load(Ordering::Relaxed) > 0)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread number no real thread has.
    const INTERRUPTED: u32 = u32::MAX - 7;

    #[test]
    fn stopping_the_world_from_inside_a_change_leaves_that_shard_unsettled_instead_of_waiting() {
        // As if a signal handler ran the report while its thread held guest shard 3.
        let held = SHARDS[3].hold(INTERRUPTED, false).expect("shard 3 free");
        let world = StoppedWorld::stop(INTERRUPTED);
        assert!(!world.can_settle(3));
        assert!(world.can_settle(4));
        assert_eq!(
            world.unsettled_threads(),
            [0],
            "a guest shard has no one owner"
        );
        drop(world);
        assert!(
            SHARDS[3].lock.held_by(INTERRUPTED),
            "the world let go only of its own locks"
        );
        drop(held);
        assert!(StoppedWorld::stop(INTERRUPTED)
            .unsettled_threads()
            .is_empty());
    }
}
