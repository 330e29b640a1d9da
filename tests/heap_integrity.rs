//! Heap damage is caught with stacks and survived: overruns and underruns found at `delete`, by
//! `check_heap()` and at exit, each checked for its kind, stacks, offset and bytes, the program
//! reaching its last line, the report written and `stats()` matching what the program holds;
//! valgrind (on the -DK15_MEMORY_DISABLED build) agrees on which blocks were damaged. Sizes at
//! the edge of the address space are refused by every `operator new` form.

mod support;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

const SOURCE: &str = "tests/cpp/heap_damage.cpp";

/// The tracked and the plain build of the damage program, made once per test binary.
fn programs() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = support::scratch("heap_integrity");
        let tracked = support::build(&dir, "heap_damage", &[SOURCE], &[]);
        let plain = support::build(
            &dir,
            "heap_damage_plain",
            &[SOURCE],
            &["-DK15_MEMORY_DISABLED"],
        );
        (tracked, plain)
    })
}

/// Runs one kind of damage under the tracker and checks what every kind must give: the program
/// reached its last line, the report was written, and the live blocks are those it holds.
fn run_kind(kind: &str) -> support::Run {
    run_kind_with(kind, "")
}

/// As [`run_kind`], with `options`.
fn run_kind_with(kind: &str, options: &str) -> support::Run {
    run_kind_as(kind, kind, options)
}

/// As [`run_kind_with`], its report named `report`: tests that run the same kind at the same
/// time (in parallel threads) must not write over each other's reports.
fn run_kind_as(kind: &str, report: &str, options: &str) -> support::Run {
    // malloc=0: the live blocks compared are the program's `new`s, not the C runtime's buffers.
    let options = format!("malloc=0:{options}");
    let run = support::run_with(&programs().0, report, &options, &[], &[kind]);
    let stdout = run.stdout();
    assert!(
        run.output.status.success(),
        "{kind}: {:?}\n{}",
        run.output.status,
        run.stderr()
    );
    assert!(stdout.contains("last line"), "{kind}: {stdout}");
    assert!(!run.json.is_null(), "{kind}: no report written");
    let held = stdout
        .lines()
        .find_map(|l| l.strip_prefix("live blocks "))
        .expect("the stats line");
    let (live, held) = held.split_once(", held ").unwrap();
    let (live, held): (u64, u64) = (live.parse().unwrap(), held.parse().unwrap());
    assert_eq!(live, held, "{kind}: stats() against what the program holds");
    run
}

/// The damaged blocks valgrind names on the plain build, as ("after" | "before", size). Its
/// red zones widened to 64 bytes: with the default 16, a write 32 bytes in front of a block was
/// told against whichever block lay nearest.
fn valgrind_damaged(kind: &str) -> BTreeSet<(String, u64)> {
    let out = Command::new("valgrind")
        .args(["--error-exitcode=0", "--redzone-size=64"])
        .arg(&programs().1)
        .arg(kind)
        .output()
        .expect("valgrind is installed (.ci/run installs it)");
    let text = String::from_utf8_lossy(&out.stderr);
    text.lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once(" bytes ")?;
            let (direction, size) = rest.split_once(" a block of size ")?;
            let size = size
                .split_whitespace()
                .next()?
                .replace(',', "")
                .parse()
                .ok()?;
            Some((direction.to_owned(), size))
        })
        .collect()
}

/// What the tracker names, in valgrind's terms.
fn tracker_damaged(run: &support::Run) -> BTreeSet<(String, u64)> {
    run.errors()
        .iter()
        .filter_map(|e| {
            let direction = match e["kind"].as_str()? {
                "overrun" => "after",
                "underrun" => "before",
                "invalid_free" if e["offset"].is_u64() => "inside",
                "double_free" | "use_after_free" => "inside",
                _ => return None,
            };
            Some((direction.to_owned(), e["size"].as_u64()?))
        })
        .collect()
}

fn function_names(stack: &Value) -> Vec<String> {
    stack
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["function"].as_str().unwrap_or("??").to_owned())
        .collect()
}

/// The one error of a run, checked for kind, size, bytes, the allocation site and both stacks.
fn only_error<'a>(run: &'a support::Run, kind: &str, size: u64) -> &'a Value {
    assert_eq!(run.errors().len(), 1, "{}", run.text);
    let error = &run.errors()[0];
    assert_eq!(error["kind"], kind, "{}", run.text);
    assert_eq!(error["size"], size, "{}", run.text);
    let alloc = function_names(&error["alloc_stack"]);
    assert!(alloc.iter().any(|f| f == "main"), "{alloc:?}");
    assert!(!error["free_stack"].as_array().unwrap().is_empty());
    assert_eq!(
        run.stderr()
            .matches(&format!("Memory error: {kind}"))
            .count(),
        1
    );
    error
}

fn agrees_with_valgrind(kind: &str, run: &support::Run) {
    assert_eq!(
        tracker_damaged(run),
        valgrind_damaged(kind),
        "{kind}: tracker and valgrind name different blocks\n{}",
        run.text
    );
}

#[test]
fn a_one_byte_overrun_is_reported_at_delete_with_its_byte() {
    let run = run_kind("overrun_by_one");
    let error = only_error(&run, "overrun", 24);
    assert_eq!(error["offset"], 24);
    assert_eq!(error["bytes"], "41");
    assert_eq!(error["file"], SOURCE);
    assert_eq!(error["line"], support::line_of(SOURCE, "// ALLOC make"));
    let freed = function_names(&error["free_stack"]);
    assert!(freed[0].contains("release"), "{freed:?}");
    assert!(freed[1].contains("overrun_by_one"), "{freed:?}");
    assert!(
        run.text
            .contains("written past its end: 1 byte at offset 24: 41"),
        "{}",
        run.text
    );
    assert_eq!(run.leaks().len(), 0);
    agrees_with_valgrind("overrun_by_one", &run);
}

#[test]
fn a_sixteen_byte_overrun_into_the_next_block_is_survived() {
    let run = run_kind("overrun_by_sixteen");
    assert_eq!(run.error_kinds(), ["overrun"], "{}", run.text);
    let error = &run.errors()[0];
    assert_eq!(error["size"], 40);
    assert_eq!(error["offset"], 40);
    // The guard's 8 bytes and the first word of the next block's header (80 bytes on: its
    // 32-byte header, 40 bytes, the 8 its class leaves), which its check word gives back: one
    // error, whose bytes run to the end of the header's words in front of its size (the check
    // word cannot tell which of them changed; here the second is the header's own).
    let bytes = error["bytes"].as_str().unwrap();
    assert!(bytes.starts_with(&["42"; 16].join(" ")), "{bytes}");
    let address = |field: &Value| u64::from_str_radix(&field.as_str().unwrap()[2..], 16).unwrap();
    assert_eq!(address(&error["victim"]), address(&error["address"]) + 80);
    assert_eq!(run.leaks().len(), 0, "{}", run.text);
    agrees_with_valgrind("overrun_by_sixteen", &run);
}

#[test]
fn a_memcpy_one_byte_too_long_into_an_object_is_an_overrun() {
    let run = run_kind("memcpy_overrun");
    let error = only_error(&run, "overrun", 24);
    assert_eq!(error["offset"], 24);
    assert_eq!(error["bytes"], "00", "the string's terminating zero");
    assert_eq!(error["line"], support::line_of(SOURCE, "// ALLOC pose"));
    agrees_with_valgrind("memcpy_overrun", &run);
}

#[test]
fn a_one_byte_underrun_is_an_underrun_and_the_block_is_freed() {
    let run = run_kind("underrun");
    let error = only_error(&run, "underrun", 56);
    assert_eq!(error["offset"], -1);
    assert_eq!(error["bytes"], "55");
    assert_eq!(run.leaks().len(), 0, "the block was freed: {}", run.text);
    assert!(run.text.contains("No leaks"), "{}", run.text);
    agrees_with_valgrind("underrun", &run);
}

/// Each error of `run` as (kind, size, offset, bytes shown).
fn damage_found(run: &support::Run) -> Vec<(String, u64, i64, String)> {
    run.errors()
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["size"].as_u64().unwrap(),
                e["offset"].as_i64().unwrap(),
                e["bytes"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// What [`damage_found`] lists for an underrun of `bytes` 'U's in front of a block of `size`.
fn underrun_of(size: u64, bytes: usize) -> (String, u64, i64, String) {
    let shown = vec!["55"; bytes].join(" ");
    ("underrun".to_owned(), size, -(bytes as i64), shown)
}

/// 8 bytes leave nothing of the check word to name the block by: a large or aligned block is
/// known from its shard's list instead (before, its `delete` was an `invalid_free` that left it
/// allocated, and a live one went missing from the report).
#[test]
fn an_underrun_over_the_check_word_of_a_large_or_aligned_block_is_an_underrun_of_that_block() {
    far_underruns_are_their_blocks("far_underruns", [8; 4]);
}

/// Further in front, over the fields the check word covers (the size and kind, then the site and
/// stack, then the thread and number): the header's copy (in front of its list links) puts it
/// back, so each block is still that block, its underrun shown byte for byte and its
/// allocation's stack whole (before, each `delete` was an `invalid_free` that left the block
/// allocated, and the live one went missing from the report).
#[test]
fn an_underrun_over_the_whole_header_of_a_large_or_aligned_block_is_an_underrun_of_that_block() {
    far_underruns_are_their_blocks("whole_header_underruns", [16, 24, 32, 32]);
}

/// `kind` wrote `bytes` in front of a large block, a block aligned to 256 bytes, one aligned to a
/// page, and a large one left live: each is reported as that block's underrun with its bytes and
/// its allocation's stack, `check_heap()` finds the live one, which is listed as a leak, and
/// valgrind names the same blocks.
fn far_underruns_are_their_blocks(kind: &str, bytes: [usize; 4]) {
    let run = run_kind(kind);
    assert!(run.stdout().contains("check_heap: 1\n"), "{}", run.stdout());
    let sizes = [200000, 300, 500, 250000];
    let expected: Vec<_> = sizes
        .iter()
        .zip(bytes)
        .map(|(&size, n)| underrun_of(size, n))
        .collect();
    assert_eq!(damage_found(&run), expected, "{}", run.text);
    for error in run.errors() {
        let alloc = function_names(&error["alloc_stack"]);
        assert!(alloc[0].contains("make"), "{alloc:?}");
        assert!(
            alloc.iter().any(|f| f.contains("far_underruns")),
            "{alloc:?}"
        );
    }
    // The one left live is listed, a leak (`sink` has moved on since).
    assert_eq!(run.leaks().len(), 1, "{}", run.text);
    assert_eq!(run.leaks()[0]["size"], 250000);
    let stack = function_names(&run.leaks()[0]["stack"]);
    assert!(
        stack.iter().any(|f| f.contains("far_underruns")),
        "{stack:?}"
    );
    agrees_with_valgrind(kind, &run);
}

/// The kinds and addresses of a run's errors, and the address the program printed for its block.
fn errors_at(run: &support::Run) -> (Vec<(String, String)>, String) {
    let printed = run
        .stdout()
        .lines()
        .find_map(|l| l.strip_prefix("block at "))
        .expect("the block's address")
        .to_owned();
    let named = run
        .errors()
        .iter()
        .map(|e| {
            let field = |name: &str| e[name].as_str().unwrap().to_owned();
            (field("kind"), field("address"))
        })
        .collect();
    (named, printed)
}

/// Over the list links in front of the header too: the copy in front of them still names the
/// block, so its list is repaired around it (`heap_corruption`) and its header put back (its
/// `underrun`); it stays listed, a leak with its allocation's stack (before, it was cut from its
/// list and missing from the report).
#[test]
fn an_underrun_over_the_list_links_is_repaired_and_the_block_still_listed() {
    let run = run_kind("underrun_over_the_links");
    let (named, printed) = errors_at(&run);
    let expected = ["heap_corruption", "underrun"].map(|kind| (kind.to_owned(), printed.clone()));
    assert_eq!(named, expected, "{}", run.text);
    assert_eq!(run.leaks().len(), 1, "{}", run.text);
    let stack = function_names(&run.leaks()[0]["stack"]);
    assert!(
        stack.iter().any(|f| f.contains("underrun_kept_by")),
        "{stack:?}"
    );
}

/// Over the copy as well, nothing names the block any more: it is cut from its list, and the
/// damage named by that block (before, with no listed block left beside the gap, by address
/// 0x20).
#[test]
fn an_underrun_over_the_header_copy_names_the_block_it_cut_from_the_list() {
    let run = run_kind("underrun_over_the_copy");
    let (named, printed) = errors_at(&run);
    assert_eq!(
        named,
        [("heap_corruption".to_owned(), printed)],
        "{}",
        run.text
    );
}

/// Random underruns of up to 16, 40, 64 and 150 bytes in front of 150 live blocks from outside
/// the heap (large, and aligned from 128 bytes to a page), among freed ones, then frees of them
/// by another thread and this one: whatever they overwrite (headers, their copies, list links,
/// the offsets of their memory), the program reaches its last line with the report written.
/// Before, a `delete` followed a link into a block freed since and crashed (underruns of 57
/// bytes or more).
#[test]
fn random_underruns_of_large_and_aligned_blocks_never_crash_the_tracker() {
    for seed in 1..=6 {
        for longest in ["16", "40", "64", "150"] {
            let stacks = if seed % 2 == 1 {
                "stack_depth=0"
            } else {
                "stack_depth=4"
            };
            let seed = seed.to_string();
            survives_random_damage(
                &format!("seed {seed}, {stacks}, underruns up to {longest} bytes"),
                stacks,
                &[&seed, longest, "far"],
                &["underrun", "overrun", "heap_corruption", "invalid_free"],
            );
        }
    }
}

/// Underruns of 5 to 8 bytes in front of heap blocks (`new`, `new[]`, `K15_NEW`, compact) whose
/// live neighbour in front runs into their header with no guard between: too little of the
/// check word is left to name the block, but its record does (the fields in front of the check
/// word are as it says, so nothing came from the front). Before, each was an overrun of the
/// neighbour, showing the block's own header words as bytes written past its end.
#[test]
fn a_heap_block_underrun_of_five_to_eight_bytes_is_not_an_overrun_of_its_neighbour() {
    let run = run_kind("near_underruns");
    assert_eq!(
        damage_found(&run),
        [(32, 5), (48, 6), (64, 7), (16, 8), (80, 8)].map(|(size, n)| underrun_of(size, n)),
        "{}",
        run.text
    );
    for error in run.errors() {
        let alloc = function_names(&error["alloc_stack"]);
        assert!(
            alloc.iter().any(|f| f.contains("near_underruns")),
            "{alloc:?}"
        );
        let freed = function_names(&error["free_stack"]);
        assert!(
            freed.iter().any(|f| f.contains("near_underruns")),
            "{freed:?}"
        );
    }
    assert_eq!(run.leaks().len(), 0, "every block was freed: {}", run.text);
    agrees_with_valgrind("near_underruns", &run);
}

/// `realloc` of such a block: the underrun reported, the block moved with its bytes and the old
/// one freed (before, it was freed and null returned, so the program went on with the old
/// pointer as after a failure).
#[test]
fn realloc_of_a_large_or_aligned_block_after_an_underrun_moves_it() {
    // Not `run_kind`: with `malloc=1` the C runtime's blocks count among the live ones.
    let kind = "far_underruns_realloc";
    let run = support::run_with(&programs().0, kind, "malloc=1", &[], &[kind]);
    assert!(
        run.stdout()
            .contains("moved and kept: 2, live blocks as before\n"),
        "{}\n{}",
        run.stdout(),
        run.text
    );
    let found: Vec<(&str, u64)> = run
        .errors()
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["size"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        found,
        [("underrun", 200000), ("underrun", 300)],
        "{}",
        run.text
    );
}

#[test]
fn check_heap_finds_damage_once_and_the_exit_report_finds_the_rest() {
    let run = run_kind("check_heap");
    let stdout = run.stdout();
    assert!(stdout.contains("check_heap: 2\n"), "{stdout}");
    assert!(
        stdout.contains("check_heap again: 0\n"),
        "repaired: {stdout}"
    );
    let errors = run.errors();
    let found: Vec<(&str, u64, &str)> = errors
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap(),
                e["size"].as_u64().unwrap(),
                e["detail"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let mut by_check: Vec<_> = found[..2].to_vec();
    by_check.sort();
    assert_eq!(
        by_check,
        [
            ("overrun", 72, "found by check_heap()"),
            ("underrun", 88, "found by check_heap()")
        ],
        "{}",
        run.text
    );
    assert_eq!(
        found[2],
        ("overrun", 104, "found by the report's heap check")
    );
    assert_eq!(errors[2]["offset"], 107);
    for error in &errors[..2] {
        let checked = function_names(&error["free_stack"]);
        assert!(checked[0].contains("found_by_check_heap"), "{checked:?}");
        assert!(error["freed_with"].is_null());
    }
    assert_eq!(run.leaks().len(), 1);
    assert_eq!(run.leaks()[0]["size"], 104);
    agrees_with_valgrind("check_heap", &run);
}

#[test]
fn every_operator_new_form_refuses_sizes_at_the_edge_of_the_address_space() {
    let dir = support::scratch("edge_sizes");
    let exe = support::build(&dir, "edge_sizes", &["tests/cpp/edge_sizes.cpp"], &[]);
    for (seed, options) in [
        ("1", "stack_depth=0"),
        ("2", ""),
        ("3", "stack_depth=0:budget=16M"),
    ] {
        let run = support::run_with(&exe, &format!("edge_{seed}"), options, &[], &[seed, "3000"]);
        let stdout = run.stdout();
        assert!(run.output.status.success(), "{options}: {}", run.stderr());
        assert!(
            stdout.contains("refused 3000 of 3000, wrong 0"),
            "{options}: {stdout}"
        );
        assert!(stdout.contains("counts unchanged: yes"), "{stdout}");
        assert!(stdout.contains("ordinary blocks misaligned: 0"), "{stdout}");
        assert!(stdout.contains("last line"));
        assert_eq!(run.leaks().len(), 0, "{}", run.text);
    }
}

#[test]
fn a_delete_inside_a_block_names_the_block_and_frees_nothing() {
    let run = run_kind("interior_delete");
    let errors = run.errors();
    assert_eq!(
        run.error_kinds(),
        ["invalid_free", "invalid_free"],
        "{}",
        run.text
    );
    assert_eq!(
        (errors[0]["size"].as_u64(), errors[0]["offset"].as_u64()),
        (Some(120), Some(8))
    );
    assert_eq!(
        (errors[1]["size"].as_u64(), errors[1]["offset"].as_u64()),
        (Some(1 << 20), Some(5000))
    );
    for error in errors {
        assert_eq!(error["line"], support::line_of(SOURCE, "// ALLOC make"));
        assert!(function_names(&error["alloc_stack"])
            .iter()
            .any(|f| f.contains("interior_delete")));
    }
    assert!(run
        .text
        .contains("delete[] of a pointer 8 bytes into a live block of 120 bytes"));
    assert_eq!(
        run.leaks().len(),
        0,
        "the blocks were freed afterwards: {}",
        run.text
    );
    agrees_with_valgrind("interior_delete", &run);
}

#[test]
fn a_delete_through_a_second_base_class_names_the_object() {
    let run = run_kind("second_base_delete");
    let error = only_error(&run, "invalid_free", 24);
    assert_eq!(error["offset"], 8);
    assert_eq!(error["line"], support::line_of(SOURCE, "// ALLOC both"));
    agrees_with_valgrind("second_base_delete", &run);
}

/// What both runs of `smash_the_header_behind` must give: the layout they rely on, and one
/// `overrun` of the block in front (of `size` bytes, `stride` bytes in front of the victim)
/// whose bytes are the guard its class leaves (`guard`) and the whole header behind, all
/// overwritten, its victim the block behind, still tracked (its header rebuilt from its record,
/// it is freed when the program frees it: `run_kind` checks `stats()`).
fn assert_wiped_header(run: &support::Run, size: u64, guard: usize, stride: u64) {
    assert!(
        run.stdout().contains("smashed: neighbour"),
        "the layout this test relies on"
    );
    assert_eq!(run.error_kinds(), ["overrun"], "{}", run.text);
    let error = &run.errors()[0];
    assert_eq!(
        (&error["size"], &error["offset"]),
        (&size.into(), &size.into())
    );
    let header = if size <= 16 { 16 } else { 32 };
    assert_eq!(error["bytes"], ["48"; 64][..guard + header].join(" "));
    let address = |field: &Value| u64::from_str_radix(&field.as_str().unwrap()[2..], 16).unwrap();
    assert_eq!(
        address(&error["victim"]),
        address(&error["address"]) + stride
    );
    assert!(run.text.contains("SUMMARY"), "{}", run.text);
}

#[test]
fn an_overrun_that_wipes_the_next_header_is_reported_and_the_report_still_written() {
    let run = run_kind("smashed_header");
    assert_wiped_header(&run, 200, 8, 240);
    assert_eq!(
        run.errors()[0]["line"],
        support::line_of(SOURCE, "// ALLOC make")
    );
    agrees_with_valgrind("smashed_header", &run);
}

#[test]
fn compact_blocks_report_underruns_overruns_and_double_frees_like_the_others() {
    let run = run_kind_with("compact_errors", "free_stacks=1");
    assert_eq!(
        run.error_kinds(),
        ["underrun", "overrun", "double_free"],
        "{}",
        run.text
    );
    let errors = run.errors();
    for (error, size) in errors.iter().zip([12, 9, 8]) {
        assert_eq!(error["size"], size, "{}", run.text);
        assert!(error["file"].is_null(), "a plain new has no site: {error}");
        assert_eq!(
            error["alloc_stack"][0]["line"],
            support::line_of(SOURCE, "// ALLOC make_plain"),
            "{error}"
        );
    }
    assert_eq!(
        (&errors[0]["offset"], &errors[0]["bytes"]),
        (&(-1).into(), &"56".into())
    );
    assert_eq!(
        (&errors[1]["offset"], &errors[1]["bytes"]),
        (&9.into(), &"57".into())
    );
    let first = function_names(&errors[2]["previous_free_stack"]);
    assert!(first[0].contains("first_delete"), "{first:?}");
    assert_eq!(run.leaks().len(), 0, "{}", run.text);
    agrees_with_valgrind("compact_errors", &run);
}

/// The block in front fills its 16 bytes, so no guard of its own lies behind it, and the 16
/// bytes wipe the whole header behind: named as valgrind names it, from its `delete`, which saw
/// the damage behind it.
#[test]
fn an_overrun_that_wipes_a_compact_header_is_reported_and_that_block_still_tracked() {
    let run = run_kind("compact_smashed");
    assert_wiped_header(&run, 16, 0, 32);
    agrees_with_valgrind("compact_smashed", &run);
}

#[test]
fn a_double_free_names_the_first_delete_with_free_stacks() {
    let sizes = [24, 64 << 10, 1 << 20, 64, 3000];
    let run = run_kind_with("double_frees", "free_stacks=1");
    assert_eq!(run.error_kinds(), ["double_free"; 5], "{}", run.text);
    for (error, size) in run.errors().iter().zip(sizes) {
        assert_eq!(error["size"], size, "{}", run.text);
        let first = function_names(&error["previous_free_stack"]);
        let second = function_names(&error["free_stack"]);
        assert!(first[0].contains("first_delete"), "{size}: {first:?}");
        assert!(second[0].contains("second_delete"), "{size}: {second:?}");
    }
    // The block freed first on another thread: its first delete ran there.
    let other = function_names(&run.errors()[4]["previous_free_stack"]);
    assert!(!other.iter().any(|f| f == "main"), "{other:?}");
    assert_eq!(
        run.text.matches("first released from:").count(),
        5,
        "{}",
        run.text
    );
    agrees_with_valgrind("double_frees", &run);

    // Off by default (each delete would pay a stack capture): no previous stack then.
    let plain = run_kind("double_frees");
    assert_eq!(plain.error_kinds(), ["double_free"; 5]);
    assert!(plain
        .errors()
        .iter()
        .all(|e| e.get("previous_free_stack").is_none()));
}

#[test]
fn break_on_stops_in_the_debugger_at_the_allocation_the_report_numbers() {
    let run = run_kind_as("check_heap", "break_numbering", "");
    let leak = &run.leaks()[0];
    let (thread, seq) = (
        leak["thread"].as_u64().unwrap(),
        leak["seq"].as_u64().unwrap(),
    );
    assert!(run
        .text
        .contains(&format!("blocks (thread/seq): {thread}/{seq}")));
    // The same numbering as the run above (malloc=0: its `new`s only).
    let options = format!("malloc=0:break_on={thread}/{seq}:report=0");

    // Without a debugger, SIGTRAP ends the program there, before its last line.
    let alone = support::run_with(&programs().0, "break_alone", &options, &[], &["check_heap"]);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        alone.output.status.signal(),
        Some(5),
        "{:?}",
        alone.output.status
    );
    assert!(!alone.stdout().contains("last line"));
    assert!(alone
        .stderr()
        .contains(&format!("break_on={thread}/{seq}: allocation of 104 bytes")));

    // README's recipe: gdb stops inside the allocation; the stack shows who made the block.
    let gdb = Command::new("timeout")
        .args(["120", "gdb", "-batch", "-nx", "-ex", "run", "-ex", "bt"])
        .arg("--args")
        .arg(&programs().0)
        .arg("check_heap")
        .env("K15_MEMORY_OPTIONS", &options)
        .output()
        .expect("gdb is installed");
    let text = String::from_utf8_lossy(&gdb.stdout);
    assert!(text.contains("SIGTRAP"), "{text}");
    let frames = text
        .lines()
        .filter(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(frames.contains("make"), "{frames}");
    assert!(frames.contains("found_by_check_heap"), "{frames}");
}

#[test]
fn writes_after_delete_are_caught_by_the_quarantine() {
    let run = run_kind_with("use_after_free", "quarantine=64K");
    assert!(
        run.stdout().contains("uaf check_heap: 1\n"),
        "{}",
        run.stdout()
    );
    assert_eq!(run.error_kinds(), ["use_after_free"; 3], "{}", run.text);
    let errors = run.errors();
    let found: Vec<(u64, i64, &str, &str)> = errors
        .iter()
        .map(|e| {
            (
                e["size"].as_u64().unwrap(),
                e["offset"].as_i64().unwrap(),
                e["bytes"].as_str().unwrap(),
                e["detail"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            (40, 5, "5a", "found by check_heap()"),
            (56, 0, "59", "found when the block left quarantine"),
            (72, 71, "58", "found by the report's heap check"),
        ],
        "{}",
        run.text
    );
    for error in errors {
        assert!(function_names(&error["alloc_stack"])
            .iter()
            .any(|f| f.contains("freed")));
        let freed_by = function_names(&error["previous_free_stack"]);
        assert!(
            freed_by[0].contains("release") && freed_by[1].contains("freed"),
            "{freed_by:?}"
        );
    }
    let checked = function_names(&errors[0]["free_stack"]);
    assert!(checked[0].contains("use_after_free"), "{checked:?}");
    assert!(run.text.contains("freed from:"), "{}", run.text);
    agrees_with_valgrind("use_after_free", &run);

    // Without quarantine, nothing is caught (and nothing breaks).
    let off = run_kind("use_after_free");
    assert!(off.error_kinds().is_empty(), "{}", off.text);
}

#[test]
fn random_overruns_of_any_length_never_crash_the_tracker() {
    // Blocks of up to 600 bytes, then of up to 16 (all with compact headers).
    let runs = (1..=6).flat_map(|seed| ["8", "64", "300"].map(|longest| (seed, longest, "600")));
    let compact = (7..=10).flat_map(|seed| ["4", "16", "40"].map(|longest| (seed, longest, "16")));
    for (seed, longest, largest) in runs.chain(compact) {
        let seed = seed.to_string();
        // Half without stacks: `new` then takes its quick path, which leaves a free list whose
        // link an overrun reached to the general one.
        let stacks = if seed.ends_with(['1', '3', '5', '7', '9']) {
            "stack_depth=0"
        } else {
            "stack_depth=2"
        };
        survives_random_damage(
            &format!(
                "seed {seed}, {stacks}, overruns up to {longest} bytes of blocks to {largest}"
            ),
            stacks,
            &[seed.as_str(), longest, largest],
            &["overrun", "heap_corruption", "invalid_free"],
        );
    }
}

/// Runs `tests/cpp/random_overruns.cpp` with `args` and `stacks` (the run `what`): the program
/// reached its last line with the report written, and reported errors of the kinds `found`
/// alone, the first of them among them.
fn survives_random_damage(what: &str, stacks: &str, args: &[&str], found: &[&str]) {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let exe = BUILT.get_or_init(|| {
        let dir = support::scratch("random_overruns");
        support::build(
            &dir,
            "random_overruns",
            &["tests/cpp/random_overruns.cpp"],
            &[],
        )
    });
    let run = support::run_with(exe, found[0], stacks, &[], args);
    assert!(
        run.output.status.success(),
        "{what}: {:?}\n{}",
        run.output.status,
        run.stderr()
    );
    assert!(run.stdout().contains("last line"), "{what}");
    assert!(run.text.contains("SUMMARY"), "{what}: no report");
    let kinds = run.error_kinds();
    assert!(kinds.iter().any(|k| k == found[0]), "{what}: {kinds:?}");
    assert!(
        kinds.iter().all(|k| found.contains(&k.as_str())),
        "{what}: {kinds:?}"
    );
}
