//! Lost cycles name their owner: the direct leak of an owner-child cycle is its earliest
//! allocation (the owner), whichever of the two the heap put lower, and valgrind agrees where
//! its address rule picks the owner too (`tests/cpp/cycles.cpp`).

mod support;
use support::{k15_census, valgrind_census, Census};

const SOURCE: &str = "tests/cpp/cycles.cpp";

/// How many of the program's four owners lay below their children (it prints it on stderr).
fn owners_below(stderr: &str) -> u32 {
    let line = stderr
        .lines()
        .find_map(|l| l.split("owners below their children: ").nth(1))
        .unwrap_or_else(|| panic!("no count in:\n{stderr}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn the_owner_of_a_lost_cycle_is_the_direct_leak_whatever_the_address_order() {
    let dir = support::scratch("cycles");
    let tracked = support::build(&dir, "cycles", &[SOURCE], &[]);
    let plain = support::build(&dir, "cycles_plain", &[SOURCE], &["-DK15_MEMORY_DISABLED"]);
    let mut orders_seen = Vec::new();
    for (mode, owner, child) in [("small_owner", 448, 832), ("big_owner", 832, 448)] {
        for span_order in ["owner_first", "child_first"] {
            let args = [mode, span_order];
            let report = format!("{mode}_{span_order}");
            let run = support::run_with(&tracked, &report, "", &[], &args);
            assert!(run.output.status.success(), "{args:?}: {}", run.stderr());
            orders_seen.push(owners_below(&run.stderr()));
            let want: Census = [
                (("direct".to_owned(), owner), 4),
                (("indirect".to_owned(), child), 4),
            ]
            .into();
            let ours = k15_census(&run, "cycles.cpp");
            assert_eq!(ours, want, "{args:?}: we said:\n{}", run.text);
            // The same owners from the text's first direct site.
            assert!(
                run.text
                    .contains(&format!("Direct leak of {} bytes in 4 blocks", owner * 4)),
                "{}",
                run.text
            );
            let (theirs, valgrind_text) = valgrind_census(&plain, &args, "cycles.cpp");
            if owners_below(&valgrind_text) == 4 {
                assert_eq!(
                    ours, theirs,
                    "{args:?}: valgrind said:\n{valgrind_text}\nwe said:\n{}",
                    run.text
                );
            }
        }
    }
    // The heap laid the owners out both below and above their children.
    assert!(orders_seen.contains(&4), "{orders_seen:?}");
    assert!(orders_seen.contains(&0), "{orders_seen:?}");
}
