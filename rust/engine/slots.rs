//! Equal-size slots in one memory range: an intrusive index free list, a live bitmap that catches double frees,
//! and a side array of per-slot [`BlockMeta`] for the tracker.

use super::system_memory::SystemSlice;
use super::{BlockMeta, FreeError, LiveBlock};

const NO_SLOT: u32 = u32::MAX;

/// The slots of one pool class or one typed-pool batch. Not synchronised: the owner wraps it in a lock.
pub(crate) struct Slots {
    base: *mut u8,
    slot_size: usize,
    count: u32,
    /// First free slot that has been used before; its successor index is stored in its first 4 bytes.
    head: u32,
    /// Slots `untouched..count` were never handed out, so the free list needs no set-up pass.
    untouched: u32,
    live: SystemSlice<u64>,
    meta: SystemSlice<BlockMeta>,
}

// SAFETY: `Slots` exclusively manages the range at `base`, which outlives it (its owner frees the range
// after dropping it); moving it between threads moves that management along.
unsafe impl Send for Slots {}

impl Slots {
    /// Manages `count` slots of `slot_size` bytes at `base`; `None` if the side arrays cannot be allocated.
    pub(crate) fn new(base: *mut u8, slot_size: usize, count: usize) -> Option<Self> {
        let count = u32::try_from(count).ok().filter(|&count| count < NO_SLOT)?;
        Some(Self {
            base,
            slot_size,
            count,
            head: NO_SLOT,
            untouched: 0,
            live: SystemSlice::try_from_fn((count as usize).div_ceil(64), |_| Some(0))?,
            meta: SystemSlice::try_from_fn(count as usize, |_| Some(BlockMeta::default()))?,
        })
    }

    pub(crate) fn has_free(&self) -> bool {
        self.head != NO_SLOT || self.untouched < self.count
    }

    /// Index of the slot starting at `addr`: `Foreign` outside the range, `Interior` off a slot boundary.
    pub(crate) fn index_of(&self, addr: usize) -> Result<u32, FreeError> {
        let offset = addr.wrapping_sub(self.base as usize);
        if offset >= self.slot_size * self.count as usize {
            return Err(FreeError::Foreign);
        }
        if !offset.is_multiple_of(self.slot_size) {
            return Err(FreeError::Interior);
        }
        Ok((offset / self.slot_size) as u32)
    }

    fn slot(&self, index: u32) -> *mut u8 {
        self.base.wrapping_add(index as usize * self.slot_size)
    }

    pub(crate) fn is_live(&self, index: u32) -> bool {
        self.live[index as usize / 64] & (1 << (index % 64)) != 0
    }

    fn flip_live(&mut self, index: u32) {
        self.live[index as usize / 64] ^= 1 << (index % 64);
    }

    /// Hands out a free slot recorded as a `size`-byte block with `tag`.
    pub(crate) fn take(&mut self, size: usize, tag: u32) -> Option<*mut u8> {
        let index = if self.head != NO_SLOT {
            let index = self.head;
            // SAFETY: `index` is a free slot inside the range; its first 4 bytes hold the next free index.
            self.head = unsafe { self.slot(index).cast::<u32>().read_unaligned() };
            index
        } else if self.untouched < self.count {
            self.untouched += 1;
            self.untouched - 1
        } else {
            return None;
        };
        self.flip_live(index);
        self.meta[index as usize] = BlockMeta::new(size, tag);
        Some(self.slot(index))
    }

    /// Returns slot `index` to the free list; its previous contents are overwritten. Gives the freed size.
    pub(crate) fn give_back(&mut self, index: u32) -> Result<usize, FreeError> {
        if !self.is_live(index) {
            return Err(FreeError::DoubleFree);
        }
        self.flip_live(index);
        // SAFETY: `index` is a slot inside the range, no longer handed out; slots are at least 8 bytes.
        unsafe { self.slot(index).cast::<u32>().write_unaligned(self.head) };
        self.head = index;
        Ok(self.meta[index as usize].size as usize)
    }

    pub(crate) fn for_each_live(&self, visit: &mut dyn FnMut(LiveBlock)) {
        for index in (0..self.untouched).filter(|&index| self.is_live(index)) {
            visit(self.meta[index as usize].live_block(self.slot(index) as usize));
        }
    }
}
