//! Pools the program's own arenas report (`k15::memory::pool_alloc`, `pool_free`, `pool_reset`): the sub-blocks an engine's temp allocator or free list carves out of memory it holds, each kept with its size, stack and tag for the leak report and the profiler.
//!
//! A pool is created by name and known by a handle (its index + 1). Its sub-blocks are kept by
//! address in a map under one lock: a `pool_alloc` costs a stack capture and a map insert, off
//! the path of `new` and `delete`. Where a sub-block lies inside a live tracked block (the
//! arena's own `new[]` or `malloc`), that block is remembered as the pool's: its tag lends the
//! sub-block's bytes (`tracker::told`), and the report leaves it out of the leak candidates
//! while it holds live sub-blocks, as valgrind's memcheck does with a block that holds mempool
//! chunks. Misuse (a `pool_free` of no live sub-block, twice, or a `pool_alloc` over a live one)
//! is a memory error with the call's stack; the pool stays usable.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::stack::{StackId, StartFrame};
use crate::tracker::errors::{self, ErrorKind, MemoryError};
use crate::tracker::guard::Inside;
use crate::tracker::told::{self, Arena, ToldBlock};
use crate::tracker::BlockKind;

/// A pool's handle: 0 for none (a pool could not be created), else its index + 1.
pub type PoolHandle = u32;

/// One live sub-block.
#[derive(Clone, Copy, Debug)]
pub struct SubBlock {
    pub size: usize,
    pub told: ToldBlock,
    /// The live tracked block it lay in when allocated (its memory: see [`for_each_sub_block`]).
    pub arena: Option<Arena>,
}

/// Sub-blocks freed with `pool_free` that are remembered to tell a second free from a stray one.
const REMEMBERED_FREES: usize = 4096;

struct ClientPool {
    name: &'static str,
    live: BTreeMap<usize, SubBlock>,
    /// The tracked blocks its sub-blocks were found in, so that the next ones are found without
    /// searching the heap.
    arenas: Vec<Arena>,
    /// Recently freed sub-blocks: their size and allocation stack.
    freed: BTreeMap<usize, (usize, StackId)>,
}

static POOLS: Mutex<Vec<ClientPool>> = Mutex::new(Vec::new());

fn pools() -> MutexGuard<'static, Vec<ClientPool>> {
    POOLS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Held by `fork` (see `tracker::fork`): a child must not find the pools held by a thread that
/// was changing them at the fork.
pub(crate) fn lock_for_fork() -> MutexGuard<'static, impl Sized> {
    pools()
}

/// A new pool named `name` (the report's allocator of its sub-blocks); 0 if the tracker is busy
/// on this thread (a nested call).
pub fn create(name: &'static str) -> PoolHandle {
    let Some(_inside) = Inside::enter() else {
        return 0;
    };
    let mut pools = pools();
    pools.push(ClientPool {
        name,
        live: BTreeMap::new(),
        arenas: Vec::new(),
        freed: BTreeMap::new(),
    });
    pools.len() as PoolHandle
}

/// What went wrong with a call, reported once the pools' lock is let go.
struct Misuse {
    kind: ErrorKind,
    address: usize,
    /// The sub-block concerned, if any: its size and allocation stack.
    block: Option<(usize, StackId)>,
    pool: &'static str,
    detail: &'static str,
}

const NO_SUCH_POOL: &str = "no pool has this handle (pool_create returns them)";

/// `pool_alloc(pool, ptr, size)`: the program made a sub-block of `size` bytes at `ptr` in its
/// arena; its stack starts at `start`. One that overlaps live sub-blocks of the pool takes
/// their place (they are reported, and counted as freed).
pub fn alloc(pool: PoolHandle, ptr: usize, size: usize, start: StartFrame) {
    let mut misuse = Vec::new();
    {
        let mut pools = pools();
        let Some(p) = pool_mut(&mut pools, pool) else {
            drop(pools);
            return report(start, &[no_such_pool(ptr)]);
        };
        let arena = p.arena_holding(ptr, size);
        let end = ptr.saturating_add(size.max(1));
        let overlapped: Vec<usize> = p
            .live
            .range(..end)
            .rev()
            .take_while(|(&at, b)| at.saturating_add(b.size.max(1)) > ptr)
            .map(|(&at, _)| at)
            .collect();
        for at in overlapped {
            let block = p.live.remove(&at).expect("listed just above");
            end_sub_block(&block);
            misuse.push(Misuse {
                kind: ErrorKind::InvalidFree,
                address: at,
                block: Some((block.size, block.told.stack)),
                pool: p.name,
                detail: "pool_alloc over a live sub-block of the pool, which was never pool_free'd",
            });
        }
        if let Some(told) = told::count_allocation(size, arena.map_or(0, |a| a.tag), start) {
            let _inside = Inside::enter(); // the map's memory is the tracker's own
            p.freed.remove(&ptr);
            p.live.insert(ptr, SubBlock { size, told, arena });
        }
    }
    report(start, &misuse);
}

/// `pool_free(pool, ptr)`: the sub-block at `ptr` is gone. Anything else is reported.
pub fn free(pool: PoolHandle, ptr: usize, start: StartFrame) {
    let misuse = {
        let mut pools = pools();
        let Some(p) = pool_mut(&mut pools, pool) else {
            drop(pools);
            return report(start, &[no_such_pool(ptr)]);
        };
        match p.live.remove(&ptr) {
            Some(block) => {
                end_sub_block(&block);
                let _inside = Inside::enter();
                if p.freed.len() >= REMEMBERED_FREES {
                    p.freed.clear();
                }
                p.freed.insert(ptr, (block.size, block.told.stack));
                return;
            }
            None => p.misuse_of_free(ptr),
        }
    };
    report(start, &[misuse]);
}

/// `pool_reset(pool)`: every live sub-block of the pool is gone at once (the arena was rewound).
pub fn reset(pool: PoolHandle, start: StartFrame) {
    let mut pools = pools();
    let Some(p) = pool_mut(&mut pools, pool) else {
        drop(pools);
        return report(start, &[no_such_pool(0)]);
    };
    let _inside = Inside::enter();
    for block in core::mem::take(&mut p.live).values() {
        end_sub_block(block);
    }
    p.freed.clear();
    p.arenas.retain(Arena::is_live);
}

/// Calls `visit` with each pool's name and each of its live sub-blocks (address, block), and
/// whether the sub-block's memory may be gone: it lay in a tracked block, and the report finds
/// no live one holding it any more (the arena was freed without a reset). `Err` if the pools'
/// lock stayed held (see [`super::lock_for_walk`]).
pub fn for_each_sub_block(
    visit: &mut dyn FnMut(&'static str, usize, &SubBlock),
) -> Result<(), super::Busy> {
    let pools = super::lock_for_walk(&POOLS)?;
    for p in pools.iter() {
        for (&address, block) in &p.live {
            visit(p.name, address, block);
        }
    }
    Ok(())
}

fn pool_mut(pools: &mut [ClientPool], pool: PoolHandle) -> Option<&mut ClientPool> {
    pools.get_mut((pool as usize).checked_sub(1)?)
}

fn no_such_pool(ptr: usize) -> Misuse {
    Misuse {
        kind: ErrorKind::InvalidFree,
        address: ptr,
        block: None,
        pool: "pool",
        detail: NO_SUCH_POOL,
    }
}

/// Counts a sub-block's end: its tag's bytes freed, the bytes lent from its arena's tag given
/// back while the arena is the same live block.
fn end_sub_block(block: &SubBlock) {
    let lent_from = block
        .arena
        .filter(Arena::is_live)
        .map_or(0, |arena| arena.tag);
    told::count_free(block.size, block.told.tag, lent_from);
}

impl ClientPool {
    /// The live tracked block that holds `[ptr, ptr + size)`: one of the pool's arenas, a
    /// block of the heap, or a block that starts at `ptr` (a large arena's first sub-block).
    fn arena_holding(&mut self, ptr: usize, size: usize) -> Option<Arena> {
        if let Some(known) = self.arenas.iter().find(|a| a.holds(ptr, size)) {
            if known.is_live() {
                return Some(*known);
            }
        }
        let found = Arena::holding(ptr)
            .or_else(|| Arena::starting_at(ptr))
            .filter(|arena| arena.holds(ptr, size))?;
        let _inside = Inside::enter();
        self.arenas.retain(|a| a.is_live() && !a.holds(ptr, size));
        self.arenas.push(found);
        Some(found)
    }

    /// Why `ptr` is no live sub-block: freed already, inside one, or never one.
    fn misuse_of_free(&self, ptr: usize) -> Misuse {
        let misuse = |kind, block, detail| Misuse {
            kind,
            address: ptr,
            block,
            pool: self.name,
            detail,
        };
        if let Some(&freed) = self.freed.get(&ptr) {
            return misuse(
                ErrorKind::DoubleFree,
                Some(freed),
                "sub-block already pool_free'd",
            );
        }
        let holder = self.live.range(..ptr).next_back();
        match holder {
            Some((&at, block)) if ptr < at + block.size => misuse(
                ErrorKind::InvalidFree,
                Some((block.size, block.told.stack)),
                "pointer inside a sub-block of the pool, not at its start",
            ),
            _ => misuse(
                ErrorKind::InvalidFree,
                None,
                "no live sub-block of the pool starts here (never pool_alloc'ed, or reset)",
            ),
        }
    }
}

/// Reports each misuse as a memory error with the stack of the call, from `start`.
fn report(start: StartFrame, misuse: &[Misuse]) {
    if misuse.is_empty() {
        return;
    }
    let Some(inside) = Inside::enter() else {
        return;
    };
    let stack = crate::tracker::capture_stack(&inside, start);
    for m in misuse {
        let (size, alloc_stack) = m.block.unwrap_or((0, StackId(0)));
        errors::report(MemoryError {
            thread: crate::tracker::guard::thread_number(),
            allocator: Some(m.pool),
            detail: Some(m.detail),
            size,
            alloc_stack,
            ..MemoryError::at_free(m.kind, m.address as *mut u8, BlockKind::Named, stack)
        });
    }
}
