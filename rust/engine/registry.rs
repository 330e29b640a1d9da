//! Registry of engine allocators: pointer lookups by address range, process-wide memstats, and every live or
//! retired (dropped while live) block for the leak report.

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::ForkHold;
use super::{
    lock_for_walk, AllocatorInfo, AllocatorKind, AllocatorStats, Busy, Checkpoint, CreateError,
    LiveBlock, StatsSource,
};

const MAX_ALLOCATORS: usize = 256;
const MAX_RANGES: usize = 1024;

/// Allocation events summed over all engine allocators since the last `memstats(true)`, plus what is live now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemStats {
    pub allocations: u64,
    pub frees: u64,
    pub failures: u64,
    pub live_blocks: u64,
    pub live_bytes: u64,
}

struct Registered {
    info: AllocatorInfo,
    source: *const dyn StatsSource,
}

/// Blocks still live in one allocator (or left live when it was dropped), from [`leaks_since`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatorLeaks {
    pub info: AllocatorInfo,
    pub blocks: u64,
    pub bytes: u64,
}

#[derive(Clone, Copy)]
struct AddressRange {
    start: usize,
    end: usize,
    info: AllocatorInfo,
}

struct Registry {
    slots: [Option<Registered>; MAX_ALLOCATORS],
    next_id: u32,
    /// Events of allocators already dropped, so totals never go backwards.
    retired: MemStats,
    /// Totals at the last reset.
    baseline: MemStats,
    /// Blocks that were live when their allocator was dropped: leaks, although the memory is gone.
    retired_leaks: Vec<(AllocatorInfo, LiveBlock)>,
}

/// Address ranges sorted by start, under a lock of their own: a typed pool adds one while holding its batch
/// lock, and the report lists a typed pool's blocks (taking that lock) while holding the registry lock.
struct Ranges {
    ranges: [AddressRange; MAX_RANGES],
    count: usize,
}

// SAFETY: `source` pointers are dereferenced only under the registry lock, and `Registration::drop`
// removes them before the allocator they point into is freed. `StatsSource: Sync`.
unsafe impl Send for Registry {}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    slots: [const { None }; MAX_ALLOCATORS],
    next_id: 1,
    retired: MemStats {
        allocations: 0,
        frees: 0,
        failures: 0,
        live_blocks: 0,
        live_bytes: 0,
    },
    baseline: MemStats {
        allocations: 0,
        frees: 0,
        failures: 0,
        live_blocks: 0,
        live_bytes: 0,
    },
    retired_leaks: Vec::new(),
});

static RANGES: Mutex<Ranges> = Mutex::new(Ranges {
    ranges: [AddressRange {
        start: 0,
        end: 0,
        info: AllocatorInfo {
            id: 0,
            name: "",
            kind: AllocatorKind::Pool,
            element_type: None,
        },
    }; MAX_RANGES],
    count: 0,
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where the table of address ranges lies: its starts and ends are the allocators' chunks (one
/// chunk's end may be where the next one's first block starts), not the program's pointers, so a
/// leak scan skips it.
pub(crate) fn address_table_range() -> core::ops::Range<usize> {
    crate::sys::bytes_of(&RANGES)
}

fn ranges() -> MutexGuard<'static, Ranges> {
    RANGES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The registry's locks and every registered allocator's, held by `fork` (see `tracker::fork`)
/// and to be let go of in the reverse order: the registry, each allocator's (as its live-block
/// walks take them), then the address ranges (which a typed pool that grows takes inside its
/// own lock).
pub(crate) fn hold_for_fork(held: &mut Vec<ForkHold>) {
    let registry = registry();
    let sources: Vec<*const dyn StatsSource> = registry
        .slots
        .iter()
        .flatten()
        .map(|registered| registered.source)
        .collect();
    held.push(Box::new(registry));
    for source in sources {
        // SAFETY: registered sources are alive while in the registry, whose lock is held
        // until every allocator's hold is let go.
        unsafe { &*source }.hold_for_fork(held);
    }
    held.push(Box::new(ranges()));
}

impl MemStats {
    fn add(&mut self, stats: &AllocatorStats) {
        self.allocations += stats.allocations;
        self.frees += stats.frees;
        self.failures += stats.failures;
        self.live_blocks += stats.live_blocks;
        self.live_bytes += stats.live_bytes;
    }
}

impl Ranges {
    fn containing(&self, addr: usize) -> Option<&AddressRange> {
        let ranges = &self.ranges[..self.count];
        let after = ranges.partition_point(|range| range.start <= addr);
        ranges[..after].last().filter(|range| addr < range.end)
    }
}

impl Registry {
    fn totals(&self) -> MemStats {
        let mut totals = self.retired;
        totals.live_blocks = 0;
        totals.live_bytes = 0;
        for registered in self.slots.iter().flatten() {
            // SAFETY: registered sources are alive while in the registry (see `unsafe impl Send`).
            totals.add(&unsafe { &*registered.source }.stats());
        }
        totals
    }

    /// Every live block of the registered allocators, then the retired ones; the names of the
    /// allocators that stayed [`Busy`].
    fn for_each_live_block(
        &self,
        visit: &mut dyn FnMut(&AllocatorInfo, LiveBlock),
    ) -> Vec<&'static str> {
        let mut busy = Vec::new();
        for registered in self.slots.iter().flatten() {
            // SAFETY: registered sources are alive while in the registry (see `unsafe impl Send`).
            let source = unsafe { &*registered.source };
            if source
                .for_each_live_block(&mut |block| visit(&registered.info, block))
                .is_err()
            {
                busy.push(registered.info.name);
            }
        }
        for (info, block) in &self.retired_leaks {
            visit(info, *block);
        }
        busy
    }
}

/// An allocator's entry in the registry; dropping it removes the allocator and its address ranges.
pub(crate) struct Registration {
    slot: u16,
    info: AllocatorInfo,
}

impl Registration {
    /// # Safety
    /// `source` must stay valid until the returned `Registration` is dropped.
    pub(crate) unsafe fn new(
        name: &'static str,
        kind: AllocatorKind,
        element_type: Option<&'static str>,
        source: *const dyn StatsSource,
    ) -> Result<Self, CreateError> {
        let mut registry = registry();
        let slot = registry
            .slots
            .iter()
            .position(Option::is_none)
            .ok_or(CreateError::RegistryFull)?;
        let info = AllocatorInfo {
            id: registry.next_id,
            name,
            kind,
            element_type,
        };
        registry.next_id += 1;
        registry.slots[slot] = Some(Registered { info, source });
        Ok(Self {
            slot: slot as u16,
            info,
        })
    }

    pub(crate) fn info(&self) -> AllocatorInfo {
        self.info
    }

    /// Makes `allocator_of` answer for `[start, start + len)`, memory this allocator owns.
    pub(crate) fn add_range(&self, start: usize, len: usize) -> Result<(), CreateError> {
        let mut ranges = ranges();
        let count = ranges.count;
        if count == MAX_RANGES {
            return Err(CreateError::RegistryFull);
        }
        let at = ranges.ranges[..count].partition_point(|range| range.start < start);
        ranges.ranges.copy_within(at..count, at + 1);
        ranges.ranges[at] = AddressRange {
            start,
            end: start + len,
            info: self.info,
        };
        ranges.count += 1;
        Ok(())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // The retired-leak records are the tracker's own memory, not the program's.
        let _inside = crate::tracker::guard::Inside::enter();
        {
            let mut registry = registry();
            if let Some(registered) = registry.slots[self.slot as usize].take() {
                // SAFETY: the source is still alive: the allocator drops its registration first.
                let source = unsafe { &*registered.source };
                registry.retired.add(&source.stats());
                let mut left = Vec::new();
                // Busy only with a thread stuck inside the allocator being dropped.
                let _ = source.for_each_live_block(&mut |block| left.push((self.info, block)));
                registry.retired_leaks.extend(left);
            }
        }
        let mut ranges = ranges();
        let count = ranges.count;
        let mut kept = 0;
        for index in 0..count {
            if ranges.ranges[index].info.id != self.info.id {
                ranges.ranges[kept] = ranges.ranges[index];
                kept += 1;
            }
        }
        ranges.count = kept;
    }
}

/// The live engine allocator whose memory holds `ptr` (any address inside a block counts).
pub fn allocator_of(ptr: *const u8) -> Option<AllocatorInfo> {
    ranges().containing(ptr as usize).map(|range| range.info)
}

/// The element type name of the typed pool holding `ptr` (the design note's `p3dc_get_type`).
pub fn type_of(ptr: *const u8) -> Option<&'static str> {
    allocator_of(ptr)?.element_type
}

/// Allocations, frees and failures of all engine allocators since the last reset, and the blocks live now.
/// With `reset`, the next call counts from here: a frame loop that allocates nothing reads all zeros.
pub fn memstats(reset: bool) -> MemStats {
    let mut registry = registry();
    let totals = registry.totals();
    let baseline = registry.baseline;
    if reset {
        registry.baseline = totals;
    }
    MemStats {
        allocations: totals.allocations - baseline.allocations,
        frees: totals.frees - baseline.frees,
        failures: totals.failures - baseline.failures,
        live_blocks: totals.live_blocks,
        live_bytes: totals.live_bytes,
    }
}

/// Calls `visit` for every live block of every engine allocator, then for every block left live by an
/// allocator already dropped. `visit` must not use the engine allocators or the registry. `Ok` with
/// the names of the allocators whose lock stayed held (their blocks left out); [`Busy`] if the
/// registry's did (nothing visited).
pub fn for_each_live_block(
    visit: &mut dyn FnMut(&AllocatorInfo, LiveBlock),
) -> Result<Vec<&'static str>, Busy> {
    Ok(lock_for_walk(&REGISTRY)?.for_each_live_block(visit))
}

/// Blocks allocated since `since` and still live (or left live by a dropped allocator), per allocator in
/// order of creation; allocators without such blocks are left out.
pub fn leaks_since(since: Checkpoint) -> Vec<AllocatorLeaks> {
    let mut all: Vec<AllocatorLeaks> = Vec::new();
    let _ = for_each_live_block(&mut |info, block| {
        if block.epoch < since.0 {
            return;
        }
        let at = all.partition_point(|leaks| leaks.info.id < info.id);
        if all.get(at).is_none_or(|leaks| leaks.info.id != info.id) {
            all.insert(
                at,
                AllocatorLeaks {
                    info: *info,
                    blocks: 0,
                    bytes: 0,
                },
            );
        }
        all[at].blocks += 1;
        all[at].bytes += block.size as u64;
    });
    all
}
