//! An outside referee: for the sample engine, the blocks and bytes valgrind calls "definitely
//! lost" (on the -DK15_MEMORY_DISABLED build) equal what the tracker reports.

mod support;

#[test]
fn tracker_and_valgrind_agree_on_the_engine_sample() {
    let dir = support::scratch("valgrind_referee");
    let sources = support::ENGINE_SAMPLE;
    let tracked = support::build(&dir, "engine", &sources, &[]);
    let plain = support::build(&dir, "engine_plain", &sources, &["-DK15_MEMORY_DISABLED"]);

    let ours = support::run(&tracked, "");
    let summary = &ours.json["summary"];
    let our_leaks = (
        summary["leaked_blocks"].as_u64().unwrap(),
        summary["leaked_bytes"].as_u64().unwrap(),
    );

    let text = support::valgrind_leak_check(&plain, &dir, &[]);
    assert_eq!(
        support::valgrind_summary(&text, "definitely lost:"),
        our_leaks,
        "valgrind said:\n{text}\nwe said:\n{}",
        ours.text
    );
    assert_eq!(our_leaks, (3, 1336));
    // The disabled build writes no report of its own.
    assert!(!dir.join("engine_plain.log").exists());
}
