//! Threads the program cancels (`pthread_cancel`, deferred) while the tracker works on them: the
//! tracker's own calls of libc's cancellation points (`write`, `open`, `close`, `nanosleep`)
//! hold the cancellation off, so that it acts at the program's next cancellation point.

mod support;

/// Each thread has a cancellation pending as it makes a double free (the error's lines), a
/// leak report, a frame mark with a timeline sample, or a heap check. Before, the cancellation
/// acted inside the tracker's `write` or `close`, and unwinding through its frames aborted the
/// process (every run; 1 in 40 runs of a program cancelling threads that double-free at random).
#[test]
fn threads_cancelled_during_the_trackers_work_end_at_their_own_cancellation_point() {
    let dir = support::scratch("cancelled_threads");
    let source = "tests/cpp/cancelled_threads.cpp";
    let exe = support::build(&dir, "cancelled_threads", &[source], &[]);
    let timeline = dir.join("cancelled.timeline.json");
    let options = format!("timeline={}", timeline.display());
    let run = support::run_with(&exe, "cancelled", &options, &[], &["40"]);
    assert!(
        run.output.status.success(),
        "{:?}\n{}",
        run.output.status,
        run.stderr()
    );
    assert!(
        run.stdout()
            .contains("40 of 40 threads ended at their own cancellation point; survived 1"),
        "{}",
        run.stdout()
    );
    assert_eq!(run.error_kinds(), vec!["double_free"; 10], "{}", run.text);
    let leak_line = support::line_of(source, "// LEAK");
    let leaks = run.leaks();
    assert_eq!(leaks.len(), 1, "{}", run.text);
    assert_eq!(leaks[0]["size"], 77);
    assert_eq!(leaks[0]["stack"][0]["line"], leak_line, "{}", run.text);
    let samples = std::fs::read_to_string(&timeline).expect("the timeline is written");
    serde_json::from_str::<serde_json::Value>(&samples).expect("the timeline is JSON");
}
