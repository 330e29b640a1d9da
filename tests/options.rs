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
        stderr.matches("unknown key in 'bogus=1'").count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        stderr
            .matches("bad value (0..=64 expected) in 'stack_depth=abc'")
            .count(),
        1,
        "{stderr}"
    );
    assert_eq!(stderr.matches("'halt_on_error=2'").count(), 1, "{stderr}");
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
