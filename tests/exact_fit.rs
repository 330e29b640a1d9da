//! One-byte overruns of blocks that fill their size class exactly, where no guard bytes lie
//! behind the block: the next block's header (live or free) or a span's guard word is the guard,
//! and the report names the block in front, with its size, the offset and the byte. Blocks of
//! 16 bytes without a site (compact headers, 16 bytes in front of the block) too.

mod support;

use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

const SOURCE: &str = "tests/cpp/exact_fit.cpp";

fn program() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = support::scratch("exact_fit");
        support::build(&dir, "exact_fit", &[SOURCE], &[])
    })
}

/// How the program allocates its blocks.
#[derive(Clone, Copy, PartialEq)]
enum Made {
    /// With `K15_NEW` (a site: full headers).
    AtSite,
    /// With a plain `new` (blocks of up to 16 bytes take compact headers).
    WithoutSite,
}

/// Runs one overrun and returns its only error, after checking that the program went on to
/// its last line and that the error names the block in front: its address, size, the offset
/// of the byte (its size: the byte right behind it), the byte and where it was allocated.
fn only_overrun(how: &str, size: usize) -> (support::Run, Value) {
    overrun_of(how, size, Made::AtSite)
}

/// [`only_overrun`] of blocks made as `made` says.
fn overrun_of(how: &str, size: usize, made: Made) -> (support::Run, Value) {
    let size_arg = size.to_string();
    let mut args = vec![how, size_arg.as_str()];
    if made == Made::WithoutSite {
        args.push("compact");
    }
    let report = args.join("_");
    let run = support::run_with(program(), &report, "malloc=0", &[], &args);
    let what = args.join(" ");
    let stdout = run.stdout();
    assert!(
        run.output.status.success(),
        "{what}: {stdout}{}",
        run.stderr()
    );
    assert!(stdout.contains("last line"), "{what}: {stdout}");
    assert_eq!(run.error_kinds(), ["overrun"], "{what}: {}", run.text);
    let error = run.errors()[0].clone();
    let front = stdout
        .lines()
        .find_map(|l| l.strip_prefix("front "))
        .expect("the front block's address");
    assert_eq!(error["address"], front, "{what}: not the block in front");
    assert_eq!(error["size"], size, "{what}");
    assert_eq!(error["offset"], size, "{what}");
    assert_eq!(error["bytes"], "58", "{what}");
    match made {
        Made::AtSite => {
            assert_eq!(error["file"], SOURCE, "{what}");
            assert_eq!(
                error["line"],
                support::line_of(SOURCE, "// ALLOC make"),
                "{what}"
            );
        }
        Made::WithoutSite => assert_eq!(
            error["alloc_stack"][0]["line"],
            support::line_of(SOURCE, "// ALLOC no_site"),
            "{what}: {error}"
        ),
    }
    assert_eq!(run.leaks().len(), 0, "{what}: {}", run.text);
    (run, error)
}

/// Sizes that fill their class exactly (with the 32-byte header: multiples of 16 up to 480,
/// then a quarter-step class).
const EXACT_FITS: [usize; 6] = [16, 32, 48, 96, 208, 608];

#[test]
fn an_exact_fit_overrun_into_a_live_neighbour_is_found_at_its_delete() {
    for size in EXACT_FITS {
        let (_, error) = only_overrun("delete", size);
        assert!(
            error["detail"]
                .as_str()
                .unwrap()
                .starts_with("found in the header behind the block"),
            "{size}: {error}"
        );
    }
}

#[test]
fn an_exact_fit_overrun_into_a_free_neighbour_is_found_when_it_is_reused() {
    for size in EXACT_FITS {
        let (run, _) = only_overrun("reuse", size);
        let stdout = run.stdout();
        assert!(stdout.contains("reused yes"), "{size}: {stdout}");
        assert!(stdout.contains("check_heap 1"), "{size}: {stdout}");
    }
}

/// An overrun seen behind the block at its `delete` and confirmed later: its detail says so, and
/// its stack is the `delete`'s.
fn assert_seen_at_delete(what: &str, error: &Value) {
    assert!(
        error["detail"]
            .as_str()
            .unwrap()
            .starts_with("seen at its delete"),
        "{what}: {error}"
    );
    let freed = &error["free_stack"][0]["function"];
    assert!(
        freed.as_str().unwrap().contains("release"),
        "{what}: {error}"
    );
}

/// `how`'s overrun of every exact fit, and of a compact block, seen at the `delete`.
fn assert_every_fit_seen_at_delete(how: &str) {
    for size in EXACT_FITS {
        let (_, error) = only_overrun(how, size);
        assert_seen_at_delete(&format!("{how} {size}"), &error);
    }
    let (_, error) = overrun_of(how, 16, Made::WithoutSite);
    assert_seen_at_delete(&format!("{how} 16 compact"), &error);
}

#[test]
fn an_exact_fit_overrun_of_a_block_deleted_first_is_blamed_on_it_with_its_delete() {
    assert_every_fit_seen_at_delete("freed_first");
}

/// The neighbour is free, so no `delete` of its own reads its header again: the damage is found
/// when the heap next reads it (at exit at the latest: its span empties, or the report's check),
/// and blamed on the block seen deleted with it behind, not on whatever that block's memory
/// served since (the report's own allocations reuse it, for one).
#[test]
fn an_exact_fit_overrun_into_a_free_neighbour_is_blamed_on_the_deleted_block_at_exit() {
    assert_every_fit_seen_at_delete("freed_alone");
}

/// The block is the only one of its class: nothing but its span's guard word lies behind it, and
/// the span empties when the block comes back to it (at exit), after which its pages go: the
/// guard word is read before they do.
#[test]
fn an_exact_fit_overrun_of_the_only_block_of_its_class_is_found_before_its_span_goes() {
    for size in [608, 2528] {
        let (_, error) = only_overrun("only_one", size);
        assert_seen_at_delete(&format!("only_one {size}"), &error);
    }
}

/// Looking behind an exact fit at its `delete` reads a header another thread may be changing:
/// what it sees there is only a suspect until the damage is found where nobody changes it, so a
/// program without overruns gets no error, however its threads race. Run several times.
#[test]
fn threads_racing_over_exact_fits_without_overruns_get_no_error() {
    for (round, made) in [Made::AtSite, Made::WithoutSite, Made::AtSite]
        .into_iter()
        .enumerate()
    {
        let mut args = vec!["threads", "16"];
        if made == Made::WithoutSite {
            args.push("compact");
        }
        let run = support::run_with(program(), &format!("threads_{round}"), "", &[], &args);
        assert!(run.output.status.success(), "{}", run.stderr());
        assert!(run.stdout().contains("check_heap 0"), "{}", run.stdout());
        assert!(run.stdout().contains("last line"), "{}", run.stdout());
        assert_eq!(run.error_kinds(), Vec::<String>::new(), "{}", run.text);
        assert_eq!(run.leaks().len(), 0, "{}", run.text);
    }
}

/// One thread overruns exact fits and deletes them at once while others churn through blocks of
/// the same classes (reusing the overrunning blocks' memory before the damage is found): every
/// overrun reported names the overrunning allocation, none a block that merely lay there later.
/// (A byte that lands on a free block's link while the heap relinks it may be found as a damaged
/// free list instead: then no block is named at all.)
#[test]
fn exact_fit_overruns_among_racing_threads_are_blamed_on_the_thread_that_wrote_them() {
    let culprit = support::line_of(SOURCE, "// ALLOC make_to_overrun");
    for round in 0..3 {
        let report = format!("threads_overrun_{round}");
        let run = support::run_with(program(), &report, "", &[], &["threads_overrun", "16"]);
        assert!(run.output.status.success(), "{}", run.stderr());
        assert!(run.stdout().contains("last line"), "{}", run.stdout());
        let errors = run.errors();
        let overruns = errors.iter().filter(|e| e["kind"] == "overrun").count();
        assert!(overruns > 0, "{}", run.text);
        for error in errors {
            match error["kind"].as_str() {
                Some("overrun") => assert_eq!(error["line"], culprit, "{error}"),
                _ => assert_eq!(
                    (&error["kind"], &error["alloc_stack"]),
                    (&"heap_corruption".into(), &serde_json::json!([])),
                    "{error}"
                ),
            }
        }
    }
}

#[test]
fn check_heap_finds_an_exact_fit_overrun_into_a_live_neighbour() {
    for size in EXACT_FITS {
        let (run, error) = only_overrun("check_heap", size);
        assert!(run.stdout().contains("check_heap 1"), "{size}");
        assert_eq!(error["detail"], "found by check_heap()", "{size}");
    }
}

#[test]
fn check_heap_finds_an_overrun_of_the_last_block_of_a_span() {
    for size in [16, 5088] {
        let (run, error) = only_overrun("span_end", size);
        assert!(run.stdout().contains("check_heap 1"), "{size}");
        assert_eq!(error["detail"], "found by check_heap()", "{size}");
    }
}

#[test]
fn an_exact_fit_overrun_of_a_compact_block_is_found_wherever_it_lands() {
    let (_, error) = overrun_of("delete", 16, Made::WithoutSite);
    assert!(
        error["detail"]
            .as_str()
            .unwrap()
            .starts_with("found in the header behind the block"),
        "{error}"
    );
    let (run, _) = overrun_of("reuse", 16, Made::WithoutSite);
    assert!(run.stdout().contains("reused yes"), "{}", run.stdout());
    assert!(run.stdout().contains("check_heap 1"), "{}", run.stdout());
    for how in ["check_heap", "span_end"] {
        let (run, error) = overrun_of(how, 16, Made::WithoutSite);
        assert!(run.stdout().contains("check_heap 1"), "{how}");
        assert_eq!(error["detail"], "found by check_heap()", "{how}");
    }
}

/// A process near its address-space limit (`ulimit -v`: the tracker's heap and tables take much
/// of it) must still never be aborted by the tracker, and its report must be written: the
/// symbolizer leaves a module raw when it has no room for its tables, and the report writes
/// through a small buffer when it cannot have its large one. Limits from 100 MB to 1.5 GB (the
/// heap's and the stack depot's smaller reservations are taken from about 500 MB down); an
/// allocation of the symbolizer or of the report's buffer failed (and aborted) at 280 and 340 MB.
#[test]
fn under_any_address_space_limit_the_tracker_never_aborts_and_the_report_is_written() {
    let wrapper = support::under_ulimit(program(), "exact_fit_limited", "-v");
    let limits = (100_000..500_000).step_by(10_000);
    for kib in limits.chain((500_000..=1_500_000).step_by(50_000)) {
        let limit = kib.to_string();
        let run = support::run_with(
            &wrapper,
            "limited",
            "malloc=0",
            &[],
            &[&limit, "delete", "48"],
        );
        // 0: the overrun was found; 3: the blocks came from glibc, never side by side.
        let status = run.output.status.code();
        assert!(
            matches!(status, Some(0) | Some(3)),
            "{kib} KiB: {:?}\n{}",
            run.output.status,
            run.stderr()
        );
        assert!(run.text.contains("SUMMARY"), "{kib} KiB: no report");
        if status == Some(0) {
            assert_eq!(run.error_kinds(), ["overrun"], "{kib} KiB: {}", run.text);
            let stack = &run.errors()[0]["alloc_stack"];
            assert!(!stack.as_array().unwrap().is_empty(), "{kib} KiB: no stack");
        }
    }
}

#[test]
fn walks_of_the_heap_while_200_threads_allocate_and_free_across_threads_find_every_block() {
    let dir = support::scratch("walk_stress");
    let exe = support::build(&dir, "walk_stress", &["tests/cpp/walk_stress.cpp"], &[]);
    let leak_line = support::line_of("tests/cpp/walk_stress.cpp", "// LEAK");
    for attempt in 0..4 {
        let run = support::run_with(&exe, "walk_stress", "malloc=0:stack_depth=4", &[], &[]);
        let what = format!("attempt {attempt}");
        let stdout = run.stdout();
        assert!(
            run.output.status.success(),
            "{what}: {:?} {stdout}{}",
            run.output.status,
            run.stderr()
        );
        assert!(
            stdout.contains("damage 0"),
            "{what}: {stdout}\n{}",
            run.text
        );
        assert!(stdout.contains("walks some"), "{what}: {stdout}");
        assert!(run.error_kinds().is_empty(), "{what}: {}", run.text);
        let mut sizes: Vec<u64> = run
            .leaks()
            .iter()
            .map(|leak| {
                assert_eq!(leak["line"], leak_line, "{what}: {leak}");
                leak["size"].as_u64().unwrap()
            })
            .collect();
        sizes.sort_unstable();
        let expected: Vec<u64> = (1000..1200).collect();
        assert_eq!(sizes, expected, "{what}: the report lost or made up blocks");
    }
}
