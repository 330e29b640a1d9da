//! Equal-size slots in one memory range: a side array of 16-byte per-slot records (a state that catches
//! double frees, and the tracker's record), and intrusive free chains (the next index in each free slot).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::system_memory::SystemSlice;
use super::{BlockMeta, FreeError, LiveBlock};

const NO_SLOT: u32 = u32::MAX;
/// Set in [`SlotRecord::state_size`] while the slot is live; the low 32 bits hold the requested size.
const LIVE: u64 = 1 << 32;

/// A slot's state and tracker record, in atomics so live blocks can be listed while other threads allocate.
/// Two words, so an allocation writes the record with two stores and a free checks and clears it with one
/// load and one store; one record per 16 bytes, so both touch one cache line of side data.
#[derive(Default)]
#[repr(C, align(16))]
struct SlotRecord {
    /// `LIVE | size` while live, 0 while free.
    state_size: AtomicU64,
    /// `epoch | tag << 32`, meaningful while live.
    epoch_tag: AtomicU64,
}

/// Where a range's slots and records are: copied next to a thread's magazine so the fast path reads no
/// other line to find a slot and its record.
#[derive(Clone, Copy)]
pub(crate) struct SlotsView {
    base: *mut u8,
    records: *const SlotRecord,
    slot_size: u32,
    /// `log2(slot_size)` for a power of two, else [`NOT_POW2`]: a free then shifts instead of dividing.
    shift: u32,
}

const NOT_POW2: u32 = u32::MAX;

// SAFETY: a view addresses the slot range, which the owner of its `Slots` keeps alive and frees after it,
// and the records, which the `Slots` owns; slot memory is written only by the thread that holds the slot
// (handed out, or in a list or magazine of its owner), and the records are atomic.
unsafe impl Send for SlotsView {}
// SAFETY: as above.
unsafe impl Sync for SlotsView {}

impl SlotsView {
    /// Index of the slot starting at `offset` bytes from `base`: `Interior` off a slot boundary. The caller
    /// has checked that `offset` lies inside the range.
    #[inline]
    pub(crate) fn index_at(&self, offset: usize) -> Result<u32, FreeError> {
        let (index, rest) = if self.shift != NOT_POW2 {
            (offset >> self.shift, offset & (self.slot_size as usize - 1))
        } else {
            let slot_size = self.slot_size as usize;
            (offset / slot_size, offset % slot_size)
        };
        if rest != 0 {
            return Err(FreeError::Interior);
        }
        Ok(index as u32)
    }

    /// The largest power of two dividing the slot size: every slot is aligned to it.
    #[inline]
    pub(crate) fn slot_align(&self) -> usize {
        1 << self.slot_size.trailing_zeros()
    }

    #[inline]
    fn slot(&self, index: u32) -> *mut u8 {
        self.base
            .wrapping_add(index as usize * self.slot_size as usize)
    }

    /// # Safety
    /// `index` is below the slot count of the range this view describes.
    #[inline]
    unsafe fn record(&self, index: u32) -> &SlotRecord {
        // SAFETY: the caller keeps `index` in range; the records live as long as the `Slots`, which
        // outlives every view of it.
        unsafe { &*self.records.add(index as usize) }
    }

    /// Marks free slot `index` live as a `size`-byte block with `tag` and returns its address.
    ///
    /// # Safety
    /// `index` is a slot of this range, free and held by the caller.
    #[inline]
    pub(crate) unsafe fn claim(&self, index: u32, size: usize, tag: u32) -> *mut u8 {
        let meta = BlockMeta::new(size, tag);
        // SAFETY: the caller keeps `index` in range.
        let record = unsafe { self.record(index) };
        record
            .epoch_tag
            .store(u64::from(meta.epoch) | u64::from(meta.tag) << 32, Relaxed);
        record
            .state_size
            .store(LIVE | u64::from(meta.size), Relaxed);
        self.slot(index)
    }

    /// Marks live slot `index` free and gives its size; a slot already free is a double free.
    ///
    /// A plain load and store, not a swap: a locked instruction costs more than the rest of a pool free
    /// (measured 4.5 ns against 0.3 ns). Every double free ordered after the first free (same thread, or a
    /// thread that learned of the pointer through any synchronisation) is caught; only two frees of one
    /// block racing each other on two threads, a data race in the program itself, may both pass.
    ///
    /// # Safety
    /// `index` is a slot of this range.
    #[inline]
    pub(crate) unsafe fn release(&self, index: u32) -> Result<usize, FreeError> {
        // SAFETY: the caller keeps `index` in range.
        let record = unsafe { self.record(index) };
        let state_size = record.state_size.load(Relaxed);
        if state_size & LIVE == 0 {
            return Err(FreeError::DoubleFree);
        }
        record.state_size.store(0, Relaxed);
        Ok(state_size as u32 as usize)
    }
}

/// The slots of one pool class or one typed-pool batch. `&self` methods touch only the slot they are given;
/// the free list is a separate [`FreeList`] the owner keeps under a lock.
pub(crate) struct Slots {
    view: SlotsView,
    count: u32,
    /// Owns the records `view` points to.
    records: SystemSlice<SlotRecord>,
}

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
    /// Manages `count` slots of `slot_size` bytes at `base`; `None` if the side arrays cannot be allocated
    /// or the slots are 4 GiB or larger.
    pub(crate) fn new(base: *mut u8, slot_size: usize, count: usize) -> Option<Self> {
        let count = u32::try_from(count).ok().filter(|&count| count < NO_SLOT)?;
        let slot_size = u32::try_from(slot_size).ok()?;
        let records = SystemSlice::try_from_fn(count as usize, |_| Some(SlotRecord::default()))?;
        Some(Self {
            view: SlotsView {
                base,
                records: records.as_ptr(),
                slot_size,
                shift: if slot_size.is_power_of_two() {
                    slot_size.trailing_zeros()
                } else {
                    NOT_POW2
                },
            },
            count,
            records,
        })
    }

    pub(crate) fn view(&self) -> SlotsView {
        self.view
    }

    /// Index of the slot starting at `addr`: `Foreign` outside the range, `Interior` off a slot boundary.
    pub(crate) fn index_of(&self, addr: usize) -> Result<u32, FreeError> {
        let offset = addr.wrapping_sub(self.view.base as usize);
        if offset >= self.view.slot_size as usize * self.count as usize {
            return Err(FreeError::Foreign);
        }
        self.view.index_at(offset)
    }

    fn slot(&self, index: u32) -> *mut u8 {
        self.view.slot(index)
    }

    /// Marks free slot `index` live as a `size`-byte block with `tag` and returns its address.
    pub(crate) fn claim(&self, index: u32, size: usize, tag: u32) -> *mut u8 {
        assert!(index < self.count);
        // SAFETY: `index` is in range, checked just above.
        unsafe { self.view.claim(index, size, tag) }
    }

    /// As [`SlotsView::release`], for an index from [`Slots::index_of`].
    pub(crate) fn release(&self, index: u32) -> Result<usize, FreeError> {
        assert!(index < self.count);
        // SAFETY: `index` is in range, checked just above.
        unsafe { self.view.release(index) }
    }

    pub(crate) fn is_live(&self, index: u32) -> bool {
        self.records[index as usize].state_size.load(Relaxed) & LIVE != 0
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
        for (index, record) in (0..self.count).zip(self.records.iter()) {
            let state_size = record.state_size.load(Relaxed);
            if state_size & LIVE == 0 {
                continue;
            }
            let epoch_tag = record.epoch_tag.load(Relaxed);
            let meta = BlockMeta {
                epoch: epoch_tag as u32,
                size: state_size as u32,
                tag: (epoch_tag >> 32) as u32,
            };
            visit(meta.live_block(self.slot(index) as usize));
        }
    }
}
