//! Budget mode with the budget spent to its last byte when `main` returns: what the tracker
//! allocates at exit for itself (reading `/proc` before releasing the runtimes' caches) is not
//! the program's: no `budget_exceeded` of its own, no abort, the report written
//! (`tests/cpp/budget_full_at_exit.cpp`; before, the process aborted in the exit handler).

mod support;

#[test]
fn the_trackers_own_work_at_exit_spends_nothing_of_a_spent_budget() {
    let dir = support::scratch("budget_at_exit");
    let exe = support::build(
        &dir,
        "budget_full_at_exit",
        &["tests/cpp/budget_full_at_exit.cpp"],
        &[],
    );
    let run = support::run(&exe, "budget=1M");
    assert!(
        run.output.status.success(),
        "{:?}\n{}",
        run.output.status,
        run.stderr()
    );
    assert!(!run.json.is_null(), "no report:\n{}", run.stderr());
    let errors = run.errors();
    assert!(
        !errors.is_empty(),
        "the program spent its budget:\n{}",
        run.text
    );
    for error in errors {
        assert_eq!(error["kind"], "budget_exceeded");
        let frames = error["alloc_stack"].as_array().unwrap();
        let ours = frames.iter().any(|f| {
            let function = f["function"].as_str().unwrap_or("");
            function.starts_with("k15_memory::") || function.starts_with("std::")
        });
        assert!(!ours, "the tracker's own allocation counted:\n{error:#}");
        assert!(frames.iter().any(|f| f["function"] == "main"), "{error:#}");
    }
}
