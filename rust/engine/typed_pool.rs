//! Typed pools (design note 003): objects of one type recycled through free lists, growing in doubling batches
//! from `System`; `type_of(ptr)` names the type of any object they hold. [`ObjectPool`] takes the size,
//! alignment and type name at run time (the C++ `TypedPool<T>`); [`TypedPool<T>`] is the Rust face on top.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::registry::Registration;
use super::size_class::slot_size;
use super::slots::{FreeList, Slots};
use super::system_memory::{SystemBox, SystemChunk};
use super::{hold_for_fork, ForkHold};
use super::{
    lock_for_walk, AllocatorInfo, AllocatorKind, AllocatorStats, Busy, Counters, CreateError,
    EngineAllocator, FreeError, LiveBlock, StatsSource,
};

/// Batches double in length, so 32 of them cover any realistic object count.
const MAX_BATCHES: usize = 32;

struct Batch {
    slots: Slots,
    free: FreeList,
    /// Owns the slots' memory.
    _chunk: SystemChunk,
}

struct Batches {
    list: [Option<Batch>; MAX_BATCHES],
    count: usize,
    next_len: usize,
    /// Batch of the last freed object: tried first, so a freed slot is the next one handed out (note 003:
    /// dangling pointers then show up quickly).
    last_freed: usize,
}

impl Batches {
    fn live(&self) -> impl Iterator<Item = &Batch> {
        self.list[..self.count].iter().flatten()
    }
}

struct TypedShared {
    name: &'static str,
    /// The size of one object, as callers asked for it.
    object_size: usize,
    slot_size: usize,
    slot_align: usize,
    capacity: AtomicU64,
    counters: Counters,
    batches: Mutex<Batches>,
}

impl TypedShared {
    fn batches(&self) -> MutexGuard<'_, Batches> {
        self.batches.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl StatsSource for TypedShared {
    fn stats(&self) -> AllocatorStats {
        let mut stats = AllocatorStats {
            name: self.name,
            capacity: self.capacity.load(Relaxed),
            ..Default::default()
        };
        self.counters.add_to(&mut stats);
        stats.peak_bytes = self.counters.peak_bytes();
        stats
    }

    fn for_each_live_block(&self, visit: &mut dyn FnMut(LiveBlock)) -> Result<(), Busy> {
        for batch in lock_for_walk(&self.batches)?.live() {
            batch.slots.for_each_live(visit);
        }
        Ok(())
    }

    fn hold_for_fork(&self, held: &mut Vec<ForkHold>) {
        // SAFETY: the pool is registered; the registry's lock outlives this hold.
        held.push(unsafe { hold_for_fork(&self.batches) });
    }
}

/// A free-list pool for objects of one size and alignment, named by a type name given at run time.
/// Thread-safe. It hands out uninitialised slots; constructing and destroying objects is the caller's part.
pub struct ObjectPool {
    registration: Registration,
    shared: SystemBox<TypedShared>,
}

impl ObjectPool {
    /// An empty pool for objects of `size` bytes aligned to `align` (a power of two), whose first batch
    /// (allocated on first use) holds `first_batch` objects.
    pub fn new(
        name: &'static str,
        element_type: &'static str,
        size: usize,
        align: usize,
        first_batch: usize,
    ) -> Result<Self, CreateError> {
        if first_batch == 0 {
            return Err(CreateError::InvalidConfig(
                "the first batch needs at least one object",
            ));
        }
        if !align.is_power_of_two() || size > u32::MAX as usize {
            return Err(CreateError::InvalidConfig(
                "objects need a power-of-two alignment and at most 4 GiB",
            ));
        }
        let shared = TypedShared {
            name,
            object_size: size,
            slot_size: slot_size(size, align),
            slot_align: align.max(8),
            capacity: AtomicU64::new(0),
            counters: Counters::default(),
            batches: Mutex::new(Batches {
                list: [const { None }; MAX_BATCHES],
                count: 0,
                next_len: first_batch,
                last_freed: 0,
            }),
        };
        let shared = SystemBox::new(shared).ok_or(CreateError::OutOfMemory)?;
        let source: &dyn StatsSource = &*shared;
        // SAFETY: `shared` lives in `System` memory at a stable address and is dropped after `registration`.
        let registration = unsafe {
            Registration::new(name, AllocatorKind::TypedPool, Some(element_type), source)
        }?;
        Ok(Self {
            registration,
            shared,
        })
    }

    /// An uninitialised slot for one object, recorded as live with `tag` (the tracker's stack id); `None`
    /// when `System` cannot grow the pool.
    pub fn alloc_tagged(&self, tag: u32) -> Option<NonNull<u8>> {
        let mut batches = self.shared.batches();
        let slot = self.free_batch(&mut batches).and_then(|batch| {
            let index = batch.slots.pop(&mut batch.free)?;
            Some(batch.slots.claim(index, self.shared.object_size, tag))
        });
        match slot {
            Some(_) => self.shared.counters.record_alloc(self.shared.object_size),
            None => self.shared.counters.record_failure(),
        }
        NonNull::new(slot?)
    }

    /// The batch of the last free if it has a free slot, else the newest batch with one, else a new batch.
    fn free_batch<'b>(&self, batches: &'b mut Batches) -> Option<&'b mut Batch> {
        let count = batches.count;
        let has_free = |index: usize| {
            batches.list[index]
                .as_ref()
                .is_some_and(|batch| batch.slots.has_free(&batch.free))
        };
        if let Some(index) = std::iter::once(batches.last_freed)
            .chain((0..count).rev())
            .find(|&index| has_free(index))
        {
            return batches.list[index].as_mut();
        }
        if count == MAX_BATCHES {
            return None;
        }
        let len = batches.next_len;
        let chunk = SystemChunk::zeroed(
            len.checked_mul(self.shared.slot_size)?,
            self.shared.slot_align,
        )?;
        let slots = Slots::new(chunk.base(), self.shared.slot_size, len)?;
        self.registration
            .add_range(chunk.base() as usize, chunk.len())
            .ok()?;
        add_capacity(&self.shared.capacity, chunk.len());
        batches.next_len = len.saturating_mul(2);
        batches.count += 1;
        batches.list[count]
            .insert(Batch {
                slots,
                // Typed pools move single slots only, never whole chains.
                free: FreeList::new(1),
                _chunk: chunk,
            })
            .into()
    }

    /// Recycles the slot of the object at `ptr`, first passing the object to `take` (under the pool lock,
    /// before another thread can get the slot). Refuses pointers outside the pool (`Foreign`), off an
    /// object start (`Interior`) and objects already freed (`DoubleFree`) without calling `take`.
    pub fn free_with(&self, ptr: *mut u8, take: impl FnOnce(*mut u8)) -> Result<(), FreeError> {
        let addr = ptr as usize;
        let mut batches = self.shared.batches();
        let count = batches.count;
        for (batch_index, batch) in batches.list[..count].iter_mut().flatten().enumerate() {
            let index = match batch.slots.index_of(addr) {
                Err(FreeError::Foreign) => continue,
                found => found?,
            };
            batch.slots.release(index)?;
            take(ptr);
            batch.slots.push(&mut batch.free, index);
            self.shared
                .counters
                .record_frees(1, self.shared.object_size as u64);
            batches.last_freed = batch_index;
            return Ok(());
        }
        Err(FreeError::Foreign)
    }

    /// Whether `ptr` is the start of a live object of this pool.
    pub fn holds_live(&self, ptr: *const u8) -> bool {
        let addr = ptr as usize;
        self.shared.batches().live().any(|batch| {
            batch
                .slots
                .index_of(addr)
                .is_ok_and(|index| batch.slots.is_live(index))
        })
    }
}

fn add_capacity(capacity: &AtomicU64, bytes: usize) {
    // Written only under the batch lock.
    capacity.store(capacity.load(Relaxed) + bytes as u64, Relaxed);
}

registered_allocator!(ObjectPool, shared);

/// A free-list pool for objects of type `T`. Thread-safe when `T: Send`. Objects still live when the pool
/// is dropped are not dropped (they are leaks; list them with [`EngineAllocator::leaks`] first).
pub struct TypedPool<T: 'static> {
    objects: ObjectPool,
    _objects: PhantomData<*mut T>,
}

// SAFETY: the pool owns `T` values and hands them between threads by value (`take`), which `T: Send` allows;
// all shared state is behind the batch lock or atomics.
unsafe impl<T: Send> Send for TypedPool<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for TypedPool<T> {}

impl<T: 'static> TypedPool<T> {
    /// An empty pool whose first batch (allocated on first use) holds `first_batch` objects.
    pub fn new(name: &'static str, first_batch: usize) -> Result<Self, CreateError> {
        let objects = ObjectPool::new(
            name,
            std::any::type_name::<T>(),
            size_of::<T>(),
            align_of::<T>(),
            first_batch,
        )?;
        Ok(Self {
            objects,
            _objects: PhantomData,
        })
    }

    /// Moves `value` into a recycled slot (or a new batch); `None` when `System` cannot grow the pool.
    pub fn alloc(&self, value: T) -> Option<NonNull<T>> {
        self.alloc_tagged(value, 0)
    }

    /// [`TypedPool::alloc`] that records `tag` (the tracker's stack id) with the object.
    pub fn alloc_tagged(&self, value: T, tag: u32) -> Option<NonNull<T>> {
        let slot = self.objects.alloc_tagged(tag)?.cast::<T>();
        // SAFETY: the slot is ours alone now, sized and aligned for `T` (`ObjectPool::new`).
        unsafe { slot.as_ptr().write(value) };
        Some(slot)
    }

    /// Moves the object out of the pool and recycles its slot. Refuses pointers outside the pool
    /// (`Foreign`), off an object start (`Interior`) and objects already taken (`DoubleFree`).
    ///
    /// # Safety
    /// No reference to the object (such as a [`PoolBox`] owning it) may be used after this call. The pool
    /// checks the pointer itself, but cannot see references.
    pub unsafe fn take(&self, ptr: *mut T) -> Result<T, FreeError> {
        let mut value = None;
        self.objects.free_with(ptr.cast(), |object| {
            // SAFETY: the slot was live, so it holds a `T` written by `alloc`; it is released (no other free
            // can succeed) and recycled without dropping, so the value is moved out exactly once.
            value = Some(unsafe { object.cast::<T>().read() });
        })?;
        Ok(value.expect("free_with calls take on success"))
    }

    /// Drops the object and recycles its slot; refuses bad pointers like [`TypedPool::take`].
    ///
    /// # Safety
    /// As for [`TypedPool::take`].
    pub unsafe fn free(&self, ptr: *mut T) -> Result<(), FreeError> {
        // SAFETY: the caller's promise. The value is dropped after the pool lock is released, so its
        // `Drop` may use the pool.
        unsafe { self.take(ptr) }.map(drop)
    }

    /// Like [`TypedPool::alloc`], returning an owning handle that frees the object when dropped.
    pub fn boxed(&self, value: T) -> Option<PoolBox<'_, T>> {
        self.alloc(value)
            .map(|object| PoolBox { pool: self, object })
    }
}

impl<T: 'static> EngineAllocator for TypedPool<T> {
    fn info(&self) -> AllocatorInfo {
        self.objects.info()
    }

    fn stats(&self) -> AllocatorStats {
        self.objects.stats()
    }

    fn for_each_live_block(&self, visit: &mut dyn FnMut(LiveBlock)) -> Result<(), Busy> {
        self.objects.for_each_live_block(visit)
    }
}

/// An object in a [`TypedPool`], freed (and dropped) when the handle is dropped.
pub struct PoolBox<'a, T: 'static> {
    pool: &'a TypedPool<T>,
    object: NonNull<T>,
}

impl<T> PoolBox<'_, T> {
    pub fn as_ptr(&self) -> *mut T {
        self.object.as_ptr()
    }
}

impl<T> Deref for PoolBox<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the handle owns a live object of its pool until it is dropped.
        unsafe { self.object.as_ref() }
    }
}

impl<T> DerefMut for PoolBox<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes the access unique.
        unsafe { self.object.as_mut() }
    }
}

impl<T> Drop for PoolBox<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the handle owns the object, and nothing borrows it once the handle is dropped.
        let freed = unsafe { self.pool.free(self.object.as_ptr()) };
        debug_assert!(freed.is_ok(), "a PoolBox owns a live object");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::test_support::Rng;
    use crate::engine::type_of;
    use std::rc::Rc;

    fn free_object<T>(pool: &TypedPool<T>, object: *mut T) -> Result<(), FreeError> {
        // SAFETY: the tests keep no references to freed objects.
        unsafe { pool.free(object) }
    }

    fn take_object<T>(pool: &TypedPool<T>, object: *mut T) -> Result<T, FreeError> {
        // SAFETY: as above.
        unsafe { pool.take(object) }
    }

    #[derive(Debug, PartialEq)]
    struct Vertex {
        position: [f32; 3],
        id: u64,
    }

    #[test]
    fn recycles_slots_and_names_the_type() {
        let pool = TypedPool::<Vertex>::new("vertices", 2).unwrap();
        let a = pool
            .alloc(Vertex {
                position: [1.0, 2.0, 3.0],
                id: 1,
            })
            .unwrap();
        let b = pool
            .alloc(Vertex {
                position: [0.0; 3],
                id: 2,
            })
            .unwrap();
        let c = pool
            .alloc(Vertex {
                position: [0.0; 3],
                id: 3,
            })
            .unwrap();
        assert_eq!(
            type_of(c.as_ptr().cast()),
            Some(std::any::type_name::<Vertex>())
        );
        assert_eq!(
            pool.info().element_type,
            Some(std::any::type_name::<Vertex>())
        );
        let local = 0u8;
        assert_eq!(type_of(&local), None);
        assert_eq!(
            take_object(&pool, a.as_ptr()).unwrap(),
            Vertex {
                position: [1.0, 2.0, 3.0],
                id: 1
            }
        );
        assert_eq!(
            pool.alloc(Vertex {
                position: [0.0; 3],
                id: 4
            }),
            Some(a),
            "the freed slot comes back first"
        );
        let stats = pool.stats();
        assert_eq!(
            (stats.live_blocks, stats.allocations, stats.frees),
            (3, 4, 1)
        );
        assert_eq!(
            stats.capacity,
            6 * size_of::<Vertex>() as u64,
            "batches of 2 then 4"
        );
        assert_eq!(pool.leaks().len(), 3);
        free_object(&pool, b.as_ptr()).unwrap();
    }

    #[test]
    fn bad_frees_are_refused_and_change_nothing() {
        let pool = TypedPool::<u64>::new("numbers", 4).unwrap();
        let object = pool.alloc(7).unwrap().as_ptr();
        let before = pool.stats();
        let mut outside = 0u64;
        assert_eq!(free_object(&pool, &mut outside), Err(FreeError::Foreign));
        assert_eq!(
            free_object(&pool, object.cast::<u8>().wrapping_add(4).cast()),
            Err(FreeError::Interior)
        );
        assert_eq!(
            free_object(&pool, object.wrapping_add(1)),
            Err(FreeError::DoubleFree),
            "a slot never handed out"
        );
        assert_eq!(pool.stats(), before);
        free_object(&pool, object).unwrap();
        assert_eq!(free_object(&pool, object), Err(FreeError::DoubleFree));
        assert_eq!(pool.stats().live_blocks, 0);
    }

    #[test]
    fn drops_values_and_boxes() {
        let witness = Rc::new(());
        let pool = TypedPool::<Rc<()>>::new("rcs", 8).unwrap();
        let object = pool.alloc(witness.clone()).unwrap();
        {
            let boxed = pool.boxed(witness.clone()).unwrap();
            assert_eq!(Rc::strong_count(&boxed), 3);
        }
        assert_eq!(Rc::strong_count(&witness), 2);
        free_object(&pool, object.as_ptr()).unwrap();
        assert_eq!(Rc::strong_count(&witness), 1);
    }

    #[test]
    fn over_aligned_types() {
        #[repr(align(64))]
        struct CacheLine(u8);
        let pool = TypedPool::<CacheLine>::new("lines", 3).unwrap();
        for byte in 0..10 {
            let line = pool.alloc(CacheLine(byte)).unwrap();
            assert_eq!(line.as_ptr() as usize % 64, 0);
            assert_eq!(
                take_object(&pool, line.as_ptr()).map(|line| line.0),
                Ok(byte)
            );
            pool.alloc(CacheLine(byte)).unwrap();
        }
    }

    #[test]
    fn random_sequences_match_a_model() {
        let pool = TypedPool::<(u64, u64)>::new("pairs", 1).unwrap();
        let mut rng = Rng::new(3);
        let mut live: Vec<(*mut (u64, u64), u64)> = Vec::new();
        for step in 0..20_000u64 {
            if live.is_empty() || !rng.next().is_multiple_of(3) {
                live.push((pool.alloc((step, !step)).unwrap().as_ptr(), step));
            } else {
                let (object, step) = live.swap_remove(rng.range(0, live.len() - 1));
                assert_eq!(take_object(&pool, object), Ok((step, !step)));
            }
            assert_eq!(pool.stats().live_blocks, live.len() as u64);
        }
        let mut addresses: Vec<_> = live.iter().map(|(object, _)| *object as usize).collect();
        addresses.sort_unstable();
        addresses.dedup();
        assert_eq!(addresses.len(), live.len());
        let mut listed: Vec<_> = pool.leaks().iter().map(|leak| leak.address).collect();
        listed.sort_unstable();
        assert_eq!(listed, addresses);
    }
}
