//! Issue 40's sweep: overruns of 1 to 64 bytes of blocks of every size class (those that fill
//! their class and those with room left), the overrun block freed first or last among eight,
//! with `malloc=0` so that `stats().live_blocks` counts exactly. An overrun is reported as one
//! `overrun` of the block written past (its address, size, offset, the bytes written and its
//! allocation line), where a header it damaged beyond repair is found too (docs/limits.md), and
//! no error is about another block: damage an overrun left in a free block's header, found again
//! later (a free list walked, the report), is not shown a second time as `heap_corruption`.

mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

const SOURCE: &str = "tests/cpp/overrun_sweep.cpp";

fn program() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = support::scratch("overrun_sweep");
        support::build(&dir, "overrun_sweep", &[SOURCE], &[])
    })
}

/// Every class boundary: sizes that fill their class (the class less the 32-byte header) and
/// sizes one byte either side, compact blocks (16 bytes or less without a site) and `@` full
/// ones, up to the heap's largest block.
const SIZES: &[&str] = &[
    "1", "8", "15", "16", "@16", "17", "24", "31", "32", "33", "40", "48", "63", "64", "96", "100",
    "128", "200", "256", "479", "480", "481", "608", "992", "1000", "2016", "4064", "4096", "8160",
    "16352", "65504", "131040",
];

/// One shape as the program printed it.
struct Shape {
    size: u64,
    length: usize,
    order: String,
    address: String,
    written: String,
    count_ok: bool,
}

fn shapes(stdout: &str) -> Vec<Shape> {
    let mut shapes: Vec<Shape> = Vec::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("shape ") {
            let f: Vec<&str> = rest.split(' ').collect();
            shapes.push(Shape {
                size: f[0].parse().unwrap(),
                length: f[1].parse().unwrap(),
                order: f[2].to_owned(),
                address: f[3].to_owned(),
                written: f[4].to_owned(),
                count_ok: false,
            });
        } else if line == "count ok" {
            shapes.last_mut().unwrap().count_ok = true;
        }
    }
    shapes
}

/// Runs the sweep for each seed (its reports named after `test`) and gives each shape with the
/// errors that name its block.
fn sweep(test: &str, mut check: impl FnMut(&str, &Shape, &[&serde_json::Value], usize)) {
    for seed in ["1", "2", "3"] {
        let mut args = vec![seed, "both", "all"];
        args.extend_from_slice(SIZES);
        let report = format!("{test}_{seed}");
        let run = support::run_with(program(), &report, "malloc=0", &[], &args);
        let stdout = run.stdout();
        assert!(stdout.contains("last line"), "{stdout}{}", run.stderr());
        let errors = run.errors();
        // Errors about no shape's block (a false heap_corruption or mismatched_delete).
        let about_others = errors.iter().filter(|e| e["kind"] != "overrun").count();
        for shape in &shapes(&stdout) {
            let named: Vec<_> = errors
                .iter()
                .filter(|e| e["address"] == shape.address.as_str() && e["size"] == shape.size)
                .filter(|e| {
                    let from = e["offset"].as_u64().map(|o| o.saturating_sub(shape.size));
                    e["bytes"]
                        .as_str()
                        .zip(from)
                        .is_some_and(|(b, from)| agree(b, &shape.written, from as usize))
                })
                .collect();
            check(seed, shape, &named, about_others);
        }
    }
}

/// Whether the bytes an error shows (`41 41`) from `from` bytes past the block's end agree with
/// those written (`4141`) as far as both go: a header overwritten in part is shown to the end of
/// its words, which its check word no longer tells apart, and a write of a byte a header held
/// already is no damage (the bytes shown start later). Shapes are told apart by their bytes.
fn agree(shown: &str, written: &str, from: usize) -> bool {
    let shown = shown.replace(' ', "");
    let written = written.get(2 * from..).unwrap_or("");
    let common = shown.len().min(written.len());
    !shown.is_empty() && !written.is_empty() && shown[..common] == written[..common]
}

/// Whether `named` is one `overrun` of the shape's block as the program made it: its size, the
/// offset of its end (or of the first byte written that changed what was there), its allocation
/// line, and at least the bytes written up to a guard's end and a header's first word.
fn named_rightly(shape: &Shape, named: &[&serde_json::Value]) -> bool {
    let unchanged = named
        .first()
        .and_then(|e| e["offset"].as_u64())
        .map_or(u64::MAX, |offset| offset.wrapping_sub(shape.size)) as usize;
    let shown = named
        .first()
        .and_then(|e| e["bytes"].as_str())
        .map_or(0, |b| b.replace(' ', "").len() / 2);
    named.len() == 1
        && named[0]["kind"] == "overrun"
        && unchanged < shape.length
        && named[0]["alloc_stack"][0]["line"]
            .as_u64()
            .is_some_and(|l| {
                l == support::line_of(SOURCE, "// ALLOC sweep")
                    || l == support::line_of(SOURCE, "// ALLOC sweep at site")
            })
        && unchanged + shown >= shape.length.min(8)
}

/// Every shape is named once, rightly (its kind, size, offset, stack and bytes), and every
/// record is kept: `stats().live_blocks` comes back to what it was once the eight blocks are
/// freed, the block whose header the overrun wiped among them (its header rebuilt from the
/// record kept beside the heap). Single-threaded, so damage behind an exact fit is reported at
/// its `delete` for certain.
#[test]
fn every_overrun_names_its_block_and_keeps_every_record() {
    let mut failed = Vec::new();
    sweep("every", |seed, shape, named, _| {
        if !(named_rightly(shape, named) && shape.count_ok) {
            failed.push(format!(
                "seed {seed}: {} bytes, {} written, freed {}: count {}, named by {named:?}",
                shape.size,
                shape.length,
                shape.order,
                if shape.count_ok { "ok" } else { "off" }
            ));
        }
    });
    assert!(
        failed.is_empty(),
        "{} failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// Damage that shows up again after its overrun was reported (in a free block's header kept
/// till a free list is walked or the report) is that overrun's, remembered as shown: no
/// `heap_corruption` and no other error but the shapes' overruns.
#[test]
fn no_error_is_about_another_block() {
    let mut failed = Vec::new();
    sweep("others", |seed, _, _, about_others| {
        if about_others > 0 && !failed.iter().any(|f: &String| f.starts_with(seed)) {
            failed.push(format!("{seed}: {about_others} errors that are no overrun"));
        }
    });
    assert!(failed.is_empty(), "seed {}", failed.join("\nseed "));
}

/// valgrind, on the plain build, names the same block for a subset of the shapes: each write
/// starts 0 bytes after a block of the shape's size. One run per size: valgrind tells four
/// shapes apart in a run (see the program).
#[test]
fn valgrind_names_the_block_the_sweep_overruns() {
    let dir = support::scratch("overrun_sweep_plain");
    let plain = support::build(
        &dir,
        "overrun_sweep_plain",
        &[SOURCE],
        &["-DK15_MEMORY_DISABLED"],
    );
    for size in ["16", "32", "100", "4064"] {
        let out = std::process::Command::new("valgrind")
            .arg(&plain)
            .args(["1", "first", "1,9,33,64", size])
            .output()
            .expect("valgrind is installed (.ci/run installs it)");
        let text = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let expected: Vec<u64> = shapes(&stdout).iter().map(|s| s.size).collect();
        assert_eq!(expected.len(), 4, "{stdout}");
        let named = support::valgrind_written_just_past(&text, "alloc'd");
        assert_eq!(named, expected, "{text}");
    }
}
