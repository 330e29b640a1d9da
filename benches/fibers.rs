//! Allocations on fibers: `programs/fiber_churn.cpp` runs new/delete pairs under 11 frames on
//! the thread's own stack, on a fiber the tracker is not told about, and on one named with
//! `running_on_stack`; plain glibc and the tracker (stacks off, DWARF, frame pointers), each
//! best of 3, nanoseconds per pair and the ratio to plain glibc on the thread's own stack.
//! `cargo bench --bench fibers`

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Command;

const PAIRS: &str = "1000000";
const RUNS: usize = 3;
const PLACES: [&str; 3] = ["own stack", "fiber", "named fiber"];

fn main() {
    let status = Command::new("cargo")
        .args(["build", "--release", "--lib"])
        .current_dir(support::repo())
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build failed");
    let dir = support::scratch("bench_fibers");
    let source = ["benches/programs/fiber_churn.cpp"];
    let plain = support::build(&dir, "plain", &source, &["-O2", "-DK15_MEMORY_DISABLED"]);
    let tracked = support::build(&dir, "tracked", &source, &["-O2"]);
    let variants = [
        ("glibc", &plain, ""),
        ("k15, stacks off", &tracked, "report=0:stack_depth=0"),
        ("k15, DWARF stacks", &tracked, "report=0"),
        (
            "k15, frame pointers",
            &tracked,
            "report=0:unwinder=frame_pointer",
        ),
    ];
    println!(
        "new/delete pairs on fibers, ns a pair (best of {RUNS}); ratio to glibc on its own stack"
    );
    println!(
        "{:<22} {:>16} {:>16} {:>16}",
        "", PLACES[0], PLACES[1], PLACES[2]
    );
    let mut baseline = None;
    for (name, exe, options) in variants {
        let best = (0..RUNS)
            .map(|_| run(exe, options))
            .reduce(|a, b| [a[0].min(b[0]), a[1].min(b[1]), a[2].min(b[2])])
            .unwrap();
        let base = *baseline.get_or_insert(best[0]);
        let cells: Vec<String> = best
            .iter()
            .map(|ns| format!("{ns:.1} ({:.2}x)", ns / base))
            .collect();
        println!(
            "{name:<22} {:>16} {:>16} {:>16}",
            cells[0], cells[1], cells[2]
        );
    }
}

/// One run's nanoseconds per pair at each place.
fn run(exe: &std::path::Path, options: &str) -> [f64; 3] {
    let out = Command::new(exe)
        .arg(PAIRS)
        .env("K15_MEMORY_OPTIONS", options)
        .output()
        .expect("the benchmark runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    PLACES.map(|place| {
        text.lines()
            .find_map(|l| l.strip_prefix(place)?.strip_prefix(": "))
            .and_then(|ns| ns.trim().parse().ok())
            .unwrap_or_else(|| panic!("no '{place}' in:\n{text}"))
    })
}
