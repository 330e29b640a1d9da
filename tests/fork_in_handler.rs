//! A signal handler that forks while threads churn new/delete (issue 38): the fork path and the
//! tracker's own memory never enter glibc's allocator, so a handler that lands on a thread
//! inside it (an exiting thread frees its glibc cache there) never waits for that thread.

mod support;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Seconds one run may take before it counts as a hang (each takes well under one unloaded).
const HANG_SECONDS: &str = "20";
/// Runs at once: the machine's cores kept busy, so that signals land mid-way through more.
const AT_ONCE: usize = 4;

/// One run's outcome.
struct Finished {
    args: [&'static str; 2],
    output: Output,
    took: Duration,
    log: PathBuf,
}

/// Runs `exe` with each of `runs` (its arguments), [`AT_ONCE`] at a time, each under `timeout`
/// and writing its report to its own log in `dir`.
fn run_all(exe: &Path, dir: &Path, runs: &[[&'static str; 2]]) -> Vec<Finished> {
    let next = AtomicUsize::new(0);
    let finished = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..AT_ONCE {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(&args) = runs.get(index) else { return };
                let log = dir.join(format!("run{index}.log"));
                let started = Instant::now();
                let output = Command::new("timeout")
                    .args(["--signal=KILL", HANG_SECONDS])
                    .arg(exe)
                    .args(args)
                    .current_dir(dir)
                    .env("K15_MEMORY_OPTIONS", format!("log_path={}", log.display()))
                    .output()
                    .expect("the program runs");
                let took = started.elapsed();
                finished.lock().unwrap().push(Finished {
                    args,
                    output,
                    took,
                    log,
                });
            });
        }
    });
    finished.into_inner().unwrap()
}

/// The number printed after `label` on stdout, if any.
fn printed(output: &Output, label: &str) -> Option<u64> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let rest = &stdout[stdout.find(label)? + label.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// A SIGALRM whose handler forks (the child runs new/delete and `_exit`s; the parent reaps it)
/// while threads churn: in waves of 3 that exit, so that the signal often lands on a thread
/// exiting, and with 3 long-lived ones. Before, the prepare handler took the tracker's own memory
/// from glibc, whose arena lock an exiting thread interrupted inside glibc's `free` held: 6 hangs
/// in 80 runs (plain glibc hangs in the waves nearly every run: its `fork` takes every arena's
/// lock). No run hangs or crashes, no child is stuck, every report is clean, and glibc's
/// allocator is never used (the tracker's own memory comes from its own heap). The timer is armed
/// for 0.5 ms after each handler returns, and the main thread blocks the signal: a periodic one
/// (every 1.5 ms) kept threads inside handlers for good on a loaded machine (4 runs at once on 2
/// cores: a reap's sleep wakes late), and runs were killed, livelocked (15 of 200 in CI), though
/// no thread waited on the tracker.
#[test]
fn handlers_that_fork_never_hang() {
    let dir = support::scratch("fork_in_handler");
    let exe = support::build(
        &dir,
        "fork_in_handler",
        &["tests/cpp/fork_in_handler.cpp"],
        &[],
    );
    let mut runs = vec![["waves", "5"]; 150];
    runs.extend([["steady", "50"]; 50]);
    let finished = run_all(&exe, &dir, &runs);
    let hung: Vec<_> = finished
        .iter()
        .filter(|run| run.output.status.code() == Some(137))
        .collect();
    let crashed: Vec<_> = finished
        .iter()
        .filter(|run| !run.output.status.success() && run.output.status.code() != Some(137))
        .collect();
    let slowest = finished.iter().map(|run| run.took).max().unwrap();
    let forks: u64 = finished
        .iter()
        .filter_map(|run| printed(&run.output, "forks:"))
        .sum();
    println!(
        "{} runs, {} hung, {} crashed, {forks} forks, slowest run {slowest:?}",
        finished.len(),
        hung.len(),
        crashed.len()
    );
    assert!(
        hung.is_empty(),
        "{} runs hung: {:?}",
        hung.len(),
        hung[0].args
    );
    if let Some(run) = crashed.first() {
        panic!(
            "{} runs crashed; {:?}: {:?}\n{}",
            crashed.len(),
            run.args,
            run.output.status,
            String::from_utf8_lossy(&run.output.stderr)
        );
    }
    for run in &finished {
        let args = run.args;
        assert!(printed(&run.output, "forks:") >= Some(1), "{args:?}");
        assert_eq!(printed(&run.output, "stuck children:"), Some(0), "{args:?}");
        assert_eq!(printed(&run.output, "glibc bytes:"), Some(0), "{args:?}");
        let json = support::read_json(&run.log.with_extension("log.json"));
        let summary = &json["summary"];
        assert_eq!(summary["errors"], 0, "{args:?}: {summary}");
        assert_eq!(summary["leaked_blocks"], 0, "{args:?}: {summary}");
    }
}

/// A SIGALRM whose handler forks while the main thread is in `frame_mark()` (with a timeline,
/// whose lock a mark takes too) or interns new tag names: the mark and the interning hold their
/// locks, which the fork's prepare took in turn, waiting for the very thread it runs on (10 hangs
/// in 10 runs of each). Now they count as inside the tracker, as an allocation does, and the fork
/// goes ahead unprepared: every run makes its 200 forks, each child exits by itself.
#[test]
fn handlers_that_fork_during_frame_marks_and_interning_never_hang() {
    let dir = support::scratch("fork_in_frame_mark");
    let exe = support::build(
        &dir,
        "fork_in_frame_mark",
        &["tests/cpp/fork_in_frame_mark.cpp"],
        &[],
    );
    for (mode, options) in [
        (
            "frames",
            format!("report=0:timeline={}", dir.join("tl.json").display()),
        ),
        ("frames", "report=0".to_string()),
        ("tags", "report=0".to_string()),
    ] {
        for _ in 0..3 {
            let output = Command::new("timeout")
                .args(["--signal=KILL", HANG_SECONDS])
                .arg(&exe)
                .args([mode, "200"])
                .current_dir(&dir)
                .env("K15_MEMORY_OPTIONS", &options)
                .output()
                .expect("the program runs");
            assert_ne!(output.status.code(), Some(137), "{mode} {options}: hung");
            assert!(
                output.status.success(),
                "{mode} {options}: {:?}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            assert_eq!(printed(&output, "forks:"), Some(200), "{mode} {options}");
        }
    }
}
