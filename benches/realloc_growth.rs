//! The realloc-growth benchmark (issue 42): one block per thread grown by 16- and 64-byte steps
//! up to 4 MiB (`programs/realloc_growth.c`), at 1 and 4 threads, under plain glibc and under
//! the tracker (stacks off, DWARF stacks), each in its own process, all in one run. Prints the
//! nanoseconds per `realloc` in three bands of the block's size (small under 4 KiB, medium to
//! 128 KiB, large to 4 MiB: the time per call must not grow with the size), the nanoseconds per
//! `malloc`/`free` pair of a size from the same band under the same options, and their ratio.
//! `cargo bench --bench realloc_growth`

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::Command;

const SOURCE: &str = "benches/programs/realloc_growth.c";
const RUNS: usize = 3;

/// Per band, smallest first: its name and the best (least) nanoseconds per realloc and per
/// pair over [`RUNS`] runs.
type Bands = Vec<(String, (f64, f64))>;

fn measure(exe: &Path, options: Option<&str>, threads: u32, step: u32) -> Bands {
    let mut best = Bands::new();
    for _ in 0..RUNS {
        let mut cmd = Command::new("timeout");
        cmd.args(["--signal=KILL", "300"])
            .arg(exe)
            .args([threads.to_string(), step.to_string()]);
        if let Some(options) = options {
            cmd.env("K15_MEMORY_OPTIONS", format!("report=0:{options}"));
        }
        let out = cmd.output().expect("the workload runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // "band NAME realloc_ns X pair_ns Y"
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["band", name, "realloc_ns", realloc, "pair_ns", pair] = words[..] {
                let (realloc, pair): (f64, f64) = (realloc.parse().unwrap(), pair.parse().unwrap());
                match best.iter_mut().find(|(band, _)| band == name) {
                    Some((_, entry)) => *entry = (entry.0.min(realloc), entry.1.min(pair)),
                    None => best.push((name.to_owned(), (realloc, pair))),
                }
            }
        }
    }
    best
}

fn main() {
    let dir = support::scratch("bench_realloc_growth");
    let plain = support::build_c(&dir, "plain", SOURCE, &["-O2", "-DK15_MEMORY_DISABLED"]);
    let tracked = support::build_c(&dir, "k15", SOURCE, &["-O2"]);
    let variants = [
        ("glibc", &plain, None),
        ("k15, stack_depth=0", &tracked, Some("stack_depth=0")),
        (
            "k15, stacks (DWARF, default)",
            &tracked,
            Some("stack_depth=32"),
        ),
    ];
    for threads in [1, 4] {
        for step in [16, 64] {
            println!("\n{threads} thread(s), {step}-byte steps to 4 MiB (best of {RUNS})");
            println!(
                "  {:<30} {:<20} {:>12} {:>12} {:>14}",
                "", "band", "ns/realloc", "ns/pair", "realloc/pair"
            );
            for (name, exe, options) in &variants {
                for (band, (realloc, pair)) in measure(exe, *options, threads, step) {
                    println!(
                        "  {name:<30} {band:<20} {realloc:>12.1} {pair:>12.1} {:>14.2}",
                        realloc / pair
                    );
                }
            }
        }
    }
}
