//! Blocks of `k15::memory::allocate()` (engine and library callbacks, `k15/imgui.h`) and of the
//! engine allocators are scanned for pointers like every other block: the shapes of
//! `tests/cpp/named_blocks.cpp` and ImGui with its context kept until exit are classified as
//! valgrind classifies them (on the `-DK15_MEMORY_DISABLED` build), block for block.

mod support;
use support::census;

const SOURCE: &str = "tests/cpp/named_blocks.cpp";

#[test]
fn named_and_engine_blocks_hold_what_they_point_to_as_valgrind_says() {
    let dir = support::scratch("named_blocks");
    let tracked = support::build(&dir, "named_blocks", &[SOURCE], &[]);
    let plain = support::build(
        &dir,
        "named_blocks_plain",
        &[SOURCE],
        &["-DK15_MEMORY_DISABLED"],
    );
    let expected = [
        (
            "global",
            census(&[
                ("reachable", 24, 1),
                ("reachable", 100, 1),
                ("reachable", 200, 1),
                ("reachable", 300, 1),
            ]),
        ),
        (
            "chain",
            census(&[("direct", 64, 1), ("indirect", 80, 1), ("indirect", 96, 1)]),
        ),
        (
            "mixed",
            census(&[("direct", 72, 1), ("indirect", 48, 1), ("indirect", 112, 1)]),
        ),
        (
            "engine",
            census(&[
                ("reachable", 128, 1),
                ("reachable", 176, 1),
                ("direct", 160, 1),
                ("indirect", 48, 1),
                ("indirect", 192, 1),
            ]),
        ),
    ];
    for (mode, want) in expected {
        let programs = (tracked.as_path(), plain.as_path());
        support::assert_census_as_valgrind(programs, mode, "malloc=1", "named_blocks.cpp", &want);
    }
}

#[test]
fn imgui_with_its_context_kept_until_exit_loses_nothing() {
    let dir = support::scratch("imgui_kept");
    let sources = ["tests/cpp/imgui_kept.cpp", "-limgui", "-lstb"];
    let flags = ["-I", "/usr/include/imgui"];
    let tracked = support::build(&dir, "imgui_kept", &sources, &flags);
    let plain_flags = [&flags[..], &["-DK15_MEMORY_DISABLED"]].concat();
    let plain = support::build(&dir, "imgui_kept_plain", &sources, &plain_flags);
    let run = support::run(&tracked, "");
    assert!(run.output.status.success(), "{}", run.stderr());
    let summary = &run.json["summary"];
    assert_eq!(summary["leaked_blocks"], 0, "{}", run.text);
    let imgui: Vec<&serde_json::Value> = run
        .leaks()
        .iter()
        .filter(|l| l["language"] == "imgui")
        .collect();
    assert!(imgui.len() > 20, "{}", run.text);
    assert!(imgui.iter().all(|l| l["leak_kind"] == "reachable"));
    let text = support::valgrind_leak_check(&plain, &dir, &[]);
    assert_eq!(support::valgrind_lost(&text), (0, 0), "{text}");
    let reachable = support::valgrind_summary(&text, "still reachable:");
    let bytes: u64 = imgui.iter().map(|l| l["size"].as_u64().unwrap()).sum();
    assert_eq!(
        reachable,
        (imgui.len() as u64, bytes),
        "{text}\nwe said:\n{}",
        run.text
    );
}
