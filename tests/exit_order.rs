//! The report is written after every static destructor, the executable's and its shared
//! libraries', so objects freed there are no leaks; and frees after the report still work.

mod support;

#[test]
fn no_false_leaks_across_containers_alignment_forms_statics_and_a_shared_library() {
    let dir = support::scratch("exit_order_statics");
    let dso = support::build_shared(&dir, "static_dso", &["tests/cpp/static_dso.cpp"], &[]);
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let exe = support::build(
        &dir,
        "no_false_leaks",
        &["tests/cpp/no_false_leaks.cpp", dso.to_str().unwrap()],
        &[&rpath],
    );
    let run = support::run(&exe, "");
    assert!(
        run.output.status.success(),
        "{}\n{}",
        run.stdout(),
        run.stderr()
    );
    assert!(
        run.stdout().contains("checks done: 0 failures"),
        "{}",
        run.stdout()
    );
    // The shared library's statics were destroyed before the report (they print when they are).
    assert!(
        run.stderr().contains("static_dso: statics destroyed"),
        "{}",
        run.stderr()
    );
    assert_eq!(run.leaks().len(), 0, "false leaks:\n{}", run.text);
    assert_eq!(run.errors().len(), 0, "{}", run.text);
    assert!(run.text.contains("No leaks"), "{}", run.text);
    let total = run.json["summary"]["total_allocations"].as_u64().unwrap();
    assert!(total > 10_000, "churn is tracked: {total}");
}

#[test]
fn a_free_after_the_report_still_works() {
    let dir = support::scratch("exit_order_late_free");
    let exe = support::build(&dir, "late_free", &["tests/cpp/late_free.cpp"], &[]);
    let run = support::run(&exe, "");
    let stderr = run.stderr();
    assert!(run.output.status.success(), "{stderr}");
    // Live when the report was written, so listed (reachable: a global still points to it);
    // freed afterwards without any complaint.
    assert_eq!(run.leak_set().len(), 1, "{}", run.text);
    assert_eq!(run.leaks()[0]["size"], 100);
    assert_eq!(run.leaks()[0]["leak_kind"], "reachable");
    let report_line = stderr
        .find("k15-memory: 0 leaked blocks (0 bytes), 1 block still reachable (100 bytes)")
        .expect(&stderr);
    let late_free = stderr
        .find("late_free: freed after the report")
        .expect(&stderr);
    assert!(report_line < late_free, "{stderr}");
    assert!(!stderr.contains("Memory error"), "{stderr}");
}
