//! Pool allocator: one `System` chunk carved into per-size-class sub-chunks of equal blocks on intrusive free lists.
//!
//! Fast path (a thread with a `thread_slot` and a class of at least [`MIN_CACHED_BLOCKS`] blocks): the
//! thread's own magazine, a plain array of up to [`THREAD_CACHE_BLOCKS`] free block indices with a count,
//! next to a copy of where the class's blocks and records are. Neither alloc nor free then takes a lock or
//! does an atomic read-modify-write (on the test machine one locked instruction cost 4.5 ns, half a glibc
//! malloc); each touches the thread's magazine line, the block's 16-byte record and the array slot, and
//! finds its class by a table lookup, by size (alloc) or by address (free). Chains of
//! [`MAGAZINE`] blocks move between a magazine and the class's shared free list under the class lock. Other
//! threads and classes use the class lock per call. No syscall, no formatting, no global allocator.
//!
//! Trade-off: a thread holds up to [`THREAD_CACHE_BLOCKS`] free blocks per cached class, which other threads
//! cannot take, so a class can report exhaustion while another thread caches free blocks of it; and each
//! thread that uses a pool keeps `4 * THREAD_CACHE_BLOCKS` bytes of indices per cached class.

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicPtr, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use super::registry::Registration;
use super::size_class::{
    natural_alignment, ClassSpec, SizeClassMap, DEFAULT_CLASSES, MAX_CLASSES, MIN_SLOT,
};
use super::slots::{Chain, FreeList, Slots, SlotsView};
use super::system_memory::{SystemBox, SystemChunk, SystemSlice};
use super::thread_slot::{self, MAX_THREADS};
use super::{
    add_relaxed, AllocatorKind, AllocatorStats, Busy, Counters, CreateError, FreeError, LiveBlock,
    StatsSource,
};
use super::{hold_for_fork, ForkHold};

/// Blocks in each chain moved between a magazine and its class.
pub const MAGAZINE: usize = 128;
/// Most free blocks one thread holds per class. Keeping many lets a thread reuse its own blocks, so two
/// threads rarely write the same cache lines.
pub const THREAD_CACHE_BLOCKS: usize = 8 * MAGAZINE;
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

/// Read-mostly; the lock and the peak, written on refills and drains, are on a line of their own.
struct SizeClass {
    spec: ClassSpec,
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

    /// One block under the class lock, for callers without a magazine; counts the allocation or failure.
    fn alloc_locked(&self, size: usize, tag: u32) -> Option<NonNull<u8>> {
        let mut shared = self.shared();
        let Some(index) = self.slots.pop(&mut shared.free) else {
            self.counters.record_failure();
            return None;
        };
        self.take_out(&mut shared, 1);
        self.counters.record_alloc(size);
        NonNull::new(self.slots.claim(index, size, tag))
    }

    /// Returns a released block under the class lock, for callers without a magazine.
    fn free_locked(&self, index: u32, size: usize) {
        let mut shared = self.shared();
        self.slots.push(&mut shared.free, index);
        shared.blocks_out -= 1;
        self.counters.record_frees(1, size as u64);
    }
}

/// One thread slot's magazine for one class: exactly one cache line, so threads never write a shared one
/// and the fast path reads nothing else of the class.
#[repr(C, align(64))]
struct ClassCache {
    /// Free blocks held: `items[..count]`.
    count: Cell<u32>,
    /// Length of `items`: [`THREAD_CACHE_BLOCKS`], or 0 for a class not cached per thread (every call then
    /// takes the slow path, which uses the class lock).
    capacity: u32,
    items: *mut u32,
    slots: SlotsView,
    /// This thread's events in this class; written only by the slot's owner. Live blocks are
    /// `allocations - frees`.
    allocations: AtomicU64,
    frees: AtomicU64,
    live_bytes: AtomicU64,
}

// SAFETY: `count` and the `items` array are touched only by the thread that owns the cache's thread slot
// (see `thread_slot`); other threads only read the atomic counters. `items` points into the `ThreadCaches`
// that owns this cache.
unsafe impl Sync for ClassCache {}
// SAFETY: as above; the cache holds no thread-bound data.
unsafe impl Send for ClassCache {}

impl ClassCache {
    /// A block of `size` bytes aligned to `align` from the magazine, or `None` (changing nothing) when the
    /// magazine is empty or the class's blocks are not aligned enough.
    ///
    /// # Safety
    /// Only the owner of this cache's thread slot may call this.
    #[inline]
    unsafe fn alloc(&self, size: usize, align: usize, tag: u32) -> Option<NonNull<u8>> {
        if self.count.get() == 0 || align > self.slots.slot_align() || !align.is_power_of_two() {
            return None;
        }
        // SAFETY: the caller owns the slot and the magazine is not empty.
        Some(unsafe { self.pop_claim(size, tag) })
    }

    /// Takes the top block of a non-empty magazine and hands it out.
    ///
    /// # Safety
    /// As for [`ClassCache::alloc`], and `count > 0`.
    #[inline]
    unsafe fn pop_claim(&self, size: usize, tag: u32) -> NonNull<u8> {
        let count = self.count.get() - 1;
        self.count.set(count);
        // SAFETY: `count < capacity`, the length of `items`; only the owner touches the array. Every index
        // in a magazine is a free slot of this class that the magazine holds.
        let block = unsafe {
            let index = self.items.add(count as usize).read();
            self.slots.claim(index, size, tag)
        };
        add_relaxed(&self.allocations, 1);
        add_relaxed(&self.live_bytes, size as u64);
        // SAFETY: slot addresses lie in the pool's chunk, never null.
        unsafe { NonNull::new_unchecked(block) }
    }

    /// Frees the block `offset` bytes into the class's sub-chunk: `Interior` off a block start, `DoubleFree`
    /// for a free one. A full magazine first hands a chain back to the class.
    ///
    /// # Safety
    /// As for [`ClassCache::alloc`], and `offset` lies inside this class's sub-chunk.
    #[inline]
    unsafe fn free(&self, state: &PoolState, class: usize, offset: usize) -> Result<(), FreeError> {
        let index = self.slots.index_at(offset)?;
        // SAFETY: `offset` lies inside the sub-chunk, so `index` is below the block count.
        let size = unsafe { self.slots.release(index) }?;
        let count = self.count.get();
        if count == self.capacity {
            // SAFETY: the caller owns the slot; `index` was just released.
            return unsafe { self.free_full(&state.classes[class], index, size) };
        }
        // SAFETY: `count < capacity`; only the owner touches the array.
        unsafe { self.items.add(count as usize).write(index) };
        self.count.set(count + 1);
        add_relaxed(&self.frees, 1);
        add_relaxed(&self.live_bytes, (size as u64).wrapping_neg());
        Ok(())
    }

    /// Refills an empty magazine with a chain from the class; false (counted as a failure) when the class has
    /// no free block.
    ///
    /// # Safety
    /// As for [`ClassCache::alloc`], and `capacity > 0`.
    #[cold]
    #[inline(never)]
    unsafe fn refill(&self, class: &SizeClass) -> bool {
        let mut chain = {
            let mut shared = class.shared();
            let chain = class.slots.take_chain(&mut shared.free);
            if chain.len() == 0 {
                class.counters.record_failure();
                return false;
            }
            class.take_out(&mut shared, chain.len() as u64);
            chain
        };
        let count = chain.len();
        for at in (0..count).rev() {
            let index = class.slots.chain_pop(&mut chain);
            // SAFETY: `at < MAGAZINE <= capacity`; only the owner touches the array. The chain is ours.
            unsafe { self.items.add(at).write(index.unwrap_or_default()) };
        }
        self.count.set(count as u32);
        true
    }

    /// Frees released block `index` when the magazine is full (a chain goes back to the class first) or the
    /// class is not cached (it goes back under the class lock).
    ///
    /// # Safety
    /// As for [`ClassCache::alloc`].
    #[cold]
    #[inline(never)]
    unsafe fn free_full(
        &self,
        class: &SizeClass,
        index: u32,
        size: usize,
    ) -> Result<(), FreeError> {
        if self.capacity == 0 {
            class.free_locked(index, size);
            return Ok(());
        }
        let keep = self.capacity as usize - MAGAZINE;
        let mut chain = Chain::EMPTY;
        for at in keep..self.capacity as usize {
            // SAFETY: `at < capacity`; only the owner touches the array.
            class
                .slots
                .chain_push(&mut chain, unsafe { self.items.add(at).read() });
        }
        {
            let mut shared = class.shared();
            class.slots.put_chain(&mut shared.free, chain);
            shared.blocks_out -= MAGAZINE as u64;
        }
        // SAFETY: `keep < capacity`; only the owner touches the array.
        unsafe { self.items.add(keep).write(index) };
        self.count.set(keep as u32 + 1);
        add_relaxed(&self.frees, 1);
        add_relaxed(&self.live_bytes, (size as u64).wrapping_neg());
        Ok(())
    }

    /// Adds this thread's counts into `stats`.
    fn add_to(&self, stats: &mut AllocatorStats) {
        let (allocations, frees) = (self.allocations.load(Relaxed), self.frees.load(Relaxed));
        // Wrapping: a thread that only frees has "negative" live counts; the sums come out right.
        stats.live_blocks = stats
            .live_blocks
            .wrapping_add(allocations.wrapping_sub(frees));
        stats.live_bytes = stats.live_bytes.wrapping_add(self.live_bytes.load(Relaxed));
        stats.allocations += allocations;
        stats.frees += frees;
    }
}

/// One thread slot's magazines in one pool, one per class.
struct ThreadCaches {
    classes: SystemSlice<ClassCache>,
    /// The cached classes' index arrays, [`THREAD_CACHE_BLOCKS`] each; `None` when no class is cached.
    _items: Option<SystemSlice<u32>>,
}

/// Entries of a pool's page table.
const PAGES: usize = 1024;
/// A page-table entry for a page that holds blocks of two or more classes.
const MIXED_PAGE: u8 = u8::MAX;

/// The class whose sub-chunk holds chunk offset `offset`, from the sub-chunk starts in address order (the
/// first is 0) and the class index at each.
fn class_scan(starts: &[usize], by_address: &[u8], offset: usize) -> usize {
    let before = starts.iter().filter(|&&start| start <= offset).count();
    by_address[before - 1] as usize
}

struct PoolState {
    name: &'static str,
    classes: SystemSlice<SizeClass>,
    /// Class indices ordered by sub-chunk address, for frees.
    by_address: [u8; MAX_CLASSES],
    /// Chunk offset of each sub-chunk, in address order, scanned for addresses in pages of mixed classes.
    starts: [usize; MAX_CLASSES],
    /// Chunk offset of each class's sub-chunk, by class index.
    offsets: [usize; MAX_CLASSES],
    /// Per page of `1 << page_shift` bytes of the chunk, the class of its blocks, or [`MIXED_PAGE`] for a
    /// page two sub-chunks share: a free finds its class with one shift and one load.
    page_classes: [u8; PAGES],
    page_shift: u32,
    class_map: SizeClassMap,
    /// Per thread slot, its magazines; made by the slot's owner on its first use of this pool.
    caches: [OnceLock<ThreadCaches>; MAX_THREADS],
    /// Per thread slot, its first magazine once made (null before): one load on the fast path.
    first_cache: [AtomicPtr<ClassCache>; MAX_THREADS],
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
        (first..self.classes.len())
            .find(|&index| self.classes[index].slots.view().slot_align() >= align)
    }

    /// The class whose sub-chunk holds chunk offset `offset`, if the page table knows it (the page holds
    /// blocks of one class only).
    #[inline]
    fn page_class(&self, offset: usize) -> Option<usize> {
        // `offset < chunk.len() <= PAGES << page_shift`, so the mask changes nothing.
        let class = self.page_classes[(offset >> self.page_shift) & (PAGES - 1)];
        (class != MIXED_PAGE).then_some(class as usize)
    }

    /// The offset of chunk offset `offset` in the sub-chunk of `class`, which holds it.
    #[inline]
    fn class_offset(&self, class: usize, offset: usize) -> usize {
        debug_assert!(class < self.classes.len());
        // SAFETY: `class` is a class index, below `MAX_CLASSES`.
        offset - unsafe { self.offsets.get_unchecked(class) }
    }

    /// This thread's magazine for `class`, if the thread has a slot (and, the first time, `System` memory
    /// for its magazines).
    fn cache(&self, class: usize) -> Option<&ClassCache> {
        self.cache_if_made(class).or_else(|| {
            let slot = thread_slot::current()?;
            let first = match self.first_cache[slot].load(Acquire) {
                first if first.is_null() => self.make_caches(slot)?,
                first => first,
            };
            // SAFETY: as in `cache_if_made`.
            Some(unsafe { &*first.add(class) })
        })
    }

    /// [`PoolState::cache`] for a thread that has a slot and magazines in this pool already: the fast path,
    /// which calls nothing, so it saves no registers.
    #[inline]
    fn cache_if_made(&self, class: usize) -> Option<&ClassCache> {
        let first = self.first_cache[thread_slot::assigned()?].load(Acquire);
        debug_assert!(class < self.classes.len());
        // SAFETY: a non-null `first` points to the first of this slot's caches, one per class, which live
        // as long as `self`; `class` indexes `self.classes`.
        (!first.is_null()).then(|| unsafe { &*first.add(class) })
    }

    #[cold]
    #[inline(never)]
    fn make_caches(&self, slot: usize) -> Option<*mut ClassCache> {
        let cached = |class: &SizeClass| class.spec.block_count >= MIN_CACHED_BLOCKS;
        let cached_classes = self.classes.iter().filter(|class| cached(class)).count();
        let mut items = match cached_classes {
            0 => None,
            n => Some(SystemSlice::try_from_fn(n * THREAD_CACHE_BLOCKS, |_| {
                Some(0u32)
            })?),
        };
        let mut next_items = items
            .as_mut()
            .map_or(std::ptr::null_mut(), |items| items.as_mut_ptr());
        let classes = SystemSlice::try_from_fn(self.classes.len(), |index| {
            let class = &self.classes[index];
            let (capacity, items) = if cached(class) {
                let at = next_items;
                next_items = next_items.wrapping_add(THREAD_CACHE_BLOCKS);
                (THREAD_CACHE_BLOCKS as u32, at)
            } else {
                (0, std::ptr::null_mut())
            };
            Some(ClassCache {
                count: Cell::new(0),
                capacity,
                items,
                slots: class.slots.view(),
                allocations: AtomicU64::new(0),
                frees: AtomicU64::new(0),
                live_bytes: AtomicU64::new(0),
            })
        })?;
        // Only this slot's owner sets it, so the set cannot lose a race.
        let caches = self.caches[slot].get_or_init(|| ThreadCaches {
            classes,
            _items: items,
        });
        let first = caches.classes.as_ptr().cast_mut();
        self.first_cache[slot].store(first, Release);
        Some(first)
    }

    /// Counts of one class, over its lock-path counters and every thread's magazine.
    fn class_totals(&self, class: usize) -> AllocatorStats {
        let mut stats = AllocatorStats::default();
        self.classes[class].counters.add_to(&mut stats);
        for caches in self.caches.iter().filter_map(OnceLock::get) {
            caches.classes[class].add_to(&mut stats);
        }
        stats
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
            let totals = self.class_totals(index);
            stats.live_blocks = stats.live_blocks.wrapping_add(totals.live_blocks);
            stats.live_bytes = stats.live_bytes.wrapping_add(totals.live_bytes);
            stats.allocations += totals.allocations;
            stats.frees += totals.frees;
            stats.failures += totals.failures;
            stats.peak_bytes +=
                class.locked.peak_blocks.load(Relaxed) * class.spec.block_size as u64;
        }
        stats.failures += self.unserved.load(Relaxed);
        stats
    }

    fn for_each_live_block(&self, visit: &mut dyn FnMut(LiveBlock)) -> Result<(), Busy> {
        for class in self.classes.iter() {
            class.slots.for_each_live(visit);
        }
        Ok(())
    }

    fn hold_for_fork(&self, held: &mut Vec<ForkHold>) {
        for class in self.classes.iter() {
            // SAFETY: the pool is registered; the registry's lock outlives these holds.
            held.push(unsafe { hold_for_fork(&class.locked.shared) });
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
        .any(|class| u32::try_from(class.block_size).is_err())
    {
        return Err(CreateError::InvalidConfig(
            "block sizes must be below 4 GiB",
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
        let (starts_used, by_address_used) = (&starts[..specs.len()], &by_address[..specs.len()]);
        let mut page_shift = 0;
        while total.div_ceil(1 << page_shift) > PAGES {
            page_shift += 1;
        }
        let mut page_classes = [MIXED_PAGE; PAGES];
        for (page, entry) in page_classes.iter_mut().enumerate() {
            let first = page << page_shift;
            if first >= total {
                break;
            }
            let last = (first + (1 << page_shift)).min(total) - 1;
            let class = class_scan(starts_used, by_address_used, first);
            if class == class_scan(starts_used, by_address_used, last) {
                *entry = class as u8;
            }
        }
        let chunk_align = natural_alignment(specs[by_address[0] as usize].block_size);
        let chunk = SystemChunk::zeroed(total, chunk_align).ok_or(CreateError::OutOfMemory)?;
        let classes = SystemSlice::try_from_fn(specs.len(), |index| {
            let spec = specs[index];
            let base = chunk.base().wrapping_add(offsets[index]);
            Some(SizeClass {
                spec,
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
            offsets,
            page_classes,
            page_shift,
            class_map: SizeClassMap::new(specs.iter().map(|spec| spec.block_size)),
            caches: [const { OnceLock::new() }; MAX_THREADS],
            first_cache: [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_THREADS],
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
    #[inline]
    pub fn alloc(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        self.alloc_tagged(size, align, 0)
    }

    /// [`Pool::alloc`] that records `tag` (the tracker's) with the block.
    #[inline]
    pub fn alloc_tagged(&self, size: usize, align: usize, tag: u32) -> Option<NonNull<u8>> {
        let state = &*self.state;
        if let Some(cache) = state
            .class_map
            .small_class(size)
            .and_then(|class| state.cache_if_made(class))
        {
            // SAFETY: `state.cache` returned the cache of this thread's own slot.
            if let Some(block) = unsafe { cache.alloc(size, align, tag) } {
                return Some(block);
            }
        }
        self.alloc_slow(size, align, tag)
    }

    /// Everything but a hit in a non-empty magazine: large or over-aligned requests, refills, classes or
    /// threads without a magazine.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, size: usize, align: usize, tag: u32) -> Option<NonNull<u8>> {
        let state = &*self.state;
        let Some(class_index) = state.class_for(size, align) else {
            state.unserved.fetch_add(1, Relaxed);
            return None;
        };
        let class = &state.classes[class_index];
        match state.cache(class_index) {
            Some(cache) if cache.capacity > 0 => {
                // SAFETY: `state.cache` returned the cache of this thread's own slot; it is cached.
                unsafe {
                    if cache.count.get() == 0 && !cache.refill(class) {
                        return None;
                    }
                    Some(cache.pop_claim(size, tag))
                }
            }
            _ => class.alloc_locked(size, tag),
        }
    }

    /// Returns a block to its class. Refuses pointers outside the pool (`Foreign`), off a block start
    /// (`Interior`) and blocks already free (`DoubleFree`), changing nothing.
    #[inline]
    pub fn free(&self, ptr: *mut u8) -> Result<(), FreeError> {
        let state = &*self.state;
        let offset = state
            .chunk
            .offset_of(ptr as usize)
            .ok_or(FreeError::Foreign)?;
        if let Some(class) = state.page_class(offset) {
            if let Some(cache) = state.cache_if_made(class) {
                // SAFETY: `state.cache_if_made` returned the cache of this thread's own slot; the class's
                // sub-chunk holds `offset`.
                return unsafe { cache.free(state, class, state.class_offset(class, offset)) };
            }
        }
        self.free_slow(offset)
    }

    /// A free of the block at chunk offset `offset` in a page shared by two classes, or by a thread without
    /// magazines in this pool yet, or without a slot.
    #[cold]
    #[inline(never)]
    fn free_slow(&self, offset: usize) -> Result<(), FreeError> {
        let state = &*self.state;
        let class_index = state.page_class(offset).unwrap_or_else(|| {
            let classes = state.classes.len();
            class_scan(
                &state.starts[..classes],
                &state.by_address[..classes],
                offset,
            )
        });
        let offset = state.class_offset(class_index, offset);
        match state.cache(class_index) {
            // SAFETY: `state.cache` returned the cache of this thread's own slot; the class's sub-chunk
            // holds `offset`.
            Some(cache) => unsafe { cache.free(state, class_index, offset) },
            None => {
                let class = &state.classes[class_index];
                let index = class.slots.view().index_at(offset)?;
                let size = class.slots.release(index)?;
                class.free_locked(index, size);
                Ok(())
            }
        }
    }

    /// Per-class counters, in ascending block size.
    pub fn class_stats(&self) -> Vec<ClassStats> {
        let state = &*self.state;
        let mut all = Vec::with_capacity(state.classes.len());
        for (index, class) in state.classes.iter().enumerate() {
            let stats = state.class_totals(index);
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

registered_allocator!(Pool, state);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::test_support::{assert_disjoint, Rng};
    use crate::engine::EngineAllocator;
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
    fn blocks_in_pages_two_classes_share_are_found() {
        // 16-byte blocks first (larger alignment), then 24-byte ones: the 21616-byte chunk has 32-byte pages,
        // and the page at 4800 holds the last 16-byte block and the first 24-byte one.
        let classes = [
            ClassSpec {
                block_size: 16,
                block_count: 301,
            },
            ClassSpec {
                block_size: 24,
                block_count: 700,
            },
        ];
        let pool = Pool::new("shared pages", PoolConfig { classes: &classes }).unwrap();
        let blocks: Vec<_> = (0..301)
            .map(|_| pool.alloc(16, 16).unwrap())
            .chain((0..700).map(|_| pool.alloc(24, 8).unwrap()))
            .collect();
        for &block in &blocks {
            pool.free(block.as_ptr()).unwrap();
        }
        for &block in &blocks {
            assert_eq!(pool.free(block.as_ptr()), Err(FreeError::DoubleFree));
        }
        let stats = pool.stats();
        assert_eq!((stats.live_blocks, stats.frees), (0, 1001));
        // Every block went back to its own class: all of them can be handed out again, once each.
        let mut again: Vec<_> = (0..301)
            .map(|_| (pool.alloc(16, 16).unwrap().as_ptr() as usize, 16))
            .chain((0..700).map(|_| (pool.alloc(24, 8).unwrap().as_ptr() as usize, 24)))
            .collect();
        assert_disjoint(&mut again);
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
