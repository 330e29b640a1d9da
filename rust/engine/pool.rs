//! Pool allocator: one `System` chunk carved into per-size-class sub-chunks of equal blocks on intrusive free lists.
//!
//! Fast path (a thread with a `thread_slot` and a class of at least [`MIN_CACHED_BLOCKS`] blocks): the
//! thread's own magazine, an intrusive chain of free blocks, plus up to 7 full ones. Neither
//! alloc nor free then takes a lock or does an atomic read-modify-write (on the test machine one locked
//! instruction cost 4.5 ns, half a glibc malloc). Whole chains move between a thread and the class's shared
//! free list in O(1) under the class lock. Other threads and classes use the class lock per call. No syscall,
//! no formatting, no global allocator. A free finds its class by a branch-free scan of the sub-chunk starts.
//!
//! Trade-off: a thread holds up to [`THREAD_CACHE_BLOCKS`] free blocks per cached class, which other threads
//! cannot take, so a class can report exhaustion while another thread caches free blocks of it.

use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use super::registry::Registration;
use super::size_class::{
    natural_alignment, ClassSpec, SizeClassMap, DEFAULT_CLASSES, MAX_CLASSES, MIN_SLOT,
};
use super::slots::{Chain, ChainStack, FreeList, Slots};
use super::system_memory::{SystemBox, SystemChunk, SystemSlice};
use super::thread_slot::{self, MAX_THREADS};
use super::{
    AllocatorInfo, AllocatorKind, AllocatorStats, Counters, CreateError, EngineAllocator,
    FreeError, LiveBlock, StatsSource,
};

/// Free blocks in a magazine, and in each chain moved between a thread and its class.
const MAGAZINE: usize = 128;
/// Full magazines a thread keeps besides its current one before it gives chains back to the class. Keeping
/// them lets a thread reuse its own blocks, so two threads rarely write the same cache lines.
const SPARE_CHAINS: usize = 7;
/// Most free blocks one thread holds per class.
pub const THREAD_CACHE_BLOCKS: usize = MAGAZINE * (1 + SPARE_CHAINS);
/// Classes with fewer blocks are not cached per thread: a few threads could otherwise hold all their blocks.
pub const MIN_CACHED_BLOCKS: usize = 4 * THREAD_CACHE_BLOCKS;

/// The class table of a pool: block sizes strictly ascending, multiples of 8.
#[derive(Clone, Copy, Debug)]
pub struct PoolConfig<'a> {
    pub classes: &'a [ClassSpec],
}

impl Default for PoolConfig<'static> {
    fn default() -> Self {
        Self {
            classes: &DEFAULT_CLASSES,
        }
    }
}

/// Per-class numbers, for sizing a class table from a real run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassStats {
    pub block_size: usize,
    pub block_count: usize,
    pub live_blocks: u64,
    /// Most blocks ever out of the shared free list (live or cached in thread magazines) at once.
    pub peak_blocks: u64,
    pub failures: u64,
}

/// What the class lock protects.
struct ClassShared {
    free: FreeList,
    /// Blocks out of `free`: live, or cached in magazines.
    blocks_out: u64,
}

/// Read-mostly on the fast path; the lock and the peak, written on refills and drains, are on a line of their own.
struct SizeClass {
    spec: ClassSpec,
    /// Every block of this class is aligned to this (the chunk is laid out largest alignment first).
    block_align: usize,
    slots: Slots,
    /// Events of threads without a magazine for this class; written under the class lock.
    counters: Counters,
    locked: ClassLocked,
}

#[repr(align(64))]
struct ClassLocked {
    /// Written under the class lock, read lock-free.
    peak_blocks: AtomicU64,
    shared: Mutex<ClassShared>,
}

impl SizeClass {
    fn shared(&self) -> MutexGuard<'_, ClassShared> {
        self.locked
            .shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn take_out(&self, shared: &mut ClassShared, blocks: u64) {
        shared.blocks_out += blocks;
        if shared.blocks_out > self.locked.peak_blocks.load(Relaxed) {
            self.locked.peak_blocks.store(shared.blocks_out, Relaxed);
        }
    }
}

/// One thread slot's cache for one class, alone on its cache line so threads never write a shared one.
#[repr(align(64))]
struct ClassCache {
    /// Free blocks this thread allocates from and frees to, at most [`MAGAZINE`].
    magazine: UnsafeCell<Chain>,
    /// Full magazines kept for later, at most [`SPARE_CHAINS`].
    spares: UnsafeCell<ChainStack>,
    /// This thread's events in this class; written only by the slot's owner.
    counters: Counters,
}

// SAFETY: `magazine` is touched only by the thread that owns the cache's thread slot (see `thread_slot`).
unsafe impl Sync for ClassCache {}

impl ClassCache {
    /// A free block from the magazine, refilled when empty from a spare chain or, under the class lock, with
    /// a chain from the class.
    ///
    /// # Safety
    /// Only the owner of this cache's thread slot may call this.
    unsafe fn pop(&self, class: &SizeClass) -> Option<u32> {
        // SAFETY: the caller owns the thread slot, so nobody else touches this cache.
        let (magazine, spares) = unsafe { (&mut *self.magazine.get(), &mut *self.spares.get()) };
        if magazine.len() == 0 {
            *magazine = match class.slots.pop_chain(spares, MAGAZINE as u32) {
                Some(chain) => chain,
                None => {
                    let mut shared = class.shared();
                    let chain = class.slots.take_chain(&mut shared.free);
                    class.take_out(&mut shared, chain.len() as u64);
                    chain
                }
            };
        }
        class.slots.chain_pop(magazine)
    }

    /// Keeps a released block in the magazine; a full magazine first becomes a spare chain or, when there
    /// are enough spares, goes back to the class under its lock.
    ///
    /// # Safety
    /// As for [`ClassCache::pop`].
    unsafe fn push(&self, class: &SizeClass, index: u32) {
        // SAFETY: the caller owns the thread slot, so nobody else touches this cache.
        let (magazine, spares) = unsafe { (&mut *self.magazine.get(), &mut *self.spares.get()) };
        if magazine.len() == MAGAZINE {
            if spares.chains() < SPARE_CHAINS {
                class.slots.push_chain(spares, *magazine);
            } else {
                let mut shared = class.shared();
                class.slots.put_chain(&mut shared.free, *magazine);
                shared.blocks_out -= MAGAZINE as u64;
            }
            *magazine = Chain::EMPTY;
        }
        class.slots.chain_push(magazine, index);
    }
}

struct PoolState {
    name: &'static str,
    classes: SystemSlice<SizeClass>,
    /// Class indices ordered by sub-chunk address, for frees.
    by_address: [u8; MAX_CLASSES],
    /// Chunk offset of each sub-chunk, in address order: a small contiguous array the free path scans
    /// branch-free (a binary search over the class structs cost most of a free).
    starts: [usize; MAX_CLASSES],
    class_map: SizeClassMap,
    /// Per thread slot, one cache per class; made by the slot's owner on its first use of this pool.
    caches: [OnceLock<SystemSlice<ClassCache>>; MAX_THREADS],
    /// Requests no class can serve (too large or too aligned).
    unserved: AtomicU64,
    chunk: SystemChunk,
}

impl PoolState {
    fn class_for(&self, size: usize, align: usize) -> Option<usize> {
        if !align.is_power_of_two() {
            return None;
        }
        let first = self.class_map.class_of(size)?;
        (first..self.classes.len()).find(|&index| self.classes[index].block_align >= align)
    }

    fn class_at(&self, addr: usize) -> Result<usize, FreeError> {
        let offset = self.chunk.offset_of(addr).ok_or(FreeError::Foreign)?;
        let classes = self.classes.len();
        let before = self.starts[..classes]
            .iter()
            .filter(|&&start| start <= offset)
            .count();
        Ok(self.by_address[before - 1] as usize)
    }

    /// This thread's cache for `class`, if the class is cached and the thread has a slot (and, the first
    /// time, `System` memory for its caches).
    fn cache(&self, class: usize) -> Option<&ClassCache> {
        if self.classes[class].spec.block_count < MIN_CACHED_BLOCKS {
            return None;
        }
        let caches = &self.caches[thread_slot::current()?];
        let caches = match caches.get() {
            Some(caches) => caches,
            None => {
                let made = SystemSlice::try_from_fn(self.classes.len(), |_| {
                    let magazine = UnsafeCell::new(Chain::EMPTY);
                    let spares = UnsafeCell::new(ChainStack::EMPTY);
                    Some(ClassCache {
                        magazine,
                        spares,
                        counters: Counters::default(),
                    })
                })?;
                // Only this slot's owner sets it, so the set cannot lose a race.
                caches.get_or_init(|| made)
            }
        };
        Some(&caches[class])
    }

    fn class_counters(&self, class: usize) -> impl Iterator<Item = &Counters> {
        let cached = self
            .caches
            .iter()
            .filter_map(OnceLock::get)
            .map(move |caches| &caches[class].counters);
        std::iter::once(&self.classes[class].counters).chain(cached)
    }
}

impl StatsSource for PoolState {
    fn stats(&self) -> AllocatorStats {
        let mut stats = AllocatorStats {
            name: self.name,
            capacity: self.chunk.len() as u64,
            ..Default::default()
        };
        for (index, class) in self.classes.iter().enumerate() {
            self.class_counters(index)
                .for_each(|counters| counters.add_to(&mut stats));
            stats.peak_bytes +=
                class.locked.peak_blocks.load(Relaxed) * class.spec.block_size as u64;
        }
        stats.failures += self.unserved.load(Relaxed);
        stats
    }

    fn for_each_live_block(&self, visit: &mut dyn FnMut(LiveBlock)) {
        for class in self.classes.iter() {
            class.slots.for_each_live(visit);
        }
    }
}

/// A pool of fixed size classes in one preallocated chunk (design note 000). Thread-safe.
pub struct Pool {
    registration: Registration,
    state: SystemBox<PoolState>,
}

fn validate(classes: &[ClassSpec]) -> Result<(), CreateError> {
    if classes.is_empty() || classes.len() > MAX_CLASSES {
        return Err(CreateError::InvalidConfig(
            "a pool needs 1 to 64 size classes",
        ));
    }
    if classes
        .iter()
        .any(|class| class.block_size < MIN_SLOT || class.block_size % MIN_SLOT != 0)
    {
        return Err(CreateError::InvalidConfig(
            "block sizes must be non-zero multiples of 8",
        ));
    }
    if classes
        .iter()
        .any(|class| class.block_count == 0 || class.block_count >= u32::MAX as usize)
    {
        return Err(CreateError::InvalidConfig(
            "block counts must be between 1 and 2^32 - 2",
        ));
    }
    if classes
        .windows(2)
        .any(|pair| pair[0].block_size >= pair[1].block_size)
    {
        return Err(CreateError::InvalidConfig(
            "block sizes must be strictly ascending",
        ));
    }
    Ok(())
}

impl Pool {
    /// Acquires the whole chunk from `System` and carves it into the classes of `config`.
    pub fn new(name: &'static str, config: PoolConfig<'_>) -> Result<Self, CreateError> {
        let specs = config.classes;
        validate(specs)?;
        let mut by_address = [0u8; MAX_CLASSES];
        for (slot, index) in by_address.iter_mut().zip(0..specs.len() as u8) {
            *slot = index;
        }
        // Largest alignment first: every later sub-chunk then starts aligned for its own blocks.
        by_address[..specs.len()].sort_by_key(|&index| {
            std::cmp::Reverse(natural_alignment(specs[index as usize].block_size))
        });
        let (mut offsets, mut starts) = ([0usize; MAX_CLASSES], [0usize; MAX_CLASSES]);
        let mut total = 0usize;
        for (position, &index) in by_address[..specs.len()].iter().enumerate() {
            let spec = specs[index as usize];
            offsets[index as usize] = total;
            starts[position] = total;
            let bytes = spec.block_size.checked_mul(spec.block_count);
            total = bytes
                .and_then(|bytes| total.checked_add(bytes))
                .ok_or(CreateError::InvalidConfig("pool too large"))?;
        }
        let chunk_align = natural_alignment(specs[by_address[0] as usize].block_size);
        let chunk = SystemChunk::zeroed(total, chunk_align).ok_or(CreateError::OutOfMemory)?;
        let classes = SystemSlice::try_from_fn(specs.len(), |index| {
            let spec = specs[index];
            let base = chunk.base().wrapping_add(offsets[index]);
            Some(SizeClass {
                spec,
                block_align: natural_alignment(spec.block_size),
                slots: Slots::new(base, spec.block_size, spec.block_count)?,
                counters: Counters::default(),
                locked: ClassLocked {
                    peak_blocks: AtomicU64::new(0),
                    shared: Mutex::new(ClassShared {
                        free: FreeList::new(MAGAZINE as u32),
                        blocks_out: 0,
                    }),
                },
            })
        })
        .ok_or(CreateError::OutOfMemory)?;
        let state = PoolState {
            name,
            classes,
            by_address,
            starts,
            class_map: SizeClassMap::new(specs.iter().map(|spec| spec.block_size)),
            caches: [const { OnceLock::new() }; MAX_THREADS],
            unserved: AtomicU64::new(0),
            chunk,
        };
        let state = SystemBox::new(state).ok_or(CreateError::OutOfMemory)?;
        let source: &dyn StatsSource = &*state;
        // SAFETY: `state` lives in `System` memory at a stable address and outlives `registration`
        // (fields drop in declaration order).
        let registration = unsafe { Registration::new(name, AllocatorKind::Pool, None, source) }?;
        registration.add_range(state.chunk.base() as usize, state.chunk.len())?;
        Ok(Self {
            registration,
            state,
        })
    }

    /// A block of at least `size` bytes aligned to `align` (a power of two) from the smallest class that
    /// fits, or `None` when no class fits or the class is exhausted (counted as a failure).
    pub fn alloc(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        self.alloc_tagged(size, align, 0)
    }

    /// [`Pool::alloc`] that records `tag` (the tracker's) with the block.
    pub fn alloc_tagged(&self, size: usize, align: usize, tag: u32) -> Option<NonNull<u8>> {
        let state = &*self.state;
        let Some(class_index) = state.class_for(size, align) else {
            state.unserved.fetch_add(1, Relaxed);
            return None;
        };
        let class = &state.classes[class_index];
        let index = match state.cache(class_index) {
            Some(cache) => {
                // SAFETY: `state.cache` returned the cache of this thread's own slot.
                let index = unsafe { cache.pop(class) };
                record_alloc(&cache.counters, index, size)?
            }
            None => {
                let mut shared = class.shared();
                let index = class.slots.pop(&mut shared.free);
                if index.is_some() {
                    class.take_out(&mut shared, 1);
                }
                record_alloc(&class.counters, index, size)?
            }
        };
        NonNull::new(class.slots.claim(index, size, tag))
    }

    /// Returns a block to its class. Refuses pointers outside the pool (`Foreign`), off a block start
    /// (`Interior`) and blocks already free (`DoubleFree`), changing nothing.
    pub fn free(&self, ptr: *mut u8) -> Result<(), FreeError> {
        let state = &*self.state;
        let class_index = state.class_at(ptr as usize)?;
        let class = &state.classes[class_index];
        let index = class.slots.index_of(ptr as usize)?;
        let size = class.slots.release(index)? as u64;
        match state.cache(class_index) {
            Some(cache) => {
                // SAFETY: `state.cache` returned the cache of this thread's own slot.
                unsafe { cache.push(class, index) };
                cache.counters.record_frees(1, size);
            }
            None => {
                let mut shared = class.shared();
                class.slots.push(&mut shared.free, index);
                shared.blocks_out -= 1;
                class.counters.record_frees(1, size);
            }
        }
        Ok(())
    }

    /// Per-class counters, in ascending block size.
    pub fn class_stats(&self) -> Vec<ClassStats> {
        let state = &*self.state;
        let mut all = Vec::with_capacity(state.classes.len());
        for (index, class) in state.classes.iter().enumerate() {
            let mut stats = AllocatorStats::default();
            state
                .class_counters(index)
                .for_each(|counters| counters.add_to(&mut stats));
            all.push(ClassStats {
                block_size: class.spec.block_size,
                block_count: class.spec.block_count,
                live_blocks: stats.live_blocks,
                peak_blocks: class.locked.peak_blocks.load(Relaxed),
                failures: stats.failures,
            });
        }
        all
    }
}

/// Counts an allocation (or its failure) in the counters of whoever served it; passes the block through.
fn record_alloc(counters: &Counters, index: Option<u32>, size: usize) -> Option<u32> {
    match index {
        Some(_) => counters.record_alloc(size),
        None => counters.record_failure(),
    }
    index
}

impl EngineAllocator for Pool {
    fn info(&self) -> AllocatorInfo {
        self.registration.info()
    }

    fn stats(&self) -> AllocatorStats {
        self.state.stats()
    }

    fn for_each_live_block(&self, visit: &mut dyn FnMut(LiveBlock)) {
        self.state.for_each_live_block(visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::test_support::{assert_disjoint, Rng};
    use crate::engine::{allocator_of, checkpoint};

    const SMALL: [ClassSpec; 3] = [
        ClassSpec {
            block_size: 16,
            block_count: 4,
        },
        ClassSpec {
            block_size: 48,
            block_count: 3,
        },
        ClassSpec {
            block_size: 256,
            block_count: 2,
        },
    ];

    fn small_pool() -> Pool {
        Pool::new("small", PoolConfig { classes: &SMALL }).unwrap()
    }

    #[test]
    fn serves_the_smallest_fitting_class_until_it_is_empty() {
        let pool = small_pool();
        let blocks: Vec<_> = (0..4).map(|_| pool.alloc(10, 8).unwrap()).collect();
        assert!(pool.alloc(16, 8).is_none(), "class of 16 is exhausted");
        assert!(
            pool.alloc(17, 8).is_some(),
            "the 48-byte class still serves"
        );
        assert!(pool.alloc(257, 8).is_none(), "no class holds 257 bytes");
        let stats = pool.stats();
        assert_eq!(
            (
                stats.allocations,
                stats.failures,
                stats.live_blocks,
                stats.live_bytes
            ),
            (5, 2, 5, 57)
        );
        for block in blocks {
            pool.free(block.as_ptr()).unwrap();
        }
        assert_eq!(pool.class_stats()[0].live_blocks, 0);
        assert_eq!(pool.class_stats()[0].peak_blocks, 4);
        assert_eq!(pool.stats().peak_bytes, 4 * 16 + 48);
    }

    #[test]
    fn alignment_up_to_the_block_size() {
        let pool = small_pool();
        let block = pool.alloc(8, 256).unwrap();
        assert_eq!(block.as_ptr() as usize % 256, 0);
        assert_eq!(pool.stats().capacity, 16 * 4 + 48 * 3 + 256 * 2);
        assert!(pool.alloc(8, 512).is_none());
        assert!(pool.alloc(8, 3).is_none());
        let default_pool = Pool::new("default", PoolConfig::default()).unwrap();
        for class in DEFAULT_CLASSES {
            let block = default_pool
                .alloc(class.block_size, class.block_size)
                .unwrap();
            assert_eq!(block.as_ptr() as usize % class.block_size, 0);
        }
    }

    #[test]
    fn bad_frees_are_refused_and_change_nothing() {
        let pool = small_pool();
        let block = pool.alloc(40, 16).unwrap().as_ptr();
        let before = pool.stats();
        let mut outside = 0u64;
        assert_eq!(
            pool.free(&mut outside as *mut u64 as *mut u8),
            Err(FreeError::Foreign)
        );
        assert_eq!(pool.free(std::ptr::null_mut()), Err(FreeError::Foreign));
        assert_eq!(pool.free(block.wrapping_add(8)), Err(FreeError::Interior));
        let never_handed_out = block.wrapping_add(48);
        assert_eq!(pool.free(never_handed_out), Err(FreeError::DoubleFree));
        assert_eq!(pool.stats(), before);
        pool.free(block).unwrap();
        assert_eq!(pool.free(block), Err(FreeError::DoubleFree));
        let after = pool.stats();
        assert_eq!((after.frees, after.live_blocks), (1, 0));
        let again: Vec<_> = (0..3).map(|_| pool.alloc(40, 16).unwrap()).collect();
        assert!(again
            .iter()
            .all(|block| allocator_of(block.as_ptr()).unwrap().name == "small"));
    }

    #[test]
    fn leaks_since_a_checkpoint() {
        let pool = small_pool();
        let old = pool.alloc(16, 8).unwrap();
        let mark = checkpoint();
        let new = pool.alloc_tagged(100, 8, 7).unwrap();
        let leaks = pool.leaks_since(mark);
        assert_eq!(leaks.len(), 1);
        assert_eq!(
            (leaks[0].address, leaks[0].size, leaks[0].tag),
            (new.as_ptr() as usize, 100, 7)
        );
        assert_eq!(
            pool.leaks()
                .iter()
                .map(|leak| leak.address)
                .collect::<Vec<_>>(),
            [old, new].map(|b| b.as_ptr() as usize)
        );
    }

    /// Random alloc/free against a model of per-class occupancy; `alloc_percent` > 50 drifts into exhaustion.
    fn check_against_model(classes: &[ClassSpec], alloc_percent: u64, seed: u64) {
        let pool = Pool::new("model", PoolConfig { classes }).unwrap();
        let mut rng = Rng::new(seed);
        // Model: (address, size, class) of each live block.
        let mut live: Vec<(usize, usize, usize)> = Vec::new();
        let (mut allocations, mut failures) = (0u64, 0u64);
        for _ in 0..20_000 {
            if live.is_empty() || rng.next() % 100 < alloc_percent {
                let size = rng.range(1, 300);
                let align: usize = 1 << rng.range(0, 5);
                let class = classes
                    .iter()
                    .position(|c| c.block_size >= size && natural_alignment(c.block_size) >= align);
                let expect_block = class.is_some_and(|c| {
                    live.iter().filter(|block| block.2 == c).count() < classes[c].block_count
                });
                let block = pool.alloc(size, align);
                assert_eq!(block.is_some(), expect_block);
                match block {
                    Some(block) => {
                        assert_eq!(block.as_ptr() as usize % align, 0);
                        allocations += 1;
                        live.push((block.as_ptr() as usize, size, class.unwrap()));
                    }
                    None => failures += 1,
                }
            } else {
                let (address, _, _) = live.swap_remove(rng.range(0, live.len() - 1));
                pool.free(address as *mut u8).unwrap();
            }
            let stats = pool.stats();
            assert_eq!(stats.live_blocks, live.len() as u64);
            assert_eq!(
                stats.live_bytes,
                live.iter().map(|block| block.1 as u64).sum::<u64>()
            );
            assert_eq!((stats.allocations, stats.failures), (allocations, failures));
        }
        assert!(failures > 0, "the run reaches class exhaustion");
        let block_size =
            |address| classes[live.iter().find(|block| block.0 == address).unwrap().2].block_size;
        let mut blocks: Vec<_> = pool
            .leaks()
            .iter()
            .map(|leak| (leak.address, block_size(leak.address)))
            .collect();
        assert_eq!(blocks.len(), live.len());
        assert_disjoint(&mut blocks);
    }

    #[test]
    fn random_sequences_match_a_model() {
        check_against_model(&SMALL, 50, 0x5EED);
    }

    #[test]
    fn random_sequences_through_thread_magazines_match_a_model() {
        let classes = [
            ClassSpec {
                block_size: 64,
                block_count: MIN_CACHED_BLOCKS,
            },
            ClassSpec {
                block_size: 320,
                block_count: MIN_CACHED_BLOCKS + 5,
            },
        ];
        check_against_model(&classes, 75, 11);
    }

    #[test]
    fn threads_allocate_and_free_each_others_blocks() {
        let pool = Pool::new("threads", PoolConfig::default()).unwrap();
        let (sender, receiver) = std::sync::mpsc::sync_channel::<usize>(64);
        std::thread::scope(|scope| {
            let pool = &pool;
            scope.spawn(move || {
                let mut rng = Rng::new(1);
                for _ in 0..50_000 {
                    let block = pool.alloc(rng.range(16, 256), 8).unwrap();
                    sender.send(block.as_ptr() as usize).unwrap();
                }
            });
            scope.spawn(move || {
                let mut rng = Rng::new(2);
                for address in receiver {
                    pool.free(address as *mut u8).unwrap();
                    let own = pool.alloc(rng.range(16, 256), 8).unwrap();
                    pool.free(own.as_ptr()).unwrap();
                }
            });
        });
        let stats = pool.stats();
        assert_eq!(
            (
                stats.allocations,
                stats.frees,
                stats.live_blocks,
                stats.live_bytes,
                stats.failures
            ),
            (100_000, 100_000, 0, 0, 0)
        );
    }
}
