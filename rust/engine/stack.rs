//! Stack allocator: a bump pointer in one `System` block, with markers, an RAII rewind guard and LIFO-checked frees.
//!
//! Each allocation is preceded by a 24-byte `Header`: the tracker's record, the link to the allocation below
//! it, a cookie and a per-stack serial number. A free must name the topmost allocation; anything else is refused, never half-applied.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use super::registry::Registration;
use super::system_memory::{SystemBox, SystemChunk};
use super::ForkHold;
use super::{
    align_up, AllocatorKind, AllocatorStats, BlockMeta, Busy, Counters, CreateError, FreeError,
    LiveBlock, StatsSource,
};

const LIVE: u32 = 0x57AC_11FE;
const FREED: u32 = 0x57AC_DEAD;
const HEADER: usize = std::mem::size_of::<Header>();
/// Alignment of every header and the least alignment of every allocation.
const MIN_ALIGN: usize = 8;

#[derive(Clone, Copy)]
#[repr(C)]
struct Header {
    meta: BlockMeta,
    /// Offset of the allocation below this one, 0 when none (allocations never start at offset 0).
    below: u32,
    /// `LIVE` or `FREED`, xor the allocation's offset, so stray bytes rarely pass for a header.
    cookie: u32,
    /// Counts this stack's allocations; tells a marker's allocation from a later one at the same offset.
    serial: u32,
}

/// What the registry reads: counters, and the chunk with its top for listing live blocks. Written only
/// through `&mut StackAllocator`; a report taken while another thread uses the stack may list a block being
/// pushed or popped.
struct StackShared {
    name: &'static str,
    counters: Counters,
    chunk: SystemChunk,
    /// Offset of the topmost live allocation, 0 when empty.
    top_allocation: AtomicU32,
}

impl StackShared {
    fn top_allocation(&self) -> u32 {
        self.top_allocation.load(Relaxed)
    }

    fn read_header(&self, offset: usize) -> Header {
        debug_assert!(offset >= HEADER && offset <= self.chunk.len());
        // SAFETY: `HEADER <= offset <= len`, so the header lies inside the zero-initialised chunk.
        unsafe {
            self.chunk
                .base()
                .add(offset - HEADER)
                .cast::<Header>()
                .read_unaligned()
        }
    }
}

impl StatsSource for StackShared {
    fn stats(&self) -> AllocatorStats {
        let mut stats = AllocatorStats {
            name: self.name,
            capacity: self.chunk.len() as u64,
            ..Default::default()
        };
        self.counters.add_to(&mut stats);
        stats.peak_bytes = self.counters.peak_bytes();
        stats
    }

    fn for_each_live_block(&self, visit: &mut dyn FnMut(LiveBlock)) -> Result<(), Busy> {
        let mut allocation = self.top_allocation();
        while allocation != 0 {
            let header = self.read_header(allocation as usize);
            visit(
                header
                    .meta
                    .live_block(self.chunk.base() as usize + allocation as usize),
            );
            allocation = header.below;
        }
        Ok(())
    }

    /// None: a stack allocator is single-threaded (`tracked` wraps it in a lock of its own).
    fn hold_for_fork(&self, _held: &mut Vec<ForkHold>) {}
}

/// A position of a [`StackAllocator`] to rewind to: its topmost allocation, named by offset and serial number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackMarker {
    pub(crate) allocator: u32,
    pub(crate) top_allocation: u32,
    pub(crate) top_serial: u32,
}

/// A linear allocator for frame-scoped data (design note 002). Single-threaded: methods take `&mut self`.
pub struct StackAllocator {
    registration: Registration,
    shared: SystemBox<StackShared>,
    /// First free byte.
    top: usize,
    allocations: u32,
}

impl StackAllocator {
    /// Acquires `capacity` bytes (at most 4 GiB) from `System`.
    pub fn new(name: &'static str, capacity: usize) -> Result<Self, CreateError> {
        if capacity > u32::MAX as usize {
            return Err(CreateError::InvalidConfig("stack capacity above 4 GiB"));
        }
        let chunk = SystemChunk::zeroed(capacity, 64).ok_or(CreateError::OutOfMemory)?;
        let (base, len) = (chunk.base() as usize, chunk.len());
        let shared = SystemBox::new(StackShared {
            name,
            counters: Counters::default(),
            chunk,
            top_allocation: AtomicU32::new(0),
        })
        .ok_or(CreateError::OutOfMemory)?;
        let source: &dyn StatsSource = &*shared;
        // SAFETY: `shared` lives in `System` memory at a stable address and is dropped after `registration`.
        let registration = unsafe { Registration::new(name, AllocatorKind::Stack, None, source) }?;
        registration.add_range(base, len)?;
        Ok(Self {
            registration,
            shared,
            top: 0,
            allocations: 0,
        })
    }

    fn read_header(&self, offset: usize) -> Header {
        self.shared.read_header(offset)
    }

    fn top_allocation(&self) -> u32 {
        self.shared.top_allocation()
    }

    fn set_top_allocation(&mut self, offset: u32) {
        self.shared.top_allocation.store(offset, Relaxed);
    }

    fn chunk(&self) -> &SystemChunk {
        &self.shared.chunk
    }

    fn write_header(&mut self, offset: usize, header: Header) {
        debug_assert!(offset >= HEADER && offset <= self.chunk().len());
        // SAFETY: as in `StackShared::read_header`; `&mut self` makes the write exclusive.
        unsafe {
            self.chunk()
                .base()
                .add(offset - HEADER)
                .cast::<Header>()
                .write_unaligned(header)
        }
    }

    /// `size` bytes aligned to `align` (a power of two) on top of the stack; `None` when it does not fit.
    pub fn alloc(&mut self, size: usize, align: usize) -> Option<NonNull<u8>> {
        self.alloc_tagged(size, align, 0)
    }

    /// [`StackAllocator::alloc`] that records `tag` (the tracker's stack id) in the block's header.
    pub fn alloc_tagged(&mut self, size: usize, align: usize, tag: u32) -> Option<NonNull<u8>> {
        let Some(offset) = self.place(size, align) else {
            self.shared.counters.record_failure();
            return None;
        };
        self.allocations = self.allocations.wrapping_add(1);
        let header = Header {
            meta: BlockMeta::new(size, tag),
            below: self.top_allocation(),
            cookie: LIVE ^ offset as u32,
            serial: self.allocations,
        };
        self.write_header(offset, header);
        self.set_top_allocation(offset as u32);
        self.top = offset + size;
        self.shared.counters.record_alloc(size);
        NonNull::new(self.chunk().base().wrapping_add(offset))
    }

    /// Offset for a new allocation, if it fits.
    fn place(&self, size: usize, align: usize) -> Option<usize> {
        if !align.is_power_of_two() || size > u32::MAX as usize {
            return None;
        }
        let base = self.chunk().base() as usize;
        let start = align_up(base + self.top + HEADER, align.max(MIN_ALIGN))? - base;
        // A zero-size block still needs its start inside the chunk, so that `free` recognises it.
        (start.checked_add(size.max(1))? <= self.chunk().len()).then_some(start)
    }

    /// Frees the topmost allocation. Refuses foreign and interior pointers, blocks already freed or rewound
    /// (`DoubleFree`) and any live block that is not on top (`OutOfOrder`), changing nothing.
    pub fn free(&mut self, ptr: *mut u8) -> Result<(), FreeError> {
        let offset = self
            .chunk()
            .offset_of(ptr as usize)
            .ok_or(FreeError::Foreign)?;
        if offset < HEADER || offset % MIN_ALIGN != 0 {
            return Err(FreeError::Interior);
        }
        let header = self.read_header(offset);
        let freed = header.cookie == FREED ^ offset as u32;
        if header.cookie != LIVE ^ offset as u32 && !freed {
            return Err(FreeError::Interior);
        }
        // Live allocations start at or below the top (a zero-size one exactly at it); none above it.
        if freed || offset > self.top {
            return Err(FreeError::DoubleFree);
        }
        if offset != self.top_allocation() as usize {
            return Err(FreeError::OutOfOrder);
        }
        self.pop_top();
        Ok(())
    }

    /// Frees the topmost allocation, which must exist.
    fn pop_top(&mut self) {
        let offset = self.top_allocation() as usize;
        let mut header = self.read_header(offset);
        header.cookie = FREED ^ offset as u32;
        self.write_header(offset, header);
        self.shared
            .counters
            .record_frees(1, header.meta.size as u64);
        self.set_top_allocation(header.below);
        self.top = self.end_of(header.below);
    }

    fn serial_of(&self, allocation: u32) -> u32 {
        match allocation {
            0 => 0,
            offset => self.read_header(offset as usize).serial,
        }
    }

    fn end_of(&self, allocation: u32) -> usize {
        match allocation {
            0 => 0,
            offset => offset as usize + self.read_header(offset as usize).meta.size as usize,
        }
    }

    /// The current top, to [`rewind`](StackAllocator::rewind) to later.
    pub fn marker(&self) -> StackMarker {
        StackMarker {
            allocator: self.registration.info().id,
            top_allocation: self.top_allocation(),
            top_serial: self.serial_of(self.top_allocation()),
        }
    }

    /// Frees every allocation made after `marker`, newest first. Refuses a marker of another allocator
    /// (`Foreign`) and one whose allocation is no longer live (`OutOfOrder`), changing nothing.
    pub fn rewind(&mut self, marker: StackMarker) -> Result<(), FreeError> {
        if marker.allocator != self.registration.info().id {
            return Err(FreeError::Foreign);
        }
        let mut allocation = self.top_allocation();
        while allocation > marker.top_allocation {
            allocation = self.read_header(allocation as usize).below;
        }
        if allocation != marker.top_allocation || self.serial_of(allocation) != marker.top_serial {
            return Err(FreeError::OutOfOrder);
        }
        while self.top_allocation() != marker.top_allocation {
            self.pop_top();
        }
        Ok(())
    }

    /// A guard that rewinds to the current marker when dropped (foonathan's `memory_stack_raii_unwind`).
    pub fn scope(&mut self) -> StackScope<'_> {
        let marker = self.marker();
        StackScope {
            stack: self,
            marker,
        }
    }
}

registered_allocator!(StackAllocator, shared);

/// Rewinds its [`StackAllocator`] on drop; derefs to it for allocating inside the scope.
pub struct StackScope<'a> {
    stack: &'a mut StackAllocator,
    marker: StackMarker,
}

impl Deref for StackScope<'_> {
    type Target = StackAllocator;
    fn deref(&self) -> &StackAllocator {
        self.stack
    }
}

impl DerefMut for StackScope<'_> {
    fn deref_mut(&mut self) -> &mut StackAllocator {
        self.stack
    }
}

impl Drop for StackScope<'_> {
    fn drop(&mut self) {
        // Fails only if the scope's user already rewound below the marker: then nothing is left to free.
        let _ = self.stack.rewind(self.marker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::test_support::{assert_disjoint, Rng};
    use crate::engine::EngineAllocator;

    #[test]
    fn lifo_frees_and_rewinds_restore_the_top() {
        let mut stack = StackAllocator::new("frame", 1024).unwrap();
        let a = stack.alloc(10, 8).unwrap().as_ptr();
        let b = stack.alloc(100, 64).unwrap().as_ptr();
        assert_eq!(b as usize % 64, 0);
        assert_eq!(stack.free(a), Err(FreeError::OutOfOrder));
        let before = stack.stats();
        stack.free(b).unwrap();
        assert_eq!(stack.free(b), Err(FreeError::DoubleFree));
        assert_eq!(
            stack.alloc(100, 64).unwrap().as_ptr(),
            b,
            "the freed space is reused"
        );
        let marker = stack.marker();
        stack.alloc(5, 1).unwrap();
        stack.alloc(0, 1).unwrap();
        stack.rewind(marker).unwrap();
        let after = stack.stats();
        assert_eq!(
            (after.live_blocks, after.live_bytes, after.allocations),
            (2, 110, 5)
        );
        assert_eq!((before.live_blocks, before.live_bytes), (2, 110));
        assert_eq!(
            stack
                .leaks()
                .iter()
                .map(|leak| leak.size)
                .collect::<Vec<_>>(),
            [10, 100]
        );
    }

    #[test]
    fn bad_frees_and_markers_are_refused_and_change_nothing() {
        let mut stack = StackAllocator::new("frame", 256).unwrap();
        let mut other = StackAllocator::new("other", 256).unwrap();
        let a = stack.alloc(16, 8).unwrap().as_ptr();
        let outer = stack.marker();
        let b = stack.alloc(16, 8).unwrap().as_ptr();
        let inner = stack.marker();
        let before = stack.stats();
        let mut outside = 0u64;
        assert_eq!(
            stack.free(&mut outside as *mut u64 as *mut u8),
            Err(FreeError::Foreign)
        );
        assert_eq!(stack.free(b.wrapping_add(8)), Err(FreeError::Interior));
        assert_eq!(stack.free(b.wrapping_add(3)), Err(FreeError::Interior));
        assert_eq!(stack.free(a), Err(FreeError::OutOfOrder));
        assert_eq!(stack.rewind(other.marker()), Err(FreeError::Foreign));
        assert_eq!(stack.alloc(1000, 8), None);
        assert_eq!(
            stack.stats(),
            AllocatorStats {
                failures: 1,
                ..before
            }
        );
        stack.rewind(outer).unwrap();
        assert_eq!(stack.rewind(inner), Err(FreeError::OutOfOrder));
        assert_eq!(stack.free(b), Err(FreeError::DoubleFree));
        stack.free(a).unwrap();
        assert_eq!(stack.stats().live_blocks, 0);
        assert!(
            other.alloc(256 - HEADER, 8).is_some(),
            "a full-capacity block fits"
        );
    }

    #[test]
    fn scope_guard_rewinds_on_drop() {
        let mut stack = StackAllocator::new("frame", 4096).unwrap();
        let kept = stack.alloc(32, 16).unwrap();
        for _ in 0..3 {
            let mut frame = stack.scope();
            for size in [1, 7, 64, 200] {
                frame.alloc(size, 8).unwrap();
            }
            assert_eq!(frame.stats().live_blocks, 5);
        }
        let stats = stack.stats();
        assert_eq!(
            (stats.live_blocks, stats.frees, stats.allocations),
            (1, 12, 13)
        );
        assert_eq!(stack.leaks()[0].address, kept.as_ptr() as usize);
    }

    #[test]
    fn random_sequences_match_a_lifo_model() {
        let mut stack = StackAllocator::new("model", 1 << 16).unwrap();
        let mut rng = Rng::new(7);
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut markers: Vec<(StackMarker, usize)> = Vec::new();
        for _ in 0..20_000 {
            match rng.range(0, 9) {
                0..=4 => {
                    let (size, align) = (rng.range(0, 700), 1 << rng.range(0, 7));
                    match stack.alloc(size, align) {
                        Some(block) => {
                            assert_eq!(block.as_ptr() as usize % align, 0);
                            live.push((block.as_ptr() as usize, size));
                        }
                        None => assert!(stack.stats().failures > 0),
                    }
                }
                5..=6 if !live.is_empty() => {
                    if live.len() >= 2 {
                        assert_eq!(
                            stack.free(live[live.len() - 2].0 as *mut u8),
                            Err(FreeError::OutOfOrder)
                        );
                    }
                    stack.free(live.pop().unwrap().0 as *mut u8).unwrap();
                    markers.retain(|&(_, depth)| depth <= live.len());
                }
                7 => markers.push((stack.marker(), live.len())),
                _ => {
                    if let Some((marker, depth)) = markers.pop() {
                        stack.rewind(marker).unwrap();
                        live.truncate(depth);
                    }
                }
            }
            let stats = stack.stats();
            assert_eq!(stats.live_blocks, live.len() as u64);
            assert_eq!(
                stats.live_bytes,
                live.iter().map(|block| block.1 as u64).sum::<u64>()
            );
            assert_eq!(stats.allocations - stats.frees, stats.live_blocks);
        }
        let mut blocks: Vec<_> = stack
            .leaks()
            .iter()
            .map(|leak| (leak.address, leak.size))
            .collect();
        assert_eq!(blocks, live);
        assert_disjoint(&mut blocks);
    }
}
