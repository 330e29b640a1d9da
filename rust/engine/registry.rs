//! Registry of live engine allocators: pointer-to-allocator lookups by address range, and process-wide memstats.

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{AllocatorInfo, AllocatorKind, AllocatorStats, CreateError, StatsSource};

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

#[derive(Clone, Copy)]
struct AddressRange {
    start: usize,
    end: usize,
    slot: u16,
}

struct Registry {
    slots: [Option<Registered>; MAX_ALLOCATORS],
    ranges: [AddressRange; MAX_RANGES],
    range_count: usize,
    next_id: u32,
    /// Events of allocators already dropped, so totals never go backwards.
    retired: MemStats,
    /// Totals at the last reset.
    baseline: MemStats,
}

// SAFETY: `source` pointers are dereferenced only under the registry lock, and `Registration::drop`
// removes them before the allocator they point into is freed. `StatsSource: Sync`.
unsafe impl Send for Registry {}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    slots: [const { None }; MAX_ALLOCATORS],
    ranges: [AddressRange {
        start: 0,
        end: 0,
        slot: 0,
    }; MAX_RANGES],
    range_count: 0,
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
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
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

impl Registry {
    fn range_containing(&self, addr: usize) -> Option<&AddressRange> {
        let ranges = &self.ranges[..self.range_count];
        let after = ranges.partition_point(|range| range.start <= addr);
        ranges[..after].last().filter(|range| addr < range.end)
    }

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
        let mut registry = registry();
        let count = registry.range_count;
        if count == MAX_RANGES {
            return Err(CreateError::RegistryFull);
        }
        let at = registry.ranges[..count].partition_point(|range| range.start < start);
        registry.ranges.copy_within(at..count, at + 1);
        registry.ranges[at] = AddressRange {
            start,
            end: start + len,
            slot: self.slot,
        };
        registry.range_count += 1;
        Ok(())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut registry = registry();
        if let Some(registered) = registry.slots[self.slot as usize].take() {
            // SAFETY: the source is still alive: the allocator drops its registration first.
            let last = unsafe { &*registered.source }.stats();
            registry.retired.add(&last);
        }
        let count = registry.range_count;
        let mut kept = 0;
        for index in 0..count {
            if registry.ranges[index].slot != self.slot {
                registry.ranges[kept] = registry.ranges[index];
                kept += 1;
            }
        }
        registry.range_count = kept;
    }
}

/// The live engine allocator whose memory holds `ptr` (any address inside a block counts).
pub fn allocator_of(ptr: *const u8) -> Option<AllocatorInfo> {
    let registry = registry();
    let range = registry.range_containing(ptr as usize)?;
    registry.slots[range.slot as usize]
        .as_ref()
        .map(|registered| registered.info)
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
