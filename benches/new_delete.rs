//! The churn benchmark: the same C++ workload (`programs/churn.cpp`, 2 million new/delete pairs
//! per thread, then the same with malloc/free) under plain glibc and its peers and under the
//! tracker, each in its own process, all in one run (the tracker also preloaded into the plain
//! build, beside heaptrack on that same binary); prints nanoseconds per pair and the ratio to
//! plain glibc. Peers that are not installed are skipped with a note. Then, at `-O2`, churn whose
//! threads also store to one shared global every iteration, and the instructions, loads and
//! stores of one pair under cachegrind.
//! `cargo bench --bench new_delete`

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

const PAIRS: u64 = 2_000_000;
const RUNS: usize = 3;

struct Variant {
    name: &'static str,
    /// The command before the program, e.g. `valgrind`.
    wrapper: Vec<String>,
    exe: PathBuf,
    env: Vec<(&'static str, String)>,
    /// Slow peers run fewer pairs; the figure is per pair either way.
    pairs_divisor: u64,
}

fn compile(
    dir: &Path,
    name: &str,
    compiler: &str,
    flags: &[&str],
    tracked: bool,
) -> Option<PathBuf> {
    let exe = dir.join(name);
    let mut cmd = Command::new(compiler);
    cmd.current_dir(support::repo())
        .args(["-std=c++17", "-g", "-I", "include"])
        .args(flags);
    cmd.arg("benches/programs/churn.cpp");
    if tracked {
        cmd.arg(support::static_lib());
    } else {
        cmd.arg("-DK15_MEMORY_DISABLED");
    }
    cmd.args(["-lpthread", "-ldl", "-o"]).arg(&exe);
    match cmd.output() {
        Ok(out) if out.status.success() => Some(exe),
        Ok(out) => {
            println!(
                "  ({name} skipped: {compiler} failed: {})",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .next()
                    .unwrap_or("")
            );
            None
        }
        Err(_) => {
            println!("  ({name} skipped: no {compiler})");
            None
        }
    }
}

fn found(path: &str) -> Option<String> {
    Path::new(path).exists().then(|| path.to_owned())
}

fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Best of `RUNS` nanoseconds per pair; `shared`: every iteration also stores to one global
/// all threads share (`churn.cpp`).
fn measure(v: &Variant, threads: u32, family: Family, shared: bool, dir: &Path) -> Option<f64> {
    let pairs = PAIRS / v.pairs_divisor;
    let runs = if v.pairs_divisor > 1 { 1 } else { RUNS };
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        let (program, args) = match v.wrapper.split_first() {
            Some((tool, rest)) => (
                tool.clone(),
                rest.iter()
                    .cloned()
                    .chain([v.exe.display().to_string()])
                    .collect::<Vec<_>>(),
            ),
            None => (v.exe.display().to_string(), vec![]),
        };
        let out = Command::new(program)
            .args(args)
            .args([threads.to_string(), pairs.to_string()])
            .arg(family.argument())
            .args(shared.then_some("shared"))
            .current_dir(dir)
            .envs(v.env.iter().map(|(k, val)| (*k, val.as_str())))
            .output()
            .ok()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let ns: f64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("ns_per_pair "))?
            .trim()
            .parse()
            .ok()?;
        best = best.min(ns);
    }
    Some(best)
}

/// Which allocation functions the workload calls.
#[derive(Clone, Copy, PartialEq)]
enum Family {
    NewDelete,
    MallocFree,
}

impl Family {
    fn argument(self) -> &'static str {
        match self {
            Family::NewDelete => "new",
            Family::MallocFree => "malloc",
        }
    }
}

/// The workload under every allocator, built at one optimisation level. The tracker's rows of
/// the malloc workload track it (`malloc=1`), beside one that leaves it to glibc (`malloc=0`).
fn variants(dir: &Path, opt: &'static str, with_slow_peers: bool, family: Family) -> Vec<Variant> {
    let name = |base: &str| format!("churn_{base}{opt}");
    let plain =
        compile(dir, &name("plain"), "g++", &[opt], false).expect("g++ builds the plain workload");
    let tracked =
        compile(dir, &name("k15"), "g++", &[opt], true).expect("the tracked workload builds");
    let malloc = match family {
        Family::NewDelete => "",
        Family::MallocFree => ":malloc=1",
    };
    let tracker = |label, options: &str| Variant {
        name: label,
        wrapper: vec![],
        exe: tracked.clone(),
        env: vec![("K15_MEMORY_OPTIONS", format!("report=0:{options}{malloc}"))],
        pairs_divisor: 1,
    };
    let peer =
        |label, wrapper: &[&str], exe: &Path, env: Vec<(&'static str, String)>, pairs_divisor| {
            Variant {
                name: label,
                wrapper: wrapper.iter().map(|s| s.to_string()).collect(),
                exe: exe.to_owned(),
                env,
                pairs_divisor,
            }
        };

    let baseline = match family {
        Family::NewDelete => "glibc new/delete (baseline)",
        Family::MallocFree => "glibc malloc/free (baseline)",
    };
    let mut variants = vec![peer(baseline, &[], &plain, vec![], 1)];
    match found("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2") {
        Some(lib) => variants.push(peer(
            "mimalloc (LD_PRELOAD)",
            &[],
            &plain,
            vec![("LD_PRELOAD", lib)],
            1,
        )),
        None => println!("  (mimalloc skipped: install libmimalloc-dev)"),
    }
    if family == Family::MallocFree {
        variants.push(Variant {
            env: vec![("K15_MEMORY_OPTIONS", "report=0:malloc=0".to_owned())],
            ..tracker("k15, malloc=0 (glibc's blocks)", "")
        });
    }
    variants.push(tracker("k15, stack_depth=0", "stack_depth=0"));
    variants.push(tracker("k15, stacks (DWARF, default)", "stack_depth=32"));
    variants.push(tracker(
        "k15, stacks (frame pointers)",
        "stack_depth=32:unwinder=frame_pointer",
    ));
    variants.push(tracker("k15, stacks, free_stacks=1", "free_stacks=1"));
    variants.push(tracker("k15, stacks, quarantine=16M", "quarantine=16M"));
    if let Some(lsan) = compile(
        dir,
        &name("lsan"),
        "clang++-14",
        &[opt, "-fsanitize=leak"],
        false,
    ) {
        variants.push(peer(
            "LeakSanitizer (clang -fsanitize=leak)",
            &[],
            &lsan,
            vec![],
            1,
        ));
    }
    if !with_slow_peers {
        return variants;
    }
    // Side by side on the same unmodified binary: the tracker preloaded, then heaptrack.
    variants.push(peer(
        "k15, LD_PRELOAD on the plain build",
        &[],
        &plain,
        vec![
            ("LD_PRELOAD", support::preload_lib().display().to_string()),
            ("K15_MEMORY_OPTIONS", "report=0".to_owned()),
        ],
        1,
    ));
    if on_path("heaptrack") {
        let out = dir.join("heaptrack.out").display().to_string();
        variants.push(peer(
            "heaptrack",
            &["heaptrack", "-o", &out],
            &plain,
            vec![],
            10,
        ));
    } else {
        println!("  (heaptrack skipped: install heaptrack)");
    }
    if on_path("valgrind") {
        variants.push(peer(
            "valgrind --leak-check=full",
            &["valgrind", "-q", "--leak-check=full"],
            &plain,
            vec![],
            40,
        ));
    }
    variants
}

fn main() {
    let dir = support::scratch("bench_new_delete");
    // -O2: the allocator cost stands out; -O0: a debug build, where the tracker is meant to live.
    let runs = [
        ("-O2", true, Family::NewDelete),
        ("-O0", false, Family::NewDelete),
        ("-O2", false, Family::MallocFree),
        ("-O0", false, Family::MallocFree),
    ];
    for (opt, with_slow_peers, family) in runs {
        let variants = variants(&dir, opt, with_slow_peers, family);
        let pairs = match family {
            Family::NewDelete => "new/delete",
            Family::MallocFree => "malloc/free",
        };
        for threads in [1, 2] {
            println!("\nchurn built {opt}, {threads} thread(s), {PAIRS} {pairs} pairs per thread (best of {RUNS}; slow peers on fewer pairs, once):");
            print_rows(&variants, threads, family, false, &dir);
        }
        if opt == "-O2" && family == Family::NewDelete {
            shared_store(&variants, &dir);
        }
    }
}

/// One line per variant: nanoseconds per pair and the ratio to the first (glibc).
fn print_rows<'a>(
    variants: impl IntoIterator<Item = &'a Variant>,
    threads: u32,
    family: Family,
    shared: bool,
    dir: &Path,
) {
    println!(
        "  {:<42} {:>12} {:>10}",
        "allocator", "ns per pair", "vs glibc"
    );
    let mut baseline = None;
    for v in variants {
        match measure(v, threads, family, shared, dir) {
            Some(ns) => {
                let base = *baseline.get_or_insert(ns);
                println!("  {:<42} {:>12.1} {:>9.2}x", v.name, ns, ns / base);
            }
            None => println!("  {:<42} {:>12}", v.name, "failed"),
        }
    }
}

/// Churn whose threads also store to one shared global every iteration, as engine code does (a
/// frame counter): each store of the allocator waits behind the line the other thread holds, so
/// what counts is how many stores a pair makes, which cachegrind counts (one thread, the
/// difference between 400,000 and 200,000 pairs, so that start-up and exit fall away).
fn shared_store(variants: &[Variant], dir: &Path) {
    let wanted = [
        "glibc new/delete (baseline)",
        "mimalloc (LD_PRELOAD)",
        "k15, stack_depth=0",
        "k15, stacks (DWARF, default)",
        "LeakSanitizer (clang -fsanitize=leak)",
    ];
    let chosen: Vec<&Variant> = variants
        .iter()
        .filter(|v| wanted.contains(&v.name))
        .collect();
    for threads in [1, 2] {
        println!("\nchurn built -O2 with a store to one shared global every iteration, {threads} thread(s), {PAIRS} new/delete pairs per thread (best of {RUNS}):");
        print_rows(
            chosen.iter().copied(),
            threads,
            Family::NewDelete,
            true,
            dir,
        );
    }
    if !on_path("valgrind") {
        println!("  (stores per pair skipped: install valgrind)");
        return;
    }
    println!("\nper new/delete pair of churn -O2 (cachegrind: instructions, loads, stores):");
    println!(
        "  {:<42} {:>8} {:>8} {:>8}",
        "allocator", "instr", "loads", "stores"
    );
    for v in chosen
        .iter()
        .filter(|v| v.name.starts_with("glibc") || v.name.starts_with("k15"))
    {
        match per_pair_counts(v, dir) {
            Some([instr, loads, stores]) => {
                println!("  {:<42} {instr:>8.1} {loads:>8.1} {stores:>8.1}", v.name)
            }
            None => println!("  {:<42} {:>8}", v.name, "failed"),
        }
    }
}

/// The number that follows `marker` in `line`.
fn number_after(line: &str, marker: &str) -> Option<f64> {
    line.split(marker)
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Instructions, loads and stores per pair under cachegrind, one thread.
fn per_pair_counts(v: &Variant, dir: &Path) -> Option<[f64; 3]> {
    let counts = |pairs: u64| -> Option<[f64; 3]> {
        let out = Command::new("valgrind")
            .args([
                "--tool=cachegrind",
                "--cache-sim=yes",
                "--cachegrind-out-file=/dev/null",
            ])
            .arg(&v.exe)
            .args(["1", &pairs.to_string(), "new"])
            .current_dir(dir)
            .envs(v.env.iter().map(|(k, val)| (*k, val.as_str())))
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stderr).replace(',', "");
        // "I   refs:  N" and "D   refs:  N  (R rd   + W wr)"
        let line = |label: &str| text.lines().find(|l| l.contains(label)).map(str::to_owned);
        let (instructions, data) = (line("I   refs:")?, line("D   refs:")?);
        Some([
            number_after(&instructions, "refs:")?,
            number_after(&data, "(")?,
            number_after(&data, "+")?,
        ])
    };
    let (small, large) = (counts(200_000)?, counts(400_000)?);
    Some([0, 1, 2].map(|i| (large[i] - small[i]) / 200_000.0))
}
