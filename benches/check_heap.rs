//! `check_heap()` on a million live blocks (`programs/check_heap.cpp`, built at -O2): the time of
//! one whole-heap check, best of three. `cargo bench --bench check_heap`

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Command;

const BLOCKS: &str = "1000000";

fn main() {
    let dir = support::scratch("bench_check_heap");
    let exe = dir.join("check_heap");
    let built = Command::new("g++")
        .current_dir(support::repo())
        .args([
            "-std=c++17",
            "-O2",
            "-g",
            "-I",
            "include",
            "benches/programs/check_heap.cpp",
        ])
        .arg(support::static_lib())
        .args(["-lpthread", "-ldl", "-o"])
        .arg(&exe)
        .status()
        .expect("g++ runs");
    assert!(built.success(), "the check_heap program builds");
    for (label, options) in [
        ("stack_depth=0", "report=0:stack_depth=0"),
        ("stacks (default)", "report=0"),
    ] {
        let out = Command::new(&exe)
            .arg(BLOCKS)
            .env("K15_MEMORY_OPTIONS", options)
            .output()
            .expect("the program runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let value = |key: &str| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .unwrap_or("?")
                .trim()
                .to_owned()
        };
        println!(
            "check_heap() on {BLOCKS} live blocks, {label}: {} ms ({} ns per block), {} problems",
            value("check_heap_ms"),
            value("ns_per_block"),
            value("problems")
        );
    }
}
