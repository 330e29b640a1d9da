//! Rust code with `#[global_allocator] TrackedAlloc`: `k15_memory::scope` tags what the thread
//! allocates, as C++'s `K15_MEMORY_SCOPE` does, and a block freed on another thread still counts
//! against its tag.

use k15_memory::TrackedAlloc;

#[global_allocator]
static GLOBAL: TrackedAlloc = TrackedAlloc;

/// live blocks, live bytes, peak bytes, allocations, bytes allocated of tag `name`.
fn figures(name: &str) -> [u64; 5] {
    let stats = k15_memory::tag_stats();
    let t = stats
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tag {name}"));
    [
        t.live_blocks,
        t.live_bytes,
        t.peak_bytes,
        t.total_allocations,
        t.total_bytes,
    ]
}

#[test]
fn a_rust_scope_tags_what_its_thread_allocates() {
    let kept = {
        let _scope = k15_memory::scope("RustWorld/Entities");
        let kept: Vec<u64> = Vec::with_capacity(1000);
        let freed = Box::new([7u8; 300]);
        drop(freed);
        kept
    };
    let untagged = vec![0u8; 500];
    assert_eq!(figures("RustWorld/Entities"), [1, 8000, 8300, 2, 8300]);
    assert_eq!(figures("RustWorld"), [1, 8000, 8300, 2, 8300]);

    // Made under a scope on another thread, freed here.
    let made = std::thread::spawn(|| {
        let _scope = k15_memory::scope("RustWorld/Loader");
        vec![1u8; 2048]
    })
    .join()
    .unwrap();
    assert_eq!(figures("RustWorld/Loader"), [1, 2048, 2048, 1, 2048]);
    drop(made);
    assert_eq!(figures("RustWorld/Loader"), [0, 0, 2048, 1, 2048]);
    let [live_blocks, live_bytes, peak, allocations, bytes] = figures("RustWorld");
    assert_eq!(
        [live_blocks, live_bytes, allocations, bytes],
        [1, 8000, 3, 10_348]
    );
    // 8000 + 2048 were live at once, on two threads' shards: a peak across threads is summed in
    // steps of 32 KiB per shard (tag_stats' documented bound), each shard's own peak is exact.
    assert!((8300..=10_048).contains(&peak), "{peak}");
    drop((kept, untagged));
}
