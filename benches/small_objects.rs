//! The small-object memory benchmark: `programs/small_objects.cpp` (5 million 16-byte and
//! 1 million 200-byte blocks live at once, then all freed) under plain glibc, the tracker,
//! LeakSanitizer and mimalloc, each in its own process, all in one run; prints the peak resident
//! memory while the blocks were live and the resident memory after the frees, and their ratios
//! to plain glibc. Peers that are not installed are skipped with a note.
//! `cargo bench --bench small_objects`

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = "benches/programs/small_objects.cpp";

/// One way of running the workload.
struct Variant {
    name: &'static str,
    exe: PathBuf,
    env: Vec<(&'static str, String)>,
}

/// What the program printed, in KiB.
#[derive(Clone, Copy)]
struct Figures {
    peak: f64,
    freed: f64,
}

/// Builds the workload; `libraries` go after the source (the tracker's archive must).
fn compile(
    dir: &Path,
    name: &str,
    compiler: &str,
    flags: &[&str],
    libraries: &[&str],
) -> Option<PathBuf> {
    let exe = dir.join(name);
    let out = Command::new(compiler)
        .current_dir(support::repo())
        .args([
            "-std=c++17",
            "-O2",
            "-g",
            "-Wall",
            "-Wextra",
            "-I",
            "include",
        ])
        .args(flags)
        .arg(SOURCE)
        .args(libraries)
        .args(["-lpthread", "-ldl", "-o"])
        .arg(&exe)
        .output();
    match out {
        Ok(out) if out.status.success() => Some(exe),
        _ => {
            println!("  ({name} skipped: {compiler} could not build it)");
            None
        }
    }
}

fn measure(variant: &Variant, dir: &Path) -> Option<Figures> {
    let out = Command::new(&variant.exe)
        .current_dir(dir)
        .envs(variant.env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .ok()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let kib = |key: &str| -> Option<f64> {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(key))?
            .trim()
            .parse()
            .ok()
    };
    // VmHWM is updated lazily; the RSS read while everything was live may be a little higher.
    Some(Figures {
        peak: kib("peak_rss_kib ")?.max(kib("live_rss_kib ")?),
        freed: kib("freed_rss_kib ")?,
    })
}

fn main() {
    let dir = support::scratch("bench_small_objects");
    let plain = compile(&dir, "small_plain", "g++", &["-DK15_MEMORY_DISABLED"], &[])
        .expect("g++ builds the plain workload");
    let lib = support::static_lib().display().to_string();
    let tracked =
        compile(&dir, "small_k15", "g++", &[], &[&lib]).expect("the tracked workload builds");
    let mut variants = vec![
        Variant {
            name: "glibc (baseline)",
            exe: plain.clone(),
            env: vec![],
        },
        Variant {
            name: "k15, default options",
            exe: tracked.clone(),
            env: vec![],
        },
        Variant {
            name: "k15, stack_depth=0",
            exe: tracked,
            env: vec![("K15_MEMORY_OPTIONS", "stack_depth=0".to_owned())],
        },
    ];
    if let Some(lsan) = compile(
        &dir,
        "small_lsan",
        "clang++-14",
        &["-fsanitize=leak", "-DK15_MEMORY_DISABLED"],
        &[],
    ) {
        variants.push(Variant {
            name: "LeakSanitizer (clang -fsanitize=leak)",
            exe: lsan,
            env: vec![],
        });
    }
    let mimalloc = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2";
    if Path::new(mimalloc).exists() {
        variants.push(Variant {
            name: "mimalloc (LD_PRELOAD)",
            exe: plain,
            env: vec![("LD_PRELOAD", mimalloc.to_owned())],
        });
    } else {
        println!("  (mimalloc skipped: install libmimalloc-dev)");
    }
    println!("\nsmall objects: 5,000,000 x 16 B + 1,000,000 x 200 B live, then freed (MiB):");
    println!(
        "  {:<40} {:>10} {:>9} {:>12} {:>9}",
        "allocator", "peak RSS", "vs glibc", "after frees", "vs glibc"
    );
    let mut baseline: Option<Figures> = None;
    for variant in &variants {
        let Some(figures) = measure(variant, &dir) else {
            println!("  {:<40} {:>10}", variant.name, "failed");
            continue;
        };
        let base = baseline.get_or_insert(figures);
        println!(
            "  {:<40} {:>10.1} {:>8.2}x {:>12.1} {:>8.2}x",
            variant.name,
            figures.peak / 1024.0,
            figures.peak / base.peak,
            figures.freed / 1024.0,
            figures.freed / base.freed
        );
    }
}
