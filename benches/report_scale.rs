//! The report at scale (`programs/leak_many.cpp`): 1,000,000 blocks leaked from one site, and
//! 200,000 from 20,000 distinct stacks. Prints the time from `main`'s return to the process's
//! end (the report: scan, symbolization, both files) and the JSON bytes per block; best of
//! three runs. `cargo bench --bench report_scale`

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Command;

const RUNS: usize = 3;

fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Seconds from `main`'s return to the end of the process, and the JSON report's size.
fn report_time(exe: &std::path::Path, args: &[&str]) -> (f64, u64, u64) {
    let dir = exe.parent().unwrap();
    let log = dir.join("scale.log");
    let out = Command::new("timeout")
        .args(["--signal=KILL", "120"])
        .arg(exe)
        .args(args)
        .env("K15_MEMORY_OPTIONS", format!("log_path={}", log.display()))
        .output()
        .expect("the program runs");
    let ended = monotonic_ns();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let returned: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let json = dir.join("scale.log.json");
    let summary = support::read_json(&json)["summary"].clone();
    let blocks = summary["leaked_blocks"].as_u64().unwrap();
    let bytes = std::fs::metadata(&json).unwrap().len();
    ((ended - returned) as f64 / 1e9, blocks, bytes)
}

fn main() {
    let dir = support::scratch("bench_report_scale");
    let exe = support::build(&dir, "leak_many", &["benches/programs/leak_many.cpp"], &[]);
    for (what, args, target) in [
        (
            "1,000,000 blocks, 1 site",
            &["one_site", "1000000"][..],
            1.5,
        ),
        (
            "200,000 blocks, 20,000 stacks",
            &["many_stacks", "200000", "20000"][..],
            2.0,
        ),
    ] {
        let runs: Vec<(f64, u64, u64)> = (0..RUNS).map(|_| report_time(&exe, args)).collect();
        let best = runs.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
        let (_, blocks, bytes) = runs[0];
        println!(
            "{what}: report {best:.2} s after main returns (target {target} s; runs {:?}), JSON {:.0} MB, {:.1} bytes/block",
            runs.iter().map(|r| (r.0 * 100.0).round() / 100.0).collect::<Vec<_>>(),
            bytes as f64 / 1e6,
            bytes as f64 / blocks as f64
        );
    }
}
