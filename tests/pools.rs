//! The pool API (`k15::memory::pool_alloc`, `pool_free`, `pool_reset`): an arena's sub-blocks
//! are blocks of their own in the leak report, classified as valgrind classifies the same
//! arena's mempool chunks (`VALGRIND_MEMPOOL_*` in the plain build of `tests/cpp/pool_arena.cpp`),
//! with the pool's name, their stacks and their tags; misuse is a memory error; the tags count
//! a sub-block's bytes once.

mod support;
use support::{census, line_of};

const SOURCE: &str = "tests/cpp/pool_arena.cpp";

#[test]
fn sub_blocks_are_classified_as_valgrind_classifies_mempool_chunks() {
    let dir = support::scratch("pool_arena_classes");
    let tracked = support::build(&dir, "pool_arena", &[SOURCE], &[]);
    let plain = support::build(
        &dir,
        "pool_arena_plain",
        &[SOURCE],
        &["-DK15_MEMORY_DISABLED"],
    );
    // The arena's object is 32 bytes; its 4096-byte block is no block of its own while it
    // holds live sub-blocks (both tools), and one again after a reset.
    let expected = [
        (
            "leak",
            census(&[
                ("reachable", 32, 1),
                ("reachable", 48, 1),
                ("direct", 56, 1),
                ("reachable", 64, 1),
            ]),
        ),
        (
            "reset",
            census(&[("reachable", 32, 1), ("reachable", 4096, 1)]),
        ),
        (
            "holds",
            census(&[
                ("reachable", 32, 1),
                ("reachable", 40, 1),
                ("reachable", 48, 1),
                ("direct", 72, 1),
                ("indirect", 40, 1),
            ]),
        ),
    ];
    for (mode, want) in expected {
        let programs = (tracked.as_path(), plain.as_path());
        support::assert_census_as_valgrind(programs, mode, "", "pool_arena.cpp", &want);
    }
}

#[test]
fn a_leaked_sub_block_names_its_pool_its_stack_and_its_tag() {
    let dir = support::scratch("pool_arena_leak");
    let exe = support::build(&dir, "pool_arena", &[SOURCE], &[]);
    let run = support::run_with(&exe, "leak", "", &[], &["leak"]);
    let direct: Vec<_> = run
        .leaks()
        .iter()
        .filter(|l| l["leak_kind"] == "direct")
        .collect();
    assert_eq!(direct.len(), 1, "{}", run.text);
    let leak = direct[0];
    assert_eq!(leak["size"], 56);
    assert_eq!(leak["language"], "Test/BumpArena");
    assert_eq!(leak["allocated_with"], "Test/BumpArena");
    assert_eq!(leak["tag"], "PoolTest/Leaky");
    let stack = leak["stack"].as_array().unwrap();
    assert!(
        stack[0]["function"]
            .as_str()
            .unwrap()
            .contains("Arena::alloc"),
        "the stack starts at the pool_alloc's caller: {stack:?}"
    );
    let leak_line = line_of(SOURCE, "keep(g_arena->alloc(56));");
    assert!(
        stack.iter().any(|f| f["line"] == leak_line),
        "no frame at line {leak_line}: {stack:?}"
    );
    assert!(
        run.text
            .contains("Direct leak of 56 bytes in 1 block (Test/BumpArena) allocated from:"),
        "{}",
        run.text
    );
    // The arena's own block (4096 bytes) holds live sub-blocks: no leak of its own.
    assert!(
        run.leaks().iter().all(|l| l["size"] != 4096),
        "{}",
        run.text
    );
}

#[test]
fn misuse_of_a_pool_is_reported_with_its_stack_and_survived() {
    let dir = support::scratch("pool_arena_misuse");
    let exe = support::build(&dir, "pool_arena", &[SOURCE], &[]);
    let run = support::run_surviving(&exe, "misuse", "", &[], &["misuse"]);
    assert_eq!(
        run.error_kinds(),
        ["invalid_free", "double_free", "invalid_free"],
        "{}",
        run.text
    );
    let inside = line_of(SOURCE, "MISUSE: inside a sub-block");
    let twice = line_of(SOURCE, "MISUSE: twice");
    let over = line_of(SOURCE, "MISUSE: over a live sub-block");
    for (error, (line, size, detail)) in run.errors().iter().zip([
        (inside, 32, "inside a sub-block"),
        (twice, 32, "already pool_free'd"),
        (over, 64, "over a live sub-block"),
    ]) {
        assert_eq!(error["allocator"], "Test/BumpArena");
        assert_eq!(error["size"], size, "{error}");
        assert!(
            error["detail"].as_str().unwrap().contains(detail),
            "{error}"
        );
        assert_eq!(error["free_stack"][0]["line"], line, "{error}");
        let alloc_stack = error["alloc_stack"].as_array().unwrap();
        assert!(
            alloc_stack[0]["function"]
                .as_str()
                .unwrap()
                .contains("Arena::alloc"),
            "{error}"
        );
    }
    // The sub-block that the overlapping pool_alloc replaced is gone, and so is the new one.
    assert!(
        run.leaks()
            .iter()
            .all(|l| l["language"] != "Test/BumpArena"),
        "{}",
        run.text
    );
}

#[test]
fn sub_blocks_count_against_their_tag_and_the_arena_s_bytes_count_once() {
    let dir = support::scratch("pool_arena_tags");
    let exe = support::build(&dir, "pool_arena", &[SOURCE], &[]);
    let run = support::run_with(&exe, "tags", "", &[], &["tags"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let stdout = run.stdout();
    let figures = |when: &str| -> Vec<u64> {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{when}:")))
            .unwrap_or_else(|| panic!("no {when} in {stdout}"));
        line.split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect()
    };
    let (made, carved, reset) = (figures("made"), figures("carved"), figures("reset"));
    // "PoolTest": the arena's object and block (32 + 4096), carved or not: the sub-blocks'
    // 300 bytes count against "PoolTest/Temp", lent from the arena's tag, its parent.
    assert_eq!(made[..2], [4128, 0], "{stdout}");
    assert_eq!(carved[..2], [4128, 300], "{stdout}");
    assert_eq!(reset[..2], [4128, 0], "{stdout}");
    // The process's live bytes hold the arena's block alone: the sub-blocks add nothing.
    assert_eq!(carved[2], reset[2], "{stdout}");
    let tags = run.json["tags"].as_array().unwrap();
    let temp = tags.iter().find(|t| t["name"] == "PoolTest/Temp").unwrap();
    assert_eq!(temp["total_allocations"], 6);
    assert_eq!(temp["total_bytes"], 900);
    assert_eq!(temp["peak_bytes"], 300);
    assert_eq!(temp["per_frame"]["allocations"]["mean"], 2.0);
    assert_eq!(temp["per_frame"]["frees"]["max"], 2);
    assert_eq!(temp["per_frame"]["bytes"]["max"], 300);
}
