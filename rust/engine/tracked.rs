//! Engine allocators behind the tracker: a call stack captured per allocation (kept as the block's tag, so leaks show it) and bad frees reported as memory errors.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{
    AllocatorInfo, AllocatorStats, BlockAllocator, CreateError, EngineAllocator, FreeError,
    ObjectPool, Pool, PoolConfig, StackAllocator, StackMarker,
};
use crate::stack::{StackId, StartFrame};
use crate::tracker::errors::{self, ErrorKind, MemoryError};
use crate::tracker::guard::Inside;
use crate::tracker::BlockKind;

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
            .map(|objects| Self::new(Inner::Objects(objects)))
    }

    fn new(inner: Inner) -> Self {
        CREATED.store(true, Relaxed);
        Self { inner }
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
        let tag = stack_tag(start);
        match &self.inner {
            Inner::Pool(pool) => pool.alloc_tagged(size, align, tag),
            Inner::Stack(stack) => Self::stack_allocator(stack).alloc_tagged(size, align, tag),
            Inner::Block(block) => block.alloc_tagged(size, align, tag),
            Inner::Objects(objects) => objects.alloc_tagged(tag),
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
