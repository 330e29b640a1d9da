//! A new block's stack waits in its shard's ring and is interned only if the block outlives its
//! place there: the stack a report or an error shows must be the block's own, whether it was
//! still in the ring, interned when the ring came round, settled at its thread's exit, or read
//! from the ring of a thread that was changing it meanwhile.

mod support;

use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

const SOURCE: &str = "tests/cpp/pending_stacks.cpp";

fn program() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = support::scratch("pending_stacks");
        support::build(&dir, "pending_stacks", &[SOURCE], &["-pthread"])
    })
}

fn run(how: &str) -> support::Run {
    let run = support::run_with(program(), how, "", &[], &[how]);
    assert!(
        run.output.status.success() && run.stdout().contains("last line"),
        "{how}: {}{}",
        run.stdout(),
        run.stderr()
    );
    run
}

/// The line of the innermost frame of `stack`.
fn top_line(stack: &Value) -> u64 {
    stack[0]["line"].as_u64().unwrap_or(0)
}

fn line(marker: &str) -> u64 {
    support::line_of(SOURCE, marker)
}

#[test]
fn leaks_made_before_and_after_the_ring_came_round_show_their_own_stacks() {
    let run = run("outlive");
    let mut found: Vec<(u64, u64)> = run
        .leaks()
        .iter()
        .map(|l| (l["size"].as_u64().unwrap(), top_line(&l["stack"])))
        .collect();
    found.sort();
    let expected = vec![
        (8, line("// ALLOC small_early")),
        (12, line("// ALLOC small_late")),
        (200, line("// ALLOC large_early")),
        (300, line("// ALLOC large_late")),
    ];
    assert_eq!(found, expected, "{}", run.text);
    for leak in run.leaks() {
        let below = leak["stack"][1]["function"].as_str().unwrap_or("");
        assert!(below.contains("outlive"), "called from outlive(): {leak}");
    }
}

#[test]
fn double_frees_long_after_and_right_after_name_where_the_block_was_made() {
    let run = run("double_free");
    assert_eq!(
        run.error_kinds(),
        ["double_free", "double_free"],
        "{}",
        run.text
    );
    let mut frees: Vec<u64> = Vec::new();
    for error in run.errors() {
        assert_eq!(
            top_line(&error["alloc_stack"]),
            line("// ALLOC twice"),
            "{error}"
        );
        frees.push(top_line(&error["free_stack"]));
    }
    frees.sort();
    assert_eq!(
        frees,
        [line("// FREE late_again"), line("// FREE soon_again")]
    );
}

#[test]
fn threads_that_exit_block_or_churn_while_others_read_their_rings_keep_their_stacks() {
    for round in 0..3 {
        let run = run("threads");
        let worker: Vec<&Value> = run.leaks().iter().filter(|l| l["size"] == 24).collect();
        assert_eq!(worker.len(), 16, "round {round}: {}", run.text);
        for leak in worker {
            assert_eq!(
                top_line(&leak["stack"]),
                line("// ALLOC worker"),
                "round {round}: {leak}"
            );
        }
        assert!(!run.errors().is_empty(), "round {round}: {}", run.text);
        for error in run.errors() {
            assert_eq!(error["kind"], "double_free", "round {round}: {error}");
            assert_eq!(
                top_line(&error["alloc_stack"]),
                line("// ALLOC handed"),
                "round {round}: {error}"
            );
            assert_eq!(
                top_line(&error["free_stack"]),
                line("// FREE handed_again"),
                "round {round}: {error}"
            );
        }
    }
}
