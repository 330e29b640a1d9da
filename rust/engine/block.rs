//! Block allocator: arbitrary sizes in one `System` arena, boundary tags with coalescing, and O(1) two-level
//! segregated fit (TLSF: first level log2 of the size, 16 linear subdivisions, bitmaps searched with
//! `trailing_zeros`).
//!
//! Every block starts with a 32-byte `Header`: the physical predecessor (boundary tag), the block size, the
//! tracker's record and a cookie (`LIVE`/`FREE` xor offset) that validates frees. A free block keeps its
//! free-list links in its payload. A sentinel header closes the arena, so freeing everything leaves one block.

use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::registry::Registration;
use super::system_memory::{SystemBox, SystemChunk};
use super::{
    align_up, lock_for_walk, AllocatorKind, AllocatorStats, BlockMeta, Busy, Counters, CreateError,
    FreeError, LiveBlock, StatsSource,
};
use super::{hold_for_fork, ForkHold};

const GRANULE: usize = 16;
const HEADER: usize = std::mem::size_of::<Header>();
/// A free block must hold its header and its two free-list links.
const MIN_BLOCK: usize = HEADER + GRANULE;
const SL_LOG2: u32 = 4;
const SL_COUNT: usize = 1 << SL_LOG2;
const FL_SHIFT: u32 = SL_LOG2 + GRANULE.trailing_zeros();
/// Blocks below this size are mapped linearly (first level 0) in steps of `GRANULE`.
const SMALL_BLOCK: usize = 1 << FL_SHIFT;
/// First levels for block sizes below 4 GiB.
const FL_COUNT: usize = (u32::BITS - FL_SHIFT + 1) as usize;
const NONE: u32 = u32::MAX;
const LIVE: u32 = 0xB10C_11FE;
const FREE: u32 = 0xB10C_F4EE;
const SENTINEL: u32 = 0xB10C_E4D0;

#[derive(Clone, Copy)]
#[repr(C)]
struct Header {
    meta: BlockMeta,
    /// Offset of the physically preceding block, `NONE` for the first.
    prev_phys: u32,
    /// Whole block, header included; 0 for the sentinel.
    size: u32,
    cookie: u32,
    _reserved: [u32; 2],
}

/// Free-list links, stored in a free block's payload.
#[derive(Clone, Copy)]
#[repr(C)]
struct Links {
    next: u32,
    prev: u32,
}

/// Free space of a [`BlockAllocator`], from a walk over all blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeSpace {
    pub blocks: usize,
    /// Payload bytes of all free blocks.
    pub bytes: usize,
    /// Payload bytes of the largest free block.
    pub largest: usize,
}

struct Arena {
    chunk: SystemChunk,
    /// Offset of the sentinel header, which is the end of the block area.
    end: usize,
    fl_bitmap: u32,
    sl_bitmaps: [u32; FL_COUNT],
    heads: [[u32; SL_COUNT]; FL_COUNT],
}

struct BlockShared {
    name: &'static str,
    capacity: usize,
    counters: Counters,
    arena: Mutex<Arena>,
}

impl StatsSource for BlockShared {
    fn stats(&self) -> AllocatorStats {
        let mut stats = AllocatorStats {
            name: self.name,
            capacity: self.capacity as u64,
            ..Default::default()
        };
        self.counters.add_to(&mut stats);
        stats.peak_bytes = self.counters.peak_bytes();
        stats
    }

    fn for_each_live_block(&self, visit: &mut dyn FnMut(LiveBlock)) -> Result<(), Busy> {
        let arena = lock_for_walk(&self.arena)?;
        let base = arena.chunk.base() as usize;
        arena.walk(&mut |offset, header| {
            if header.cookie == LIVE ^ offset as u32 {
                visit(header.meta.live_block(base + offset + HEADER));
            }
        });
        Ok(())
    }

    fn hold_for_fork(&self, held: &mut Vec<ForkHold>) {
        // SAFETY: the allocator is registered; the registry's lock outlives this hold.
        held.push(unsafe { hold_for_fork(&self.arena) });
    }
}

impl BlockShared {
    fn arena(&self) -> MutexGuard<'_, Arena> {
        self.arena.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A general-purpose allocator for one preallocated arena (design note 002). Thread-safe (one lock).
pub struct BlockAllocator {
    registration: Registration,
    shared: SystemBox<BlockShared>,
}

/// First and second level of the list that holds free blocks of `size`.
fn mapping(size: usize) -> (usize, usize) {
    if size < SMALL_BLOCK {
        (0, size / GRANULE)
    } else {
        let log2 = usize::BITS - 1 - size.leading_zeros();
        let second = (size >> (log2 - SL_LOG2)) ^ SL_COUNT;
        ((log2 - FL_SHIFT + 1) as usize, second)
    }
}

/// The first list whose every block holds `size` (rounds up to the next list boundary).
fn mapping_search(size: usize) -> Option<(usize, usize)> {
    let size = if size >= SMALL_BLOCK {
        size.checked_add((1 << (size.ilog2() - SL_LOG2)) - 1)?
    } else {
        size
    };
    let (first, second) = mapping(size);
    (first < FL_COUNT).then_some((first, second))
}

impl Arena {
    fn read<T: Copy>(&self, offset: usize) -> T {
        debug_assert!(offset + std::mem::size_of::<T>() <= self.chunk.len());
        // SAFETY: callers pass offsets of headers or payload links inside the zero-initialised chunk.
        unsafe { self.chunk.base().add(offset).cast::<T>().read_unaligned() }
    }

    fn write<T: Copy>(&mut self, offset: usize, value: T) {
        debug_assert!(offset + std::mem::size_of::<T>() <= self.chunk.len());
        // SAFETY: as in `read`; `&mut self` (under the allocator's lock) makes the write exclusive.
        unsafe {
            self.chunk
                .base()
                .add(offset)
                .cast::<T>()
                .write_unaligned(value)
        }
    }

    fn header(&self, offset: usize) -> Header {
        self.read(offset)
    }

    fn set_prev_phys(&mut self, offset: usize, prev_phys: usize) {
        let mut header = self.header(offset);
        header.prev_phys = prev_phys as u32;
        self.write(offset, header);
    }

    fn is_free(&self, offset: usize) -> bool {
        self.header(offset).cookie == FREE ^ offset as u32
    }

    fn insert_free(&mut self, offset: usize, size: usize, prev_phys: u32) {
        let header = Header {
            meta: BlockMeta::default(),
            prev_phys,
            size: size as u32,
            cookie: FREE ^ offset as u32,
            _reserved: [0; 2],
        };
        self.write(offset, header);
        self.set_prev_phys(offset + size, offset);
        let (first, second) = mapping(size);
        let head = self.heads[first][second];
        self.write(
            offset + HEADER,
            Links {
                next: head,
                prev: NONE,
            },
        );
        if head != NONE {
            let links: Links = self.read(head as usize + HEADER);
            self.write(
                head as usize + HEADER,
                Links {
                    prev: offset as u32,
                    ..links
                },
            );
        }
        self.heads[first][second] = offset as u32;
        self.fl_bitmap |= 1 << first;
        self.sl_bitmaps[first] |= 1 << second;
    }

    fn remove_free(&mut self, offset: usize, size: usize) {
        let (first, second) = mapping(size);
        let links: Links = self.read(offset + HEADER);
        if links.next != NONE {
            let next: Links = self.read(links.next as usize + HEADER);
            self.write(
                links.next as usize + HEADER,
                Links {
                    prev: links.prev,
                    ..next
                },
            );
        }
        if links.prev != NONE {
            let prev: Links = self.read(links.prev as usize + HEADER);
            self.write(
                links.prev as usize + HEADER,
                Links {
                    next: links.next,
                    ..prev
                },
            );
        } else {
            self.heads[first][second] = links.next;
            if links.next == NONE {
                self.sl_bitmaps[first] &= !(1 << second);
                if self.sl_bitmaps[first] == 0 {
                    self.fl_bitmap &= !(1 << first);
                }
            }
        }
    }

    /// A free block from the first non-empty list at or above `(first, second)`.
    fn find_free(&self, first: usize, second: usize) -> Option<usize> {
        let in_first = self.sl_bitmaps[first] & (u32::MAX << second);
        let (first, second) = if in_first != 0 {
            (first, in_first.trailing_zeros() as usize)
        } else {
            let above = self.fl_bitmap & u32::MAX.checked_shl(first as u32 + 1).unwrap_or(0);
            if above == 0 {
                return None;
            }
            let first = above.trailing_zeros() as usize;
            (first, self.sl_bitmaps[first].trailing_zeros() as usize)
        };
        Some(self.heads[first][second] as usize)
    }

    /// Allocates and returns the payload offset.
    fn allocate(&mut self, size: usize, align: usize, tag: u32) -> Option<usize> {
        if !align.is_power_of_two() || size > u32::MAX as usize {
            return None;
        }
        let align = align.max(GRANULE);
        let needed = HEADER + size.max(1).next_multiple_of(GRANULE);
        // An over-aligned request may need a leading free block of at least MIN_BLOCK before it.
        let search = if align > GRANULE {
            needed.checked_add(align + MIN_BLOCK)?
        } else {
            needed
        };
        let (first, second) = mapping_search(search)?;
        let mut offset = self.find_free(first, second)?;
        let mut header = self.header(offset);
        let mut block_size = header.size as usize;
        self.remove_free(offset, block_size);
        let base = self.chunk.base() as usize;
        let mut gap = align_up(base + offset + HEADER, align)? - (base + offset + HEADER);
        if gap != 0 && gap < MIN_BLOCK {
            gap += align_up(MIN_BLOCK - gap, align)?;
        }
        if gap != 0 {
            self.insert_free(offset, gap, header.prev_phys);
            header.prev_phys = offset as u32;
            offset += gap;
            block_size -= gap;
        }
        if block_size - needed >= MIN_BLOCK {
            self.insert_free(offset + needed, block_size - needed, offset as u32);
            block_size = needed;
        } else {
            self.set_prev_phys(offset + block_size, offset);
        }
        let meta = BlockMeta::new(size, tag);
        self.write(
            offset,
            Header {
                meta,
                size: block_size as u32,
                cookie: LIVE ^ offset as u32,
                ..header
            },
        );
        Some(offset + HEADER)
    }

    /// Validates the payload offset of a live block and returns its header offset.
    fn live_block_at(&self, payload: usize) -> Result<usize, FreeError> {
        if payload < HEADER || !payload.is_multiple_of(GRANULE) || payload > self.end {
            return Err(FreeError::Interior);
        }
        let offset = payload - HEADER;
        let header = self.header(offset);
        if header.cookie == FREE ^ offset as u32 {
            return Err(FreeError::DoubleFree);
        }
        let size = header.size as usize;
        let plausible = size >= MIN_BLOCK
            && offset + size <= self.end
            && self.header(offset + size).prev_phys == offset as u32;
        if header.cookie != LIVE ^ offset as u32 || !plausible {
            return Err(FreeError::Interior);
        }
        Ok(offset)
    }

    /// Frees the block at header `offset`, merging it with free neighbours; returns the requested size.
    fn release(&mut self, offset: usize) -> usize {
        let header = self.header(offset);
        // Marked free first, so a later free of this pointer is a double free even after merging.
        self.write(
            offset,
            Header {
                cookie: FREE ^ offset as u32,
                ..header
            },
        );
        let (mut start, mut size) = (offset, header.size as usize);
        let next = offset + size;
        if self.is_free(next) {
            let next_size = self.header(next).size as usize;
            self.remove_free(next, next_size);
            size += next_size;
        }
        let mut prev_phys = header.prev_phys;
        if prev_phys != NONE && self.is_free(prev_phys as usize) {
            let prev = self.header(prev_phys as usize);
            self.remove_free(prev_phys as usize, prev.size as usize);
            start = prev_phys as usize;
            size += prev.size as usize;
            prev_phys = prev.prev_phys;
        }
        self.insert_free(start, size, prev_phys);
        header.meta.size as usize
    }

    /// Calls `visit(offset, header)` for every block in address order.
    fn walk(&self, visit: &mut dyn FnMut(usize, &Header)) {
        let mut offset = 0;
        while offset < self.end {
            let header = self.header(offset);
            visit(offset, &header);
            offset += header.size as usize;
        }
    }
}

impl BlockAllocator {
    /// Acquires an arena of `capacity` bytes (headers included; at most 4 GiB) from `System`.
    pub fn new(name: &'static str, capacity: usize) -> Result<Self, CreateError> {
        let usable = capacity / GRANULE * GRANULE;
        if usable < MIN_BLOCK || usable >= NONE as usize - HEADER {
            return Err(CreateError::InvalidConfig(
                "block arena must hold 48 bytes to 4 GiB",
            ));
        }
        let chunk =
            SystemChunk::zeroed(usable + HEADER, GRANULE).ok_or(CreateError::OutOfMemory)?;
        let mut arena = Arena {
            chunk,
            end: usable,
            fl_bitmap: 0,
            sl_bitmaps: [0; FL_COUNT],
            heads: [[NONE; SL_COUNT]; FL_COUNT],
        };
        let sentinel = Header {
            meta: BlockMeta::default(),
            prev_phys: 0,
            size: 0,
            cookie: SENTINEL ^ usable as u32,
            _reserved: [0; 2],
        };
        arena.write(usable, sentinel);
        arena.insert_free(0, usable, NONE);
        let (base, len) = (arena.chunk.base() as usize, arena.chunk.len());
        let shared = BlockShared {
            name,
            capacity: usable,
            counters: Counters::default(),
            arena: Mutex::new(arena),
        };
        let shared = SystemBox::new(shared).ok_or(CreateError::OutOfMemory)?;
        let source: &dyn StatsSource = &*shared;
        // SAFETY: `shared` lives in `System` memory at a stable address and is dropped after `registration`.
        let registration = unsafe { Registration::new(name, AllocatorKind::Block, None, source) }?;
        registration.add_range(base, len)?;
        Ok(Self {
            registration,
            shared,
        })
    }

    fn arena(&self) -> MutexGuard<'_, Arena> {
        self.shared.arena()
    }

    /// `size` bytes aligned to `align` (a power of two), or `None` when no free block is large enough.
    pub fn alloc(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        self.alloc_tagged(size, align, 0)
    }

    /// [`BlockAllocator::alloc`] that records `tag` (the tracker's stack id) in the block's header.
    pub fn alloc_tagged(&self, size: usize, align: usize, tag: u32) -> Option<NonNull<u8>> {
        let mut arena = self.arena();
        let Some(payload) = arena.allocate(size, align, tag) else {
            self.shared.counters.record_failure();
            return None;
        };
        self.shared.counters.record_alloc(size);
        NonNull::new(arena.chunk.base().wrapping_add(payload))
    }

    /// Frees a block and merges it with free neighbours. Refuses foreign and interior pointers and blocks
    /// already free (`DoubleFree`), changing nothing.
    pub fn free(&self, ptr: *mut u8) -> Result<(), FreeError> {
        let mut arena = self.arena();
        let payload = arena
            .chunk
            .offset_of(ptr as usize)
            .ok_or(FreeError::Foreign)?;
        let offset = arena.live_block_at(payload)?;
        let size = arena.release(offset);
        self.shared.counters.record_frees(1, size as u64);
        Ok(())
    }

    /// Walks the arena and sums its free blocks.
    pub fn free_space(&self) -> FreeSpace {
        let mut space = FreeSpace {
            blocks: 0,
            bytes: 0,
            largest: 0,
        };
        self.arena().walk(&mut |offset, header| {
            if header.cookie == FREE ^ offset as u32 {
                let payload = header.size as usize - HEADER;
                space.blocks += 1;
                space.bytes += payload;
                space.largest = space.largest.max(payload);
            }
        });
        space
    }
}

registered_allocator!(BlockAllocator, shared);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::test_support::{assert_disjoint, Rng};
    use crate::engine::EngineAllocator;

    const ARENA: usize = 64 << 10;

    fn whole_arena() -> FreeSpace {
        FreeSpace {
            blocks: 1,
            bytes: ARENA - HEADER,
            largest: ARENA - HEADER,
        }
    }

    #[test]
    fn tlsf_lists_round_up_so_every_block_fits() {
        assert_eq!(mapping(48), (0, 3));
        assert_eq!(mapping(255), (0, 15));
        assert_eq!(mapping(256), (1, 0));
        assert_eq!(mapping(300), (1, 2));
        assert_eq!(mapping_search(300), Some((1, 3)));
        assert_eq!(mapping((1 << 32) - 16), (FL_COUNT - 1, SL_COUNT - 1));
        for size in (MIN_BLOCK..1 << 20).step_by(GRANULE * 7) {
            let (first, second) = mapping_search(size).unwrap();
            let (smallest_first, smallest_second) = mapping(size);
            assert!((first, second) >= (smallest_first, smallest_second));
        }
    }

    #[test]
    fn freeing_in_any_order_coalesces_to_one_block() {
        let blocks = BlockAllocator::new("blocks", ARENA).unwrap();
        assert_eq!(blocks.free_space(), whole_arena());
        let ptrs: Vec<_> = [10, 300, 5000, 1, 64]
            .iter()
            .map(|&size| blocks.alloc(size, 16).unwrap().as_ptr())
            .collect();
        for &index in &[1, 3, 0, 4, 2] {
            blocks.free(ptrs[index]).unwrap();
        }
        assert_eq!(blocks.free_space(), whole_arena());
        let stats = blocks.stats();
        assert_eq!(
            (
                stats.live_blocks,
                stats.live_bytes,
                stats.peak_bytes,
                stats.frees
            ),
            (0, 0, 5375, 5)
        );
    }

    #[test]
    fn over_aligned_blocks() {
        let blocks = BlockAllocator::new("aligned", ARENA).unwrap();
        for align in [16, 32, 64, 128, 4096] {
            let block = blocks.alloc(24, align).unwrap();
            assert_eq!(block.as_ptr() as usize % align, 0);
        }
        assert!(blocks.alloc(8, 24).is_none());
        for leak in blocks.leaks() {
            blocks.free(leak.address as *mut u8).unwrap();
        }
        assert_eq!(blocks.free_space(), whole_arena());
    }

    #[test]
    fn bad_frees_are_refused_and_change_nothing() {
        let blocks = BlockAllocator::new("blocks", 1024).unwrap();
        let a = blocks.alloc(100, 16).unwrap().as_ptr();
        let b = blocks.alloc(100, 16).unwrap().as_ptr();
        let before = (blocks.stats(), blocks.free_space());
        let mut outside = 0u64;
        assert_eq!(
            blocks.free(&mut outside as *mut u64 as *mut u8),
            Err(FreeError::Foreign)
        );
        assert_eq!(blocks.free(a.wrapping_add(16)), Err(FreeError::Interior));
        assert_eq!(blocks.free(a.wrapping_add(1)), Err(FreeError::Interior));
        assert_eq!(
            blocks.free(a.wrapping_sub(HEADER)),
            Err(FreeError::Interior)
        );
        assert_eq!(blocks.alloc(2000, 16), None);
        assert_eq!(
            (blocks.stats(), blocks.free_space()),
            (
                AllocatorStats {
                    failures: 1,
                    ..before.0
                },
                before.1
            )
        );
        blocks.free(a).unwrap();
        assert_eq!(blocks.free(a), Err(FreeError::DoubleFree));
        blocks.free(b).unwrap();
        assert_eq!(
            blocks.free(b),
            Err(FreeError::DoubleFree),
            "still caught after merging with its neighbour"
        );
        assert_eq!(blocks.stats().live_blocks, 0);
        assert_eq!(blocks.free_space().blocks, 1);
    }

    #[test]
    fn random_sequences_match_a_model() {
        let blocks = BlockAllocator::new("model", ARENA).unwrap();
        let mut rng = Rng::new(42);
        let mut live: Vec<(usize, usize)> = Vec::new();
        for step in 0..30_000 {
            if live.is_empty() || rng.next() % 5 < 3 {
                let size = if rng.next().is_multiple_of(8) {
                    rng.range(1000, 9000)
                } else {
                    rng.range(0, 200)
                };
                let align = 1 << rng.range(0, 8);
                if let Some(block) = blocks.alloc(size, align) {
                    assert_eq!(block.as_ptr() as usize % align, 0);
                    live.push((block.as_ptr() as usize, size.max(1)));
                }
            } else {
                let (address, _) = live.swap_remove(rng.range(0, live.len() - 1));
                blocks.free(address as *mut u8).unwrap();
            }
            let stats = blocks.stats();
            assert_eq!(stats.live_blocks, live.len() as u64);
            if step % 1000 == 0 {
                assert_disjoint(&mut live.clone());
                let mut listed: Vec<_> = blocks
                    .leaks()
                    .iter()
                    .map(|leak| (leak.address, leak.size.max(1)))
                    .collect();
                listed.sort_unstable();
                let mut expected = live.clone();
                expected.sort_unstable();
                assert_eq!(listed, expected);
                check_invariants(&blocks.arena());
            }
        }
        for (address, _) in live.drain(..) {
            blocks.free(address as *mut u8).unwrap();
        }
        assert_eq!(blocks.free_space(), whole_arena());
        check_invariants(&blocks.arena());
    }

    /// Boundary tags agree, no two free blocks touch, and every free block is on the list its size maps to.
    fn check_invariants(arena: &Arena) {
        let (mut prev, mut prev_free, mut free_blocks) = (NONE as usize, false, 0);
        arena.walk(&mut |offset, header| {
            assert_eq!(header.prev_phys as usize, prev);
            let free = header.cookie == FREE ^ offset as u32;
            assert!(!(free && prev_free), "adjacent free blocks at {offset}");
            free_blocks += free as usize;
            (prev, prev_free) = (offset, free);
        });
        let mut listed = 0;
        for first in 0..FL_COUNT {
            for second in 0..SL_COUNT {
                let mut offset = arena.heads[first][second];
                assert_eq!(offset != NONE, arena.sl_bitmaps[first] & (1 << second) != 0);
                while offset != NONE {
                    assert_eq!(
                        mapping(arena.header(offset as usize).size as usize),
                        (first, second)
                    );
                    listed += 1;
                    offset = arena.read::<Links>(offset as usize + HEADER).next;
                }
            }
        }
        assert_eq!(listed, free_blocks);
    }
}
