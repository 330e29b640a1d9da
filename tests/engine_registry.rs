//! Process-wide engine views (its own process, so no other test's allocators show up): pointer lookups and memstats.

use k15_memory::engine::{
    allocator_of, memstats, type_of, AllocatorKind, BlockAllocator, EngineAllocator, MemStats,
    Pool, PoolConfig, StackAllocator, TypedPool,
};

#[test]
fn lookups_and_memstats_across_allocators() {
    let pool = Pool::new("pool", PoolConfig::default()).unwrap();
    let mut stack = StackAllocator::new("frame", 1 << 16).unwrap();
    let blocks = BlockAllocator::new("blocks", 1 << 16).unwrap();
    let meshes = TypedPool::<[u32; 6]>::new("meshes", 4).unwrap();

    let in_pool = pool.alloc(24, 8).unwrap().as_ptr();
    let in_block = blocks.alloc(300, 16).unwrap().as_ptr();
    let in_meshes = meshes.alloc([0; 6]).unwrap().as_ptr().cast::<u8>();
    let in_stack = stack.alloc(10, 8).unwrap().as_ptr();
    let kinds = [in_pool, in_stack, in_block, in_meshes]
        .map(|ptr| allocator_of(ptr).map(|info| (info.name, info.kind)));
    assert_eq!(
        kinds,
        [
            Some(("pool", AllocatorKind::Pool)),
            Some(("frame", AllocatorKind::Stack)),
            Some(("blocks", AllocatorKind::Block)),
            Some(("meshes", AllocatorKind::TypedPool))
        ]
    );
    assert_eq!(
        allocator_of(in_block.wrapping_add(100)),
        Some(blocks.info()),
        "interior addresses resolve too"
    );
    assert_eq!(type_of(in_meshes), Some("[u32; 6]"));
    assert_eq!(type_of(in_pool), None);
    assert_eq!(allocator_of(std::ptr::null()), None);

    let since_start = memstats(true);
    assert_eq!(
        (
            since_start.allocations,
            since_start.live_blocks,
            since_start.live_bytes
        ),
        (4, 4, 24 + 300 + 24 + 10)
    );

    // A steady-state frame loop: frame data on the stack, nothing left behind.
    for _ in 0..100 {
        let mut frame = stack.scope();
        frame.alloc(64, 16).unwrap();
        let scratch = pool.alloc(100, 8).unwrap();
        pool.free(scratch.as_ptr()).unwrap();
    }
    let frames = memstats(true);
    assert_eq!(
        frames,
        MemStats {
            allocations: 200,
            frees: 200,
            failures: 0,
            live_blocks: 4,
            live_bytes: 358
        }
    );

    // A loop that allocates nothing reads all zeros apart from what is live.
    for _ in 0..100 {
        std::hint::black_box(pool.stats());
    }
    assert_eq!(
        memstats(false),
        MemStats {
            live_blocks: 4,
            live_bytes: 358,
            ..MemStats::default()
        }
    );

    // Dropping an allocator forgets its memory but keeps its events in the totals.
    drop(blocks);
    assert_eq!(allocator_of(in_block), None);
    assert_eq!(
        memstats(false),
        MemStats {
            live_blocks: 3,
            live_bytes: 58,
            ..MemStats::default()
        }
    );
    // SAFETY: no reference to the mesh exists.
    unsafe { meshes.free(in_meshes.cast()) }.unwrap();
    assert_eq!(
        memstats(true),
        MemStats {
            frees: 1,
            live_blocks: 2,
            live_bytes: 34,
            ..MemStats::default()
        }
    );
}
