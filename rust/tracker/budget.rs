//! Budget mode (`budget=64M`): every tracked block is carved from memory taken once at start-up,
//! small ones from a size-class pool and large ones from a coalescing block allocator in the
//! same budget. Running out is a `budget_exceeded` error and a failed allocation (`bad_alloc`),
//! never the OS killing the program.

use crate::engine::{BlockAllocator, ClassSpec, EngineAllocator, Pool, PoolConfig};
use crate::sys::StackBuffer;
use core::fmt::Write;
use std::sync::OnceLock;

/// Names under which the budget's allocators appear in the engine registry (`allocator_of`).
pub const POOL_NAME: &str = "k15 budget pool";
pub const BLOCKS_NAME: &str = "k15 budget blocks";

pub struct Budget {
    pool: Pool,
    blocks: BlockAllocator,
    /// Requests up to this size (header included) go to the pool.
    largest_class: usize,
}

static BUDGET: OnceLock<Budget> = OnceLock::new();

/// The budget, once [`set_up`] made one.
#[inline]
pub fn active() -> Option<&'static Budget> {
    BUDGET.get()
}

/// Takes the budget's memory now. Called once, at first use, inside the tracker.
pub fn set_up(bytes: usize, classes: &[ClassSpec]) {
    match Budget::new(bytes, classes) {
        Ok(budget) => {
            let _ = BUDGET.set(budget);
        }
        Err(problem) => {
            let mut line = StackBuffer::<256>::new();
            let _ = writeln!(
                line,
                "k15-memory: budget={bytes}: {problem}; running without a budget"
            );
            line.flush_to_stderr();
        }
    }
}

/// Half the budget for the pool, spread evenly over classes of 64 bytes to 4 KiB (every block
/// carries a 64-byte header), the rest for the block allocator. A class of fewer than
/// `pool::MIN_CACHED_BLOCKS` blocks has no per-thread cache and takes its lock on every use
/// (with `budget=64M`, the 2 and 4 KiB classes).
fn default_classes(bytes: usize) -> Vec<ClassSpec> {
    let sizes = [64, 128, 256, 512, 1024, 2048, 4096];
    let per_class = bytes / 2 / sizes.len();
    sizes
        .iter()
        .map(|&block_size| ClassSpec {
            block_size,
            block_count: (per_class / block_size).max(1),
        })
        .collect()
}

impl Budget {
    fn new(bytes: usize, classes: &[ClassSpec]) -> Result<Budget, String> {
        let classes = if classes.is_empty() {
            default_classes(bytes)
        } else {
            classes.to_vec()
        };
        let pool_bytes: usize = classes.iter().map(|c| c.block_size * c.block_count).sum();
        let block_bytes = bytes
            .checked_sub(pool_bytes)
            .ok_or("pool_classes need more than the budget")?;
        let pool =
            Pool::new(POOL_NAME, PoolConfig { classes: &classes }).map_err(|e| e.to_string())?;
        let blocks = BlockAllocator::new(BLOCKS_NAME, block_bytes).map_err(|e| e.to_string())?;
        for info in [pool.info(), blocks.info()] {
            crate::engine::mark_serving_tracker(info.id);
        }
        let largest_class = classes.iter().map(|c| c.block_size).max().unwrap_or(0);
        Ok(Budget {
            pool,
            blocks,
            largest_class,
        })
    }

    /// `size` bytes (header included) aligned to `align`, or `None` when the budget is spent.
    pub fn acquire(&self, size: usize, align: usize) -> Option<*mut u8> {
        let from_pool = if size <= self.largest_class {
            self.pool.alloc(size, align)
        } else {
            None
        };
        from_pool
            .or_else(|| self.blocks.alloc(size, align))
            .map(|p| p.as_ptr())
    }

    /// Gives back memory from [`Budget::acquire`].
    pub fn release(&self, raw: *mut u8) {
        if self.pool.free(raw).is_err() {
            // Not the pool's, so the block allocator's: acquire handed out nothing else.
            let _ = self.blocks.free(raw);
        }
    }
}
