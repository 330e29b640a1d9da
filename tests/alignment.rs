//! Aligned allocations with alignments their functions refuse: every aligned form behaves as
//! libstdc++ and glibc do without the tracker (the `-DK15_MEMORY_DISABLED` build of the same
//! program is the referee), and each refused call is an `invalid_alignment` error with the
//! caller's stack and the alignment asked for (`tests/cpp/alignment.cpp`).

mod support;
use serde_json::Value;

const SOURCE: &str = "tests/cpp/alignment.cpp";

/// The program's forms: the name it prints, the family the report names, the function that
/// makes the call and its `// CALL` marker.
const FORMS: [(&str, &str, &str, &str); 9] = [
    ("new", "new", "call_new(", "// CALL new\n"),
    ("new[]", "new[]", "call_new_array(", "// CALL new[]\n"),
    (
        "new_nothrow",
        "new",
        "call_new_nothrow(",
        "// CALL new nothrow",
    ),
    (
        "new[]_nothrow",
        "new[]",
        "call_new_array_nothrow(",
        "// CALL new[] nothrow",
    ),
    ("K15_NEW", "new", "call_k15_new(", "// CALL K15_NEW\n"),
    (
        "K15_NEW[]",
        "new[]",
        "call_k15_new_array(",
        "// CALL K15_NEW[]",
    ),
    (
        "aligned_alloc",
        "aligned_alloc",
        "call_aligned_alloc(",
        "// CALL aligned_alloc",
    ),
    (
        "posix_memalign",
        "posix_memalign",
        "call_posix_memalign(",
        "// CALL posix_memalign",
    ),
    ("memalign", "memalign", "call_memalign(", "// CALL memalign"),
];

/// The line of a marker that may be the prefix of another (`// CALL new` of `// CALL new[]`):
/// markers ending in a newline match only at the end of a line.
fn marker_line(marker: &str) -> u64 {
    let text = std::fs::read_to_string(support::repo().join(SOURCE)).unwrap();
    let found = match marker.strip_suffix('\n') {
        Some(whole) => text.lines().position(|l| l.ends_with(whole)),
        None => text.lines().position(|l| l.contains(marker)),
    };
    found.expect("marker in the source") as u64 + 1
}

/// A call the library it replaces fails for its alignment: libstdc++'s operators refuse every
/// alignment that is not a power of two; glibc's C functions say so with `EINVAL`.
fn refused_for_alignment(form: &str, align: u64, outcome: &str) -> bool {
    match form {
        "aligned_alloc" | "posix_memalign" | "memalign" => outcome == "EINVAL",
        _ => !align.is_power_of_two(),
    }
}

#[test]
fn every_aligned_form_fails_as_without_the_tracker_and_reports_invalid_alignment_at_the_call() {
    let dir = support::scratch("alignment");
    let plain = support::build(
        &dir,
        "alignment_plain",
        &[SOURCE],
        &["-DK15_MEMORY_DISABLED"],
    );
    let tracked = support::build(&dir, "alignment", &[SOURCE], &[]);
    let referee = std::process::Command::new("timeout")
        .args(["--signal=KILL", "120"])
        .arg(&plain)
        .output()
        .unwrap();
    assert!(referee.status.success());
    let expected = String::from_utf8(referee.stdout).unwrap();
    assert!(expected.ends_with("done\n"), "{expected}");

    // The C family tracked (malloc=1) and left to glibc (the default) alike.
    for options in ["malloc=1", ""] {
        let run = support::run(&tracked, options);
        assert!(run.output.status.success(), "{options}: {}", run.stderr());
        assert_eq!(
            run.stdout(),
            expected,
            "{options}: the outcomes differ from the plain build's"
        );

        let mut refused = Vec::new();
        for line in expected.lines().filter(|l| *l != "done") {
            let fields: Vec<&str> = line.split(' ').collect();
            let (form, align, outcome) = (fields[0], fields[1].parse::<u64>().unwrap(), fields[2]);
            if align.is_power_of_two() && align <= 4096 && !form.contains("memalign") {
                assert_eq!(outcome, "ok", "a valid alignment is served: {line}");
            }
            if refused_for_alignment(form, align, outcome) {
                refused.push((form, align));
            }
        }
        let errors: Vec<&Value> = run
            .errors()
            .iter()
            .filter(|e| e["kind"] == "invalid_alignment")
            .collect();
        assert_eq!(errors.len(), run.errors().len(), "{}", run.text);
        assert_eq!(errors.len(), refused.len(), "{options}: {}", run.text);
        assert!(refused.len() > 100, "every form is refused somewhere");
        for (error, (form, align)) in errors.iter().zip(&refused) {
            let (_, family, function, marker) = FORMS.iter().find(|f| f.0 == *form).unwrap();
            let call = &error["alloc_stack"][0];
            assert_eq!(error["alignment"], *align, "{form}: {error}");
            assert_eq!(error["size"], 64, "{form}: {error}");
            assert_eq!(error["allocated_with"], *family, "{form}: {error}");
            assert!(
                call["function"].as_str().unwrap().contains(function),
                "{form} {align}: {error}"
            );
            assert_eq!(call["line"], marker_line(marker), "{form} {align}: {error}");
            if form.starts_with("K15_NEW") {
                assert!(error["file"].as_str().unwrap().ends_with(SOURCE), "{error}");
                assert_eq!(error["line"], marker_line(marker), "{error}");
            }
        }
        // Printed when they happen, and in the text report.
        let printed = "Memory error: invalid_alignment: ";
        assert_eq!(run.stderr().matches(printed).count(), refused.len());
        assert_eq!(run.text.matches(printed).count(), refused.len());
        assert!(
            run.text
                .contains("new of 64 bytes asked for an alignment of 48, which it refuses"),
            "{}",
            run.text
        );
    }
}

#[test]
fn invalid_alignment_errors_are_suppressed_by_kind() {
    let dir = support::scratch("alignment_suppressed");
    let tracked = support::build(&dir, "alignment", &[SOURCE], &[]);
    let rules = dir.join("alignment.supp");
    std::fs::write(&rules, "invalid_alignment:call_new_nothrow\n").unwrap();
    let all = support::run(&tracked, "");
    let run = support::run(&tracked, &format!("suppressions={}", rules.display()));
    assert!(run.output.status.success(), "{}", run.stderr());
    let nothrow = |run: &support::Run| {
        run.errors()
            .iter()
            .filter(|e| {
                e["alloc_stack"][0]["function"]
                    .as_str()
                    .is_some_and(|f| f.contains("call_new_nothrow("))
            })
            .count()
    };
    assert!(nothrow(&all) > 0);
    assert_eq!(nothrow(&run), 0, "{}", run.text);
    assert_eq!(run.errors().len(), all.errors().len() - nothrow(&all));
}
