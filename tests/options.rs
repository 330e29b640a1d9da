//! `K15_MEMORY_OPTIONS`: every key does what SPEC says, and bad pairs are warned about once.

mod support;
use std::path::PathBuf;

fn program(name: &str) -> PathBuf {
    let dir = support::scratch(name);
    support::build(&dir, "options", &["tests/cpp/options.cpp"], &[])
}

#[test]
fn report_zero_writes_nothing() {
    let exe = program("options_report_zero");
    let run = support::run(&exe, "report=0");
    assert!(run.output.status.success());
    assert!(run.json.is_null() && run.text.is_empty());
    assert!(!run.stderr().contains("k15-memory"), "{}", run.stderr());
}

#[test]
fn bad_pairs_are_warned_once_and_good_ones_still_apply() {
    let exe = program("options_bad_pairs");
    let run = support::run(&exe, "bogus=1:stack_depth=abc:exitcode=7:halt_on_error=2");
    let stderr = run.stderr();
    assert_eq!(
        stderr
            .matches("K15_MEMORY_OPTIONS: bogus=1: unknown key")
            .count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        stderr
            .matches("K15_MEMORY_OPTIONS: stack_depth=abc: must be 0..64, using 32\n")
            .count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        stderr
            .matches("halt_on_error=2: must be 0 or 1, using 0\n")
            .count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        run.output.status.code(),
        Some(7),
        "exitcode applies: one block leaked"
    );
    assert_eq!(run.leaks().len(), 1);
}

#[test]
fn json_path_and_log_path_choose_the_files() {
    let exe = program("options_paths");
    let dir = exe.parent().unwrap();
    let custom = dir.join("custom.json");
    let run = support::run(&exe, &format!("json_path={}", custom.display()));
    assert!(
        run.text
            .contains("Direct leak of 20 bytes in 1 block (new[])"),
        "{}",
        run.text
    );
    assert!(
        run.json.is_null(),
        "no JSON beside the log when json_path is set"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&custom).unwrap()).unwrap();
    assert_eq!(json["summary"]["leaked_blocks"], 1);
}

#[test]
fn write_leak_report_writes_now_and_says_when_it_cannot() {
    let exe = program("options_write_now");
    let dir = exe.parent().unwrap();
    let now = dir.join("now.log");
    let run = support::run_with(&exe, "options", "report=0", &[], &[now.to_str().unwrap()]);
    assert!(run.stdout().contains("write_leak_report: true"));
    let text = std::fs::read_to_string(&now).unwrap();
    // During the run, the caller's stack is scanned: the block its local points to is
    // reachable, not leaked (it is at exit, once main has returned).
    assert!(
        text.contains("20 bytes in 1 block (new[]) from tests/cpp/options.cpp:"),
        "{text}"
    );
    assert!(text.contains("No leaks"), "{text}");
    assert!(dir.join("now.log.json").exists());
    let run = support::run_with(
        &exe,
        "options",
        "report=0",
        &[],
        &["/nonexistent/dir/now.log"],
    );
    assert!(run.stdout().contains("write_leak_report: false"));
}

/// Values that once were reinterpreted (`stack_depth=-1` set the budget bit and every `new`
/// threw) and other nasty values of every key: each is refused with one line naming the value
/// kept, and the program runs as with the defaults.
#[test]
fn out_of_range_values_of_every_key_are_refused_and_the_defaults_kept() {
    let exe = program("options_out_of_range");
    let bad = [
        ("stack_depth=-1", "must be 0..64, using 32"),
        ("stack_depth=-64", "must be 0..64, using 32"),
        ("stack_depth=65", "must be 0..64, using 32"),
        ("exitcode=-1", "must be 0..255, using 0"),
        ("exitcode=256", "must be 0..255, using 0"),
        ("report=2", "must be 0 or 1, using 1"),
        ("halt_on_error=-1", "must be 0 or 1, using 0"),
        ("budget=-64M", "must be 0..1T bytes"),
        ("budget=2048G", "must be 0..1T bytes"),
        (
            "unwinder=fast",
            "must be dwarf or frame_pointer, using dwarf",
        ),
        ("json_path=", "must be a UTF-8 path"),
        (
            "html_path=",
            "must be a UTF-8 path of 1..1023 bytes, using (none)",
        ),
    ];
    let options: Vec<&str> = bad.iter().map(|(pair, _)| *pair).collect();
    let run = support::run(&exe, &options.join(":"));
    let stderr = run.stderr();
    for (pair, why) in bad {
        let line = format!("k15-memory: K15_MEMORY_OPTIONS: {pair}: {why}");
        assert_eq!(stderr.matches(&line).count(), 1, "{line}\n{stderr}");
    }
    assert!(run.output.status.success(), "{stderr}");
    // The defaults in force: the leak is reported with its stack, exit code 0.
    assert_eq!(run.leaks().len(), 1, "{}", run.text);
    assert_eq!(
        run.leaks()[0]["stack"][0]["function"],
        "main",
        "{}",
        run.text
    );
}
