//! A program that uses up its file descriptors (`RLIMIT_NOFILE`) before it exits: the report
//! raises the soft limit towards the hard one while it is written, and where there is no room
//! at all it goes to stderr, still classified right.

mod support;

/// Before, the report found no descriptor for its file, the binaries' debug info or
/// `/proc/self/maps`: it went to stderr unsymbolized, and said every live block had "a page that
/// could not be read (made unreadable by the program)".
#[test]
fn a_program_out_of_file_descriptors_gets_its_report_symbolized_in_its_file() {
    let dir = support::scratch("out_of_files");
    let source = "tests/cpp/out_of_files.cpp";
    let exe = support::build(&dir, "out_of_files", &[source], &[]);
    let lost_line = support::line_of(source, "// LOST");
    let kept_line = support::line_of(source, "// KEPT");
    // The soft limit alone: the hard one leaves the report room.
    let wrapper = support::under_ulimit(&exe, "out_of_files_soft", "-S -n");
    let run = support::run_with(&wrapper, "soft", "", &[], &["256"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(
        run.stdout().contains("opened until refused"),
        "{}",
        run.stdout()
    );
    assert!(!run.text.contains("could not be read"), "{}", run.text);
    let mut leaks: Vec<(String, u64, u64)> = run
        .leaks()
        .iter()
        .map(|leak| {
            let kind = leak["leak_kind"].as_str().unwrap().to_owned();
            let line = leak["stack"][0]["line"].as_u64().unwrap_or(0);
            (kind, leak["size"].as_u64().unwrap(), line)
        })
        .collect();
    leaks.sort();
    assert_eq!(
        leaks,
        [
            ("direct".to_owned(), 32, lost_line),
            ("indirect".to_owned(), 64, lost_line),
            ("reachable".to_owned(), 32, kept_line),
            ("reachable".to_owned(), 48, kept_line),
        ],
        "{}",
        run.text
    );
}

/// Soft and hard limit alike: no room. The report is on stderr, and its classification exact.
#[test]
fn a_program_out_of_file_descriptors_up_to_the_hard_limit_gets_its_report_on_stderr() {
    let dir = support::scratch("out_of_files_hard");
    let exe = support::build(&dir, "out_of_files", &["tests/cpp/out_of_files.cpp"], &[]);
    let wrapper = support::under_ulimit(&exe, "out_of_files_hard", "-n");
    let run = support::run_with(&wrapper, "hard", "", &[], &["256"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let stderr = run.stderr();
    assert!(stderr.contains("(the report is above)"), "{stderr}");
    assert!(!stderr.contains("could not be read"), "{stderr}");
    assert!(
        stderr.contains("Direct leak of 32 bytes in 1 block"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Indirect leak of 64 bytes in 1 block"),
        "{stderr}"
    );
    assert!(
        stderr.contains("SUMMARY: k15-memory: 96 bytes leaked in 2 blocks"),
        "{stderr}"
    );
}
