//! Equal-size slots in one memory range: a side array of 16-byte per-slot records (a state that catches
//! double frees, and the tracker's record), and intrusive free chains (the next index in each free slot).

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use super::system_memory::SystemSlice;
use super::{BlockMeta, FreeError, LiveBlock};

const NO_SLOT: u32 = u32::MAX;
const FREE: u32 = 0;
const LIVE: u32 = 1;

/// A slot's state and tracker record, in atomics so live blocks can be listed while other threads allocate.
/// One record per 16 bytes, so an allocation or free writes one cache line of side data, shared with only
/// three other slots (separate state and record arrays made two threads' writes collide far more often).
#[derive(Default)]
#[repr(C, align(16))]
struct SlotRecord {
    state: AtomicU32,
    epoch: AtomicU32,
    size: AtomicU32,
    tag: AtomicU32,
}

/// The slots of one pool class or one typed-pool batch. `&self` methods touch only the slot they are given;
/// the free list is a separate [`FreeList`] the owner keeps under a lock.
pub(crate) struct Slots {
    base: *mut u8,
    slot_size: usize,
    count: u32,
    records: SystemSlice<SlotRecord>,
}

// SAFETY: `Slots` manages the range at `base`, which its owner keeps alive and frees after it; the slot
// memory is written only by the thread that holds the slot (handed out, or in a list under its lock).
unsafe impl Send for Slots {}
// SAFETY: as above; the shared per-slot state is atomic.
unsafe impl Sync for Slots {}

/// An intrusive chain of free slots: each slot's first 4 bytes hold the next index.
#[derive(Clone, Copy)]
pub(crate) struct Chain {
    head: u32,
    len: u32,
}

impl Chain {
    pub(crate) const EMPTY: Chain = Chain {
        head: NO_SLOT,
        len: 0,
    };

    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }
}

/// A stack of whole chains of one length; bytes 4..8 of a chain's first slot link the next chain.
#[derive(Clone, Copy)]
pub(crate) struct ChainStack {
    top: u32,
    chains: u32,
}

impl ChainStack {
    pub(crate) const EMPTY: ChainStack = ChainStack {
        top: NO_SLOT,
        chains: 0,
    };

    pub(crate) fn chains(&self) -> usize {
        self.chains as usize
    }
}

/// The free slots an owner keeps under its lock: single slots, a stack of whole chains of `batch_len` slots,
/// and the never-used tail.
pub(crate) struct FreeList {
    single: Chain,
    batches: ChainStack,
    batch_len: u32,
    /// Slots `untouched..count` were never handed out, so no set-up pass links them.
    untouched: u32,
}

impl FreeList {
    /// `batch_len`: the length of every chain given to [`Slots::put_chain`].
    pub(crate) const fn new(batch_len: u32) -> Self {
        Self {
            single: Chain::EMPTY,
            batches: ChainStack::EMPTY,
            batch_len,
            untouched: 0,
        }
    }
}

impl Slots {
    /// Manages `count` slots of `slot_size` bytes at `base`; `None` if the side arrays cannot be allocated.
    pub(crate) fn new(base: *mut u8, slot_size: usize, count: usize) -> Option<Self> {
        let count = u32::try_from(count).ok().filter(|&count| count < NO_SLOT)?;
        Some(Self {
            base,
            slot_size,
            count,
            records: SystemSlice::try_from_fn(count as usize, |_| Some(SlotRecord::default()))?,
        })
    }

    /// Index of the slot starting at `addr`: `Foreign` outside the range, `Interior` off a slot boundary.
    pub(crate) fn index_of(&self, addr: usize) -> Result<u32, FreeError> {
        let offset = addr.wrapping_sub(self.base as usize);
        if offset >= self.slot_size * self.count as usize {
            return Err(FreeError::Foreign);
        }
        let (index, rest) = if self.slot_size.is_power_of_two() {
            (
                offset >> self.slot_size.trailing_zeros(),
                offset & (self.slot_size - 1),
            )
        } else {
            (offset / self.slot_size, offset % self.slot_size)
        };
        if rest != 0 {
            return Err(FreeError::Interior);
        }
        Ok(index as u32)
    }

    fn slot(&self, index: u32) -> *mut u8 {
        self.base.wrapping_add(index as usize * self.slot_size)
    }

    /// Marks free slot `index` live as a `size`-byte block with `tag` and returns its address.
    pub(crate) fn claim(&self, index: u32, size: usize, tag: u32) -> *mut u8 {
        let meta = BlockMeta::new(size, tag);
        let record = &self.records[index as usize];
        record.epoch.store(meta.epoch, Relaxed);
        record.size.store(meta.size, Relaxed);
        record.tag.store(meta.tag, Relaxed);
        record.state.store(LIVE, Relaxed);
        self.slot(index)
    }

    /// Marks live slot `index` free and gives its size; a slot already free is a double free.
    ///
    /// A plain load and store, not a swap: a locked instruction costs more than the rest of a pool free
    /// (measured 4.5 ns against 0.3 ns). Every double free ordered after the first free (same thread, or a
    /// thread that learned of the pointer through any synchronisation) is caught; only two frees of one
    /// block racing each other on two threads, a data race in the program itself, may both pass.
    pub(crate) fn release(&self, index: u32) -> Result<usize, FreeError> {
        let record = &self.records[index as usize];
        if record.state.load(Relaxed) == FREE {
            return Err(FreeError::DoubleFree);
        }
        record.state.store(FREE, Relaxed);
        Ok(record.size.load(Relaxed) as usize)
    }

    pub(crate) fn is_live(&self, index: u32) -> bool {
        self.records[index as usize].state.load(Relaxed) == LIVE
    }

    pub(crate) fn has_free(&self, list: &FreeList) -> bool {
        list.single.len > 0 || list.batches.chains > 0 || list.untouched < self.count
    }

    fn read_link(&self, index: u32, word: usize) -> u32 {
        // SAFETY: `index` is a free slot inside the range, not handed out; slots are at least 8 bytes.
        unsafe { self.slot(index).cast::<u32>().add(word).read_unaligned() }
    }

    fn write_link(&self, index: u32, word: usize, link: u32) {
        // SAFETY: as in `read_link`; whoever holds a free slot (a chain's owner) is its only writer.
        unsafe {
            self.slot(index)
                .cast::<u32>()
                .add(word)
                .write_unaligned(link)
        }
    }

    /// Takes a slot off `chain` (still marked free; [`Slots::claim`] it). Reads the slot's first bytes, which
    /// the caller of an allocation is about to touch anyway.
    pub(crate) fn chain_pop(&self, chain: &mut Chain) -> Option<u32> {
        let index = (chain.len > 0).then_some(chain.head)?;
        chain.head = self.read_link(index, 0);
        chain.len -= 1;
        Some(index)
    }

    /// Puts a released slot on `chain`, overwriting its first 4 bytes.
    pub(crate) fn chain_push(&self, chain: &mut Chain, index: u32) {
        self.write_link(index, 0, chain.head);
        chain.head = index;
        chain.len += 1;
    }

    /// Takes a slot off `list`: a single one, else the first of a whole chain, else a never-used one.
    pub(crate) fn pop(&self, list: &mut FreeList) -> Option<u32> {
        if list.single.len == 0 {
            if let Some(chain) = self.pop_chain(&mut list.batches, list.batch_len) {
                list.single = chain;
            }
        }
        self.chain_pop(&mut list.single).or_else(|| {
            let index = (list.untouched < self.count).then_some(list.untouched)?;
            list.untouched += 1;
            Some(index)
        })
    }

    /// Puts a released slot on `list`.
    pub(crate) fn push(&self, list: &mut FreeList, index: u32) {
        self.chain_push(&mut list.single, index);
    }

    /// Pushes a whole chain on `stack` in O(1).
    pub(crate) fn push_chain(&self, stack: &mut ChainStack, chain: Chain) {
        self.write_link(chain.head, 1, stack.top);
        stack.top = chain.head;
        stack.chains += 1;
    }

    /// Pops a whole chain off `stack` (all of its chains hold `len` slots) in O(1).
    pub(crate) fn pop_chain(&self, stack: &mut ChainStack, len: u32) -> Option<Chain> {
        let head = (stack.chains > 0).then_some(stack.top)?;
        stack.top = self.read_link(head, 1);
        stack.chains -= 1;
        Some(Chain { head, len })
    }

    /// A whole chain off `list` in O(1) if there is one, else up to `batch_len` slots gathered one by one.
    pub(crate) fn take_chain(&self, list: &mut FreeList) -> Chain {
        if let Some(chain) = self.pop_chain(&mut list.batches, list.batch_len) {
            return chain;
        }
        let mut chain = Chain::EMPTY;
        while chain.len < list.batch_len {
            let Some(index) = self.pop(list) else { break };
            self.chain_push(&mut chain, index);
        }
        chain
    }

    /// Gives `list` a chain of exactly `batch_len` slots in O(1).
    pub(crate) fn put_chain(&self, list: &mut FreeList, chain: Chain) {
        debug_assert_eq!(chain.len, list.batch_len);
        self.push_chain(&mut list.batches, chain);
    }

    pub(crate) fn for_each_live(&self, visit: &mut dyn FnMut(LiveBlock)) {
        for index in (0..self.count).filter(|&index| self.is_live(index)) {
            let meta = &self.records[index as usize];
            let record = BlockMeta {
                epoch: meta.epoch.load(Relaxed),
                size: meta.size.load(Relaxed),
                tag: meta.tag.load(Relaxed),
            };
            visit(record.live_block(self.slot(index) as usize));
        }
    }
}
