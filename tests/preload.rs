//! `LD_PRELOAD=target/release/libk15_memory.so` on a program never built against the tracker:
//! the plain build of the sample engine leaks the same blocks, from the same functions, as the
//! build linked with the library, only without K15_NEW's file:line. A program with its own
//! operator new keeps it, and is told so in one line.

mod support;

/// (size, array, innermost function) of each leak, sorted.
fn leaks_by_function(run: &support::Run) -> Vec<(u64, bool, String)> {
    let mut leaks: Vec<_> = run
        .leaks()
        .iter()
        .map(|leak| {
            (
                leak["size"].as_u64().unwrap(),
                leak["array"].as_bool().unwrap(),
                leak["stack"][0]["function"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    leaks.sort();
    leaks
}

#[test]
fn preloaded_into_a_plain_build_reports_the_linked_builds_leaks() {
    let dir = support::scratch("preload_engine");
    let linked = support::build(&dir, "linked", &support::ENGINE_SAMPLE, &[]);
    let plain = support::build(
        &dir,
        "plain",
        &support::ENGINE_SAMPLE,
        &["-DK15_MEMORY_DISABLED"],
    );
    let preload = support::preload_lib();
    let preloaded = |report: &str, options: &str| {
        let env = [("LD_PRELOAD", preload.to_str().unwrap())];
        support::run_with(&plain, report, options, &env, &[])
    };
    let expected = support::run(&linked, "");
    let run = preloaded("plain", "");
    let stderr = run.stderr();
    assert!(run.output.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    assert!(
        stderr.contains("k15-memory: 3 leaked blocks (1336 bytes)"),
        "{stderr}"
    );
    assert_eq!(expected.leaks().len(), 3, "{}", expected.text);
    assert_eq!(
        leaks_by_function(&run),
        leaks_by_function(&expected),
        "{}",
        run.text
    );
    for leak in run.leaks() {
        assert!(leak["file"].is_null() && leak["line"] == 0, "{leak}");
    }
    assert!(run.errors().is_empty(), "{}", run.text);
    // Options reach the preloaded tracker too.
    let quiet = preloaded("quiet", "report=0");
    assert!(quiet.json.is_null() && !quiet.stderr().contains("k15-memory"));
}

#[test]
fn preloaded_into_a_program_with_its_own_operator_new_leaves_it_alone_and_says_so() {
    let dir = support::scratch("preload_own_operator_new");
    let exe = support::build(
        &dir,
        "own_operator_new",
        &["tests/cpp/own_operator_new.cpp"],
        &["-DK15_MEMORY_DISABLED"],
    );
    let preload = support::preload_lib();
    let env = [("LD_PRELOAD", preload.to_str().unwrap())];
    let run = support::run_with(&exe, "own", "", &env, &[]);
    let stderr = run.stderr();
    assert!(run.output.status.success(), "{stderr}");
    assert!(
        run.stdout().contains("own_operator_new: 500"),
        "{}",
        run.stdout()
    );
    let warning = format!(
        "k15-memory: warning: operator new of this process is {}'s, not the tracker's",
        exe.display()
    );
    assert_eq!(stderr.matches(&warning).count(), 1, "{stderr}");
    assert!(!stderr.contains("Memory error"), "{stderr}");
}
