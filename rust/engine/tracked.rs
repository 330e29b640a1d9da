//! Engine allocators behind the tracker: a call stack captured per allocation (kept as the block's tag, so leaks show it), the tag scope's figures, and bad frees reported as memory errors.
//!
//! A block allocated under a tag scope (`K15_MEMORY_SCOPE`) counts against that tag until it is
//! freed, as the tracker's own blocks do. The allocators' per-block records have no room for a
//! tag, so the tagged blocks' tags are kept in a map of their own, by address: a program that
//! opens no scope around its engine allocators never takes its lock, and an allocator with no
//! tagged block live takes it on no free.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{
    AllocatorInfo, AllocatorStats, BlockAllocator, CreateError, EngineAllocator, FreeError,
    ObjectPool, Pool, PoolConfig, StackAllocator, StackMarker,
};
use crate::stack::{StackId, StartFrame};
use crate::tracker::errors::{self, ErrorKind, MemoryError};
use crate::tracker::guard::Inside;
use crate::tracker::tags::TagId;
use crate::tracker::{told, BlockKind};

enum Inner {
    Pool(Pool),
    /// A stack allocator is single-threaded; the lock makes a shared handle sound (uncontended in use).
    Stack(Mutex<StackAllocator>),
    Block(BlockAllocator),
    Objects(ObjectPool),
}

/// Any engine allocator, tracked: what the C++ classes of `include/k15/engine.h` hold, usable from Rust
/// with [`StartFrame::here`]. Thread-safe.
pub struct TrackedAllocator {
    inner: Inner,
    /// A typed pool's object size (what its blocks count for; its callers ask for 0 bytes).
    object_size: usize,
    /// Its blocks in [`TAGGED`].
    tagged_live: AtomicUsize,
}

/// A block allocated under a tag scope: its allocator's id, its tag and the bytes it counts for.
#[derive(Clone, Copy)]
struct TaggedBlock {
    allocator: u32,
    tag: TagId,
    size: usize,
}

/// The live tagged blocks of every allocator behind the tracker, by address.
static TAGGED: Mutex<BTreeMap<usize, TaggedBlock>> = Mutex::new(BTreeMap::new());

fn tagged() -> MutexGuard<'static, BTreeMap<usize, TaggedBlock>> {
    TAGGED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Held by `fork` (see `tracker::fork`), as the allocators' own locks are.
pub(crate) fn lock_tags_for_fork() -> MutexGuard<'static, impl Sized> {
    tagged()
}

/// A block of an allocator: its address and the allocator's id.
pub type BlockKey = (usize, u32);

/// The tags of the live tagged blocks, by address, then allocator id, for the report; `Err` if
/// the lock stayed held (see [`super::lock_for_walk`]). The blocks of an allocator dropped with
/// blocks live stay (the report lists them as leaks), counted against their tags.
pub fn block_tags() -> Result<Vec<(BlockKey, TagId)>, super::Busy> {
    let tagged = super::lock_for_walk(&TAGGED)?;
    let _inside = Inside::enter(); // the copy is the tracker's own memory
    Ok(tagged
        .iter()
        .map(|(&at, block)| ((at, block.allocator), block.tag))
        .collect())
}

static CREATED: AtomicBool = AtomicBool::new(false);

/// Whether a [`TrackedAllocator`] was ever made: then the exit report is due even if nothing else was tracked.
pub fn any_tracked_allocator_created() -> bool {
    CREATED.load(Relaxed)
}

/// The call stack from `start` as a block tag (its `StackId`); 0 when stacks are off or this thread is
/// already inside the tracker.
pub fn stack_tag(start: StartFrame) -> u32 {
    Inside::enter().map_or(0, |inside| crate::tracker::capture_stack(&inside, start).0)
}

impl TrackedAllocator {
    pub fn pool(name: &'static str, config: PoolConfig<'_>) -> Result<Self, CreateError> {
        Pool::new(name, config).map(|pool| Self::new(Inner::Pool(pool)))
    }

    pub fn stack(name: &'static str, capacity: usize) -> Result<Self, CreateError> {
        StackAllocator::new(name, capacity).map(|stack| Self::new(Inner::Stack(Mutex::new(stack))))
    }

    pub fn block(name: &'static str, capacity: usize) -> Result<Self, CreateError> {
        BlockAllocator::new(name, capacity).map(|block| Self::new(Inner::Block(block)))
    }

    /// A typed pool of objects of `size` bytes aligned to `align`, named `element_type` for `type_of`.
    pub fn objects(
        name: &'static str,
        element_type: &'static str,
        size: usize,
        align: usize,
        first_batch: usize,
    ) -> Result<Self, CreateError> {
        ObjectPool::new(name, element_type, size, align, first_batch)
            .map(|objects| Self::with_object_size(Inner::Objects(objects), size))
    }

    fn new(inner: Inner) -> Self {
        Self::with_object_size(inner, 0)
    }

    fn with_object_size(inner: Inner, object_size: usize) -> Self {
        CREATED.store(true, Relaxed);
        Self {
            inner,
            object_size,
            tagged_live: AtomicUsize::new(0),
        }
    }

    fn stack_allocator(stack: &Mutex<StackAllocator>) -> MutexGuard<'_, StackAllocator> {
        stack.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with_allocator<R>(&self, use_it: impl FnOnce(&dyn EngineAllocator) -> R) -> R {
        match &self.inner {
            Inner::Pool(pool) => use_it(pool),
            Inner::Stack(stack) => use_it(&*Self::stack_allocator(stack)),
            Inner::Block(block) => use_it(block),
            Inner::Objects(objects) => use_it(objects),
        }
    }

    pub fn info(&self) -> AllocatorInfo {
        self.with_allocator(|allocator| allocator.info())
    }

    pub fn stats(&self) -> AllocatorStats {
        self.with_allocator(|allocator| allocator.stats())
    }

    /// `size` bytes aligned to `align` (a typed pool: one object, whatever the size), tagged with the call
    /// stack from `start`; `None` when the allocator cannot serve it (counted as a failure).
    pub fn alloc(&self, size: usize, align: usize, start: StartFrame) -> Option<NonNull<u8>> {
        let stack = stack_tag(start);
        let tag = told::current_tag();
        let inside = Inside::enter(); // what the allocator allocates for itself is the tracker's
        let block = match &self.inner {
            Inner::Pool(pool) => pool.alloc_tagged(size, align, stack),
            Inner::Stack(stack_allocator) => {
                Self::stack_allocator(stack_allocator).alloc_tagged(size, align, stack)
            }
            Inner::Block(block) => block.alloc_tagged(size, align, stack),
            Inner::Objects(objects) => objects.alloc_tagged(stack),
        }?;
        drop(inside);
        if tag != 0 {
            self.count_tagged(
                block.as_ptr() as usize,
                size.max(self.object_size),
                tag,
                stack,
            );
        }
        Some(block)
    }

    /// Counts a block allocated under `tag` against it and keeps its tag for its free.
    #[cold]
    #[inline(never)]
    fn count_tagged(&self, address: usize, size: usize, tag: TagId, stack: u32) {
        told::count_tagged_allocation(tag, size, StackId(stack));
        let block = TaggedBlock {
            allocator: self.info().id,
            tag,
            size,
        };
        let _inside = Inside::enter(); // the map's memory is the tracker's own
        tagged().insert(address, block);
        self.tagged_live.fetch_add(1, Relaxed);
    }

    /// Counts the end of the tagged blocks `gone` picks out of this allocator's.
    #[cold]
    #[inline(never)]
    fn count_tagged_frees(&self, gone: impl Fn(usize) -> bool) {
        let id = self.info().id;
        let ended: Vec<TaggedBlock> = {
            let _inside = Inside::enter();
            let mut tagged = tagged();
            let addresses: Vec<usize> = tagged
                .iter()
                .filter(|(&at, block)| block.allocator == id && gone(at))
                .map(|(&at, _)| at)
                .collect();
            addresses
                .iter()
                .filter_map(|at| tagged.remove(at))
                .collect()
        };
        self.tagged_live.fetch_sub(ended.len(), Relaxed);
        for block in ended {
            told::count_free(block.size, block.tag, 0);
        }
    }

    /// Frees a block (null: nothing to do). A bad free is reported as a memory error with the stack from
    /// `start`, changes nothing, and is returned.
    pub fn free(&self, ptr: *mut u8, start: StartFrame) -> Result<(), FreeError> {
        if ptr.is_null() {
            return Ok(());
        }
        let freed = match &self.inner {
            Inner::Pool(pool) => pool.free(ptr),
            Inner::Stack(stack) => Self::stack_allocator(stack).free(ptr),
            Inner::Block(block) => block.free(ptr),
            Inner::Objects(objects) => objects.free_with(ptr, |_| ()),
        };
        if freed.is_ok() && self.tagged_live.load(Relaxed) != 0 {
            self.count_tagged_frees(|at| at == ptr as usize);
        }
        freed.inspect_err(|&error| self.report(ptr as usize, error, start))
    }

    /// Whether `ptr` is a live object of this typed pool (false for the other kinds), so C++ runs a
    /// destructor only on an object the pool will take back.
    pub fn holds_live_object(&self, ptr: *const u8) -> bool {
        matches!(&self.inner, Inner::Objects(objects) if objects.holds_live(ptr))
    }

    /// The stack allocator's current top; `None` for the other kinds.
    pub fn marker(&self) -> Option<StackMarker> {
        match &self.inner {
            Inner::Stack(stack) => Some(Self::stack_allocator(stack).marker()),
            _ => None,
        }
    }

    /// Frees everything a stack allocator allocated after `marker`; a bad marker (or another kind of
    /// allocator) is reported like a bad free and returned.
    pub fn rewind(&self, marker: StackMarker, start: StartFrame) -> Result<(), FreeError> {
        let rewound = match &self.inner {
            Inner::Stack(stack) => Self::stack_allocator(stack).rewind(marker),
            _ => Err(FreeError::Foreign),
        };
        if rewound.is_ok() && self.tagged_live.load(Relaxed) != 0 {
            let _inside = Inside::enter(); // the list is the tracker's own memory
            let mut live = Vec::new();
            let _ = self.with_allocator(|allocator| {
                allocator.for_each_live_block(&mut |block| live.push(block.address))
            });
            live.sort_unstable();
            self.count_tagged_frees(|at| live.binary_search(&at).is_err());
        }
        rewound.inspect_err(|&error| self.report(0, error, start))
    }

    #[cold]
    #[inline(never)]
    fn report(&self, address: usize, error: FreeError, start: StartFrame) {
        let info = self.info();
        let inside = Inside::enter();
        let free_stack = inside.as_ref().map_or(StackId(0), |inside| {
            crate::tracker::capture_stack(inside, start)
        });
        let kind = match error {
            FreeError::DoubleFree => ErrorKind::DoubleFree,
            FreeError::Foreign | FreeError::Interior | FreeError::OutOfOrder => {
                ErrorKind::InvalidFree
            }
        };
        errors::report(MemoryError {
            thread: crate::tracker::guard::thread_number(),
            allocator: Some(info.name),
            detail: Some(error.describe()),
            ..MemoryError::at_free(kind, address as *mut u8, BlockKind::New, free_stack)
        });
    }
}
