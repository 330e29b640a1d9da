//! Game-engine allocators (pool, stack, block, typed pools) with statistics, checkpoints and a pointer registry.
//!
//! Every allocator takes its memory from `std::alloc::System`, never from the global allocator (which may be
//! the tracker itself). Frees return a [`FreeError`] instead of printing, so the tracker can turn it into a
//! report entry. Each block carries a 12-byte record ([`LiveBlock`] without the address): its requested size,
//! the [`checkpoint`] epoch it was allocated in, and a `tag` the tracker owns (`alloc_tagged`; e.g. a stack id
//! or an index into the tracker's own records).

/// `EngineAllocator` for an allocator with a `registration` and a registered shared part
/// (`$shared`, a `StatsSource`) that holds its counters and live blocks.
macro_rules! registered_allocator {
    ($allocator:ty, $shared:ident) => {
        impl $crate::engine::EngineAllocator for $allocator {
            fn info(&self) -> $crate::engine::AllocatorInfo {
                self.registration.info()
            }

            fn stats(&self) -> $crate::engine::AllocatorStats {
                $crate::engine::StatsSource::stats(&*self.$shared)
            }

            fn for_each_live_block(
                &self,
                visit: &mut dyn FnMut($crate::engine::LiveBlock),
            ) -> Result<(), $crate::engine::Busy> {
                $crate::engine::StatsSource::for_each_live_block(&*self.$shared, visit)
            }
        }
    };
}

pub mod block;
pub mod client_pools;
mod names;
pub mod pool;
mod registry;
pub mod size_class;
mod slots;
pub mod stack;
mod system_memory;
#[cfg(test)]
pub(crate) mod test_support;
mod thread_slot;
mod tracked;
pub mod typed_pool;

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};

pub use block::{BlockAllocator, FreeSpace};
pub(crate) use client_pools::lock_for_fork as lock_client_pools_for_fork;
pub(crate) use names::lock_for_fork as lock_names_for_fork;
pub use names::{c_name, static_name};
pub use pool::{Pool, PoolConfig};
pub(crate) use registry::address_table_range;
pub(crate) use registry::hold_for_fork as hold_registry_for_fork;
pub use registry::{
    allocator_of, for_each_live_block, leaks_since, memstats, type_of, AllocatorLeaks, MemStats,
};
pub use size_class::ClassSpec;
pub use stack::{StackAllocator, StackMarker, StackScope};
pub(crate) use tracked::lock_tags_for_fork;
pub use tracked::{any_tracked_allocator_created, block_tags, TrackedAllocator};
pub use typed_pool::{ObjectPool, PoolBox, TypedPool};

/// Which kind of engine allocator served a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllocatorKind {
    Pool,
    Stack,
    Block,
    TypedPool,
}

/// Identity of one allocator instance, carried by lookups and reports (foonathan's `allocator_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatorInfo {
    /// Unique per allocator instance for the life of the process.
    pub id: u32,
    pub name: &'static str,
    pub kind: AllocatorKind,
    /// `std::any::type_name` of the element type, for typed pools only.
    pub element_type: Option<&'static str>,
}

/// Counters of one allocator. Bytes are the sizes callers asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    pub name: &'static str,
    /// Bytes of memory the allocator manages (its chunk, arena or batches).
    pub capacity: u64,
    pub live_blocks: u64,
    pub live_bytes: u64,
    /// High-water mark of `live_bytes`. For a [`Pool`]: per class, the most blocks ever out of its shared
    /// free list (live or cached by threads) times the block size, summed over classes.
    pub peak_bytes: u64,
    pub allocations: u64,
    pub frees: u64,
    /// Allocation requests that returned `None`.
    pub failures: u64,
}

/// Why a free (or a stack rewind) was refused. The allocator and its counts are unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FreeError {
    /// The pointer (or marker) does not belong to this allocator.
    Foreign,
    /// The pointer lies inside this allocator's memory but is not the start of a block.
    Interior,
    /// The block was already freed.
    DoubleFree,
    /// A stack block or marker freed out of LIFO order.
    OutOfOrder,
}

impl FreeError {
    /// What was wrong, in words (the report's `detail`).
    pub fn describe(self) -> &'static str {
        match self {
            FreeError::Foreign => "pointer not owned by this allocator",
            FreeError::Interior => "pointer inside a block, not at its start",
            FreeError::DoubleFree => "block already freed",
            FreeError::OutOfOrder => "stack block freed out of LIFO order",
        }
    }
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

impl std::error::Error for FreeError {}

/// Why an allocator could not be created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateError {
    /// `System` could not provide the memory.
    OutOfMemory,
    /// The configuration is unusable; the text says which rule it breaks.
    InvalidConfig(&'static str),
    /// The pointer registry has no room for another allocator or address range.
    RegistryFull,
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::OutOfMemory => f.write_str("out of memory"),
            CreateError::InvalidConfig(rule) => {
                write!(f, "invalid allocator configuration: {rule}")
            }
            CreateError::RegistryFull => f.write_str("allocator registry full"),
        }
    }
}

impl std::error::Error for CreateError {}

/// One live block, as listed by [`EngineAllocator::leaks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    pub address: usize,
    /// The size the caller asked for.
    pub size: usize,
    /// The [`checkpoint`] epoch the block was allocated in.
    pub epoch: u32,
    /// The caller's tag from `alloc_tagged` (the tracker's stack id), 0 otherwise.
    pub tag: u32,
}

/// The start of an epoch: blocks allocated after [`checkpoint`] returned it belong to it or a later one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Checkpoint(u32);

impl Checkpoint {
    /// Before the first allocation of the process.
    pub const ORIGIN: Checkpoint = Checkpoint(0);

    /// The epoch number, to hand a checkpoint across the C++ bridge and back ([`Checkpoint::from_epoch`]).
    pub fn epoch(self) -> u32 {
        self.0
    }

    pub fn from_epoch(epoch: u32) -> Checkpoint {
        Checkpoint(epoch)
    }
}

/// Bumped by each checkpoint; allocations only read it (no read-modify-write on the fast path).
static EPOCH: AtomicU32 = AtomicU32::new(0);

/// Starts a new epoch shared by all engine allocators. Allocations of the calling thread that follow are in
/// it; those of other threads are once they observe it (they may race with this call).
pub fn checkpoint() -> Checkpoint {
    Checkpoint(EPOCH.fetch_add(1, Relaxed) + 1)
}

/// What every engine allocator offers besides its own `alloc`/`free`.
pub trait EngineAllocator {
    fn info(&self) -> AllocatorInfo;

    /// A snapshot of the counters; takes no allocator lock.
    fn stats(&self) -> AllocatorStats;

    /// Calls `visit` for every live block, in no particular order, possibly while holding the allocator's
    /// lock: `visit` must not call back into this allocator. [`Busy`] if that lock stayed held.
    fn for_each_live_block(&self, visit: &mut dyn FnMut(LiveBlock)) -> Result<(), Busy>;

    /// Live blocks allocated since `since`, by epoch, then by address (none if the allocator
    /// stayed [`Busy`]).
    fn leaks_since(&self, since: Checkpoint) -> Vec<LiveBlock> {
        let mut blocks = Vec::new();
        let _ = self.for_each_live_block(&mut |block| {
            if block.epoch >= since.0 {
                blocks.push(block);
            }
        });
        blocks.sort_by_key(|block| (block.epoch, block.address));
        blocks
    }

    /// All live blocks, by epoch, then by address (call at shutdown).
    fn leaks(&self) -> Vec<LiveBlock> {
        self.leaks_since(Checkpoint::ORIGIN)
    }
}

/// The per-block record in a stack or block allocator header (pools keep it in a side array of atomics).
#[derive(Clone, Copy, Debug, Default)]
struct BlockMeta {
    epoch: u32,
    size: u32,
    tag: u32,
}

impl BlockMeta {
    #[inline]
    fn new(size: usize, tag: u32) -> Self {
        Self {
            epoch: EPOCH.load(Relaxed),
            size: size as u32,
            tag,
        }
    }

    fn live_block(&self, address: usize) -> LiveBlock {
        LiveBlock {
            address,
            size: self.size as usize,
            epoch: self.epoch,
            tag: self.tag,
        }
    }
}

/// Counters of one allocator (or one pool class). Written only by the holder of that allocator's lock
/// (or `&mut`), so plain load/store suffices; read lock-free by `stats()` and the registry.
#[derive(Default)]
struct Counters {
    live_blocks: AtomicU64,
    live_bytes: AtomicU64,
    peak_bytes: AtomicU64,
    allocations: AtomicU64,
    frees: AtomicU64,
    failures: AtomicU64,
}

#[inline]
fn add_relaxed(counter: &AtomicU64, amount: u64) -> u64 {
    let value = counter.load(Relaxed).wrapping_add(amount);
    counter.store(value, Relaxed);
    value
}

impl Counters {
    fn record_alloc(&self, bytes: usize) {
        add_relaxed(&self.allocations, 1);
        add_relaxed(&self.live_blocks, 1);
        let live = add_relaxed(&self.live_bytes, bytes as u64);
        if live > self.peak_bytes.load(Relaxed) {
            self.peak_bytes.store(live, Relaxed);
        }
    }

    fn record_frees(&self, blocks: u64, bytes: u64) {
        add_relaxed(&self.frees, blocks);
        add_relaxed(&self.live_blocks, blocks.wrapping_neg());
        add_relaxed(&self.live_bytes, bytes.wrapping_neg());
    }

    fn peak_bytes(&self) -> u64 {
        self.peak_bytes.load(Relaxed)
    }

    fn record_failure(&self) {
        add_relaxed(&self.failures, 1);
    }

    /// Adds these counters into `stats`, all but the peak (peaks of parts do not add up to a peak).
    fn add_to(&self, stats: &mut AllocatorStats) {
        // Wrapping: a thread cache that only frees has "negative" live counts; the sums come out right.
        stats.live_blocks = stats
            .live_blocks
            .wrapping_add(self.live_blocks.load(Relaxed));
        stats.live_bytes = stats.live_bytes.wrapping_add(self.live_bytes.load(Relaxed));
        stats.allocations += self.allocations.load(Relaxed);
        stats.frees += self.frees.load(Relaxed);
        stats.failures += self.failures.load(Relaxed);
    }
}

/// `value` rounded up to `align`, a power of two (a mask, where `next_multiple_of` divides).
fn align_up(value: usize, align: usize) -> Option<usize> {
    debug_assert!(align.is_power_of_two());
    Some(value.checked_add(align - 1)? & !(align - 1))
}

/// What the registry reads of an allocator: its counters (lock-free, for [`memstats`]) and its live blocks
/// (for the leak report and [`leaks_since`]).
trait StatsSource: Sync {
    fn stats(&self) -> AllocatorStats;

    /// As [`EngineAllocator::for_each_live_block`].
    fn for_each_live_block(&self, visit: &mut dyn FnMut(LiveBlock)) -> Result<(), Busy>;

    /// Takes the allocator's locks for a `fork` (see `tracker::fork`), into `held`. Only for a
    /// source in the registry, whose lock is held until these are let go.
    fn hold_for_fork(&self, held: &mut Vec<ForkHold>);
}

/// A lock held across `fork`, so that the child never finds it held by a thread it does not
/// have (`tracker::fork`).
pub(crate) type ForkHold = Box<dyn std::any::Any>;

/// Locks `lock` for the time of a `fork`.
///
/// # Safety
/// `lock` outlives the hold: the caller lets go of the hold first (the registry's lock, held
/// until then, keeps a registered allocator alive).
unsafe fn hold_for_fork<T: 'static>(lock: &Mutex<T>) -> ForkHold {
    let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
    // SAFETY: guaranteed by the caller; the guard is only ever dropped.
    Box::new(unsafe { core::mem::transmute::<MutexGuard<'_, T>, MutexGuard<'static, T>>(guard) })
}

/// A walk of live blocks found an allocator's lock held past the tracker's patience: by the
/// very thread that a signal handler interrupted inside the allocator to call `exit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Busy;

/// `lock` for a walk of live blocks, so that the report at exit never hangs on an allocator
/// lock (see `tracker::live_list::lock_within`).
fn lock_for_walk<T>(lock: &Mutex<T>) -> Result<MutexGuard<'_, T>, Busy> {
    crate::tracker::live_list::lock_within(lock).ok_or(Busy)
}
