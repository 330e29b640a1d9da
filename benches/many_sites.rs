//! A large program's stacks: allocations from 70,000 call sites in 14,000 functions
//! (`programs/many_sites.cpp`, built at -O1), ten passes over all of them, plain and under the
//! tracker: ns per allocation in the first pass (every return address met for the first time)
//! and the last (all of them known), and peak RSS. `cargo bench --bench many_sites`

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::Command;

const PASSES: usize = 10;
const ROUNDS: usize = 5;

fn build(dir: &Path, name: &str, tracked: bool) -> std::path::PathBuf {
    let exe = dir.join(name);
    let mut cmd = Command::new("g++");
    cmd.current_dir(support::repo())
        .args(["-std=c++17", "-O1", "-I", "include"])
        .arg("benches/programs/many_sites.cpp");
    if tracked {
        cmd.arg(support::static_lib());
    } else {
        cmd.arg("-DK15_MEMORY_DISABLED");
    }
    let built = cmd
        .args(["-lpthread", "-ldl", "-o"])
        .arg(&exe)
        .status()
        .expect("g++ runs");
    assert!(built.success(), "{name} builds");
    exe
}

/// ns per allocation of the first and the last pass, and peak RSS in KiB (of a second run:
/// the measured one's output is not kept).
fn run(exe: &Path, options: &str) -> (f64, f64, i64) {
    let program = || {
        let mut cmd = Command::new(exe);
        cmd.arg(PASSES.to_string())
            .env("K15_MEMORY_OPTIONS", options);
        cmd
    };
    let out = program().output().expect("the program runs");
    assert!(out.status.success(), "{} failed", exe.display());
    let passes: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3)?.parse().ok())
        .collect();
    assert_eq!(passes.len(), PASSES);
    let (_, _, rss) = support::run_measured(&mut program());
    (passes[0], passes[PASSES - 1], rss)
}

fn main() {
    let dir = support::scratch("bench_many_sites");
    let plain = build(&dir, "many_sites_plain", false);
    let tracked = build(&dir, "many_sites_k15", true);
    let variants = [
        ("plain glibc (baseline)", &plain, ""),
        ("k15, stack_depth=0", &tracked, "stack_depth=0"),
        ("k15, default (DWARF stacks)", &tracked, ""),
    ];
    let mut runs = vec![Vec::new(); variants.len()];
    for _ in 0..ROUNDS {
        for ((_, exe, options), taken) in variants.iter().zip(&mut runs) {
            taken.push(run(exe, options));
        }
    }
    println!(
        "\n70,000 call sites in 14,000 functions, {PASSES} passes, {ROUNDS} interleaved rounds: \
         ns per allocation (median), peak RSS (least)"
    );
    println!(
        "  {:<30} {:>12} {:>12} {:>10}",
        "variant", "first pass", "last pass", "peak MiB"
    );
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    for ((name, _, _), taken) in variants.iter().zip(&runs) {
        println!(
            "  {:<30} {:>12.1} {:>12.1} {:>10.1}",
            name,
            median(taken.iter().map(|r| r.0).collect()),
            median(taken.iter().map(|r| r.1).collect()),
            taken.iter().map(|r| r.2).min().unwrap_or(0) as f64 / 1024.0
        );
    }
}
