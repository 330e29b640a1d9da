//! Rust code with `#[global_allocator] TrackedAlloc` lands in the same tracker and leak log,
//! marked `"language": "rust"`. Its own process: the test re-runs this binary as a child.

mod support;

use k15_memory::TrackedAlloc;
use std::process::Command;

#[global_allocator]
static GLOBAL: TrackedAlloc = TrackedAlloc;

const CHILD: &str = "K15_RUST_LEAK_CHILD";
const LEAK_SIZE: usize = 4242;

/// Runs only inside the child: leaks one buffer on purpose and checks the counters move.
#[test]
fn child_leaks_a_buffer() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    // The harness's main thread may allocate while this test runs (its record of the running
    // test: 2 runs in 100 saw one allocation more), so the counters are read around the
    // allocation until no other thread's came between; the buffer is leaked once.
    for _ in 0..100 {
        let before = k15_memory::stats();
        let buffer = vec![7u8; LEAK_SIZE];
        let after = k15_memory::stats();
        let freed = Box::new([1u64; 100]);
        drop(freed);
        let end = k15_memory::stats();
        if after.total_allocations == before.total_allocations + 1
            && after.live_bytes == before.live_bytes + LEAK_SIZE as u64
            && end.live_bytes == after.live_bytes
            && end.total_allocations == after.total_allocations + 1
        {
            std::mem::forget(buffer);
            return;
        }
    }
    panic!("the counters never moved by exactly the {LEAK_SIZE}-byte allocation and the freed box");
}

#[test]
fn rust_leak_appears_in_the_leak_log() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("rust_global_alloc");
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("rust.log");
    let _ = std::fs::remove_file(dir.join("rust.log.json"));
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_leaks_a_buffer", "--test-threads=1"])
        .env(CHILD, "1")
        // malloc=0: Rust's allocator only (the test harness keeps C-family blocks of its own).
        .env(
            "K15_MEMORY_OPTIONS",
            format!("log_path={}:malloc=0", log.display()),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let json = support::inflate(&support::read_json(&dir.join("rust.log.json")));
    let leaks = json["leaks"].as_array().unwrap();
    // Only the deliberate leak: the runtime's own start-up blocks are not listed.
    let ours: Vec<_> = leaks.iter().filter(|l| l["size"] == LEAK_SIZE).collect();
    assert_eq!((leaks.len(), ours.len()), (1, 1), "{json:#}");
    assert!(json["summary"]["runtime_blocks"].as_u64().unwrap() >= 1);
    assert_eq!(ours[0]["language"], "rust");
    assert_eq!(ours[0]["array"], false);
    assert!(ours[0]["file"].is_null());
    // The stack starts at the test function, demangled: the tracker's and Vec's own frames are
    // left out.
    let functions: Vec<&str> = ours[0]["stack"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["function"].as_str().unwrap_or("??"))
        .collect();
    assert_eq!(
        functions[0], "rust_global_alloc::child_leaks_a_buffer",
        "{functions:?}"
    );
    assert!(
        leaks.iter().all(|l| l["language"] == "rust"),
        "only Rust allocates here"
    );
    assert_eq!(json["summary"]["errors"], 0);
}

#[test]
fn this_rustc_linked_binary_carries_the_operator_replacements() {
    // This test binary is linked by rustc, which puts libstdc++ first: the operators must still
    // be the library's (linked whole from build.rs), or C++ code in it would bypass the tracker.
    let exe = std::env::current_exe().unwrap();
    let nm = Command::new("nm")
        .arg("-C")
        .arg("--defined-only")
        .arg(&exe)
        .output()
        .unwrap();
    let symbols = String::from_utf8_lossy(&nm.stdout);
    for form in [
        "operator new(unsigned long)",
        "operator delete(void*)",
        "operator new[](unsigned long, std::align_val_t)",
    ] {
        assert!(
            symbols.lines().any(|l| l.ends_with(&format!(" T {form}"))),
            "{form} is not defined in {}",
            exe.display()
        );
    }
}
