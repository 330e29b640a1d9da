//! Memory that comes back, in one run (`programs/memory_back.cpp`, built at `-O2`): resident
//! memory after 5M x 16 B and 1M x 200 B are allocated and all freed, and after 500 threads alive
//! at once have allocated, freed and gone, under plain glibc, mimalloc (`LD_PRELOAD`, if
//! installed), LeakSanitizer (g++ `-fsanitize=leak`) and the tracker (stacks on and off), with
//! the ratios to glibc (the small-object workload's peak is the "≤ 1.25x plain" case);
//! the page faults of three sizes taking turns (100,000 blocks of one at a time, 20 rounds: the
//! memory kept between phases); then the share of a
//! 4 MiB budget that blocks of one size (or a mix) fill before `bad_alloc`.
//! `cargo bench --bench memory_back`

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::Command;

const SOURCE: &str = "benches/programs/memory_back.cpp";
const MIMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2";

/// The `key value` lines a run printed.
fn run(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<(String, f64)> {
    let out = Command::new("timeout")
        .args(["--signal=KILL", "600"])
        .arg(exe)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("the program runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn value(printed: &[(String, f64)], key: &str) -> f64 {
    printed
        .iter()
        .find(|(k, _)| k == key)
        .map_or(f64::NAN, |(_, v)| *v)
}

/// A way to run the program: its name in the table, the binary, its environment.
type Variant<'a> = (&'static str, &'a Path, Vec<(&'static str, &'a str)>);

fn main() {
    let dir = support::scratch("bench_memory_back");
    let plain = support::build(&dir, "plain", &[SOURCE], &["-O2", "-DK15_MEMORY_DISABLED"]);
    let tracked = support::build(&dir, "tracked", &[SOURCE], &["-O2"]);
    let lsan = support::build(
        &dir,
        "lsan",
        &[SOURCE],
        &["-O2", "-DK15_MEMORY_DISABLED", "-fsanitize=leak"],
    );
    let log = format!("log_path={}", dir.join("k15.log").display());
    let stacks_on = format!("{log}:report=0");
    let stacks_off = format!("{log}:report=0:stack_depth=0");
    let mut variants: Vec<Variant> = vec![("glibc", &plain, vec![])];
    if Path::new(MIMALLOC).exists() {
        variants.push(("mimalloc", &plain, vec![("LD_PRELOAD", MIMALLOC)]));
    } else {
        println!("(mimalloc skipped: install libmimalloc-dev)");
    }
    variants.push(("LeakSanitizer", &lsan, vec![]));
    variants.push((
        "tracker",
        &tracked,
        vec![("K15_MEMORY_OPTIONS", stacks_on.as_str())],
    ));
    variants.push((
        "tracker, stack_depth=0",
        &tracked,
        vec![("K15_MEMORY_OPTIONS", stacks_off.as_str())],
    ));

    for (title, args, peak_key) in [
        (
            "5M x 16 B + 1M x 200 B, then all freed",
            &["free_all"][..],
            "peak_kib",
        ),
        (
            "500 threads alive at once, then all gone",
            &["threads", "500"][..],
            "alive_kib",
        ),
    ] {
        println!("\n{title} (resident MiB; ratio to glibc)");
        println!(
            "  {:<24} {:>10} {:>8} {:>10} {:>8}",
            "", "peak", "peak/x", "after", "after/x"
        );
        let mut glibc = (f64::NAN, f64::NAN);
        for (name, exe, env) in &variants {
            let printed = run(exe, args, env);
            let (peak, after) = (value(&printed, peak_key), value(&printed, "after_kib"));
            if *name == "glibc" {
                glibc = (peak, after);
            }
            println!(
                "  {name:<24} {:>10.1} {:>7.2}x {:>10.1} {:>7.2}x",
                peak / 1024.0,
                peak / glibc.0,
                after / 1024.0,
                after / glibc.1
            );
        }
    }

    println!("\nthree sizes taking turns, 100,000 blocks at a time, 20 rounds");
    println!(
        "  {:<24} {:>10} {:>8} {:>10} {:>8}",
        "", "faults", "/glibc", "CPU ms", "/glibc"
    );
    let mut glibc = (f64::NAN, f64::NAN);
    for (name, exe, env) in &variants {
        let printed = run(exe, &["phases"], env);
        let (faults, cpu) = (value(&printed, "faults"), value(&printed, "cpu_ms"));
        if *name == "glibc" {
            glibc = (faults, cpu);
        }
        println!(
            "  {name:<24} {faults:>10.0} {:>7.2}x {cpu:>10.0} {:>7.2}x",
            faults / glibc.0,
            cpu / glibc.1
        );
    }

    let budget = 4 << 20;
    println!("\nbudget=4M: share of the budget filled before bad_alloc");
    for size in ["16", "64", "200", "4096", "0"] {
        let options = format!("{log}:report=0:budget={budget}");
        let printed = run(
            &tracked,
            &["fill", size, &budget.to_string()],
            &[("K15_MEMORY_OPTIONS", options.as_str())],
        );
        let name = if size == "0" {
            "mixed 16 B..4 KiB".to_owned()
        } else {
            format!("{size} B")
        };
        println!("  {name:<24} {:>6.1}%", 100.0 * value(&printed, "fill"));
    }
}
