//! `timeline=PATH`: the Chrome trace event file of live bytes per tag, parsed as JSON and
//! checked against what `tests/cpp/profiler_timeline.cpp` did, however the program ended.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};

const SOURCE: &str = "tests/cpp/profiler_timeline.cpp";

fn build(test: &str) -> PathBuf {
    let dir = support::scratch(test);
    support::build(&dir, "profiler_timeline", &[SOURCE], &[])
}

/// Runs the program with `timeline=<dir>/<file>` and returns the run.
fn run_timeline(exe: &Path, file: &str, args: &[&str]) -> support::Run {
    let path = exe.parent().unwrap().join(file);
    let options = format!("timeline={}", path.display());
    support::run_with(exe, "report", &options, &[], args)
}

/// The events of the timeline at `path`, which must parse as JSON.
fn events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no timeline at {}: {e}", path.display()));
    let file: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the timeline is not JSON: {e}\n{text}"));
    file["traceEvents"].as_array().expect("traceEvents").clone()
}

fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["name"] == name).collect()
}

/// The `marks` of each frame mark event, in order.
fn marks(events: &[Value]) -> Vec<u64> {
    named(events, "frame_mark")
        .iter()
        .map(|e| {
            assert_eq!(e["ph"], "i");
            e["args"]["marks"].as_u64().unwrap()
        })
        .collect()
}

/// Level's live bytes at each frame mark (the tag counter that follows the mark).
fn level_at_marks(events: &[Value]) -> Vec<u64> {
    let mut at_marks = Vec::new();
    let mut after_mark = false;
    for e in events {
        if e["name"] == "frame_mark" {
            after_mark = true;
        } else if e["name"] == "live bytes by tag" && after_mark {
            at_marks.push(e["args"]["Level"].as_u64().unwrap());
            after_mark = false;
        }
    }
    at_marks
}

/// Every event's timestamps go forward, in microseconds, and every counter is a `C` event.
fn check_counters(events: &[Value]) {
    let ts: Vec<u64> = events
        .iter()
        .skip(1)
        .map(|e| e["ts"].as_u64().unwrap())
        .collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
    for process in named(events, "process") {
        assert_eq!(process["ph"], "C");
        assert!(process["args"]["rss_bytes"].as_u64().unwrap() > 1 << 20);
    }
}

#[test]
fn a_game_loop_s_timeline_has_a_counter_per_tag_at_every_frame_mark() {
    let exe = build("timeline_frames");
    let run = run_timeline(&exe, "frames.json", &["frames", "20"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let events = events(&exe.parent().unwrap().join("frames.json"));
    check_counters(&events);
    assert_eq!(marks(&events), (1..=20).collect::<Vec<_>>());
    // Frame i kept 1000 bytes more under Level; Particles' block was freed each frame.
    assert_eq!(
        level_at_marks(&events),
        (1..=20).map(|i| i * 1000).collect::<Vec<_>>()
    );
    let last = named(&events, "live bytes by tag").pop().unwrap().clone();
    assert_eq!(last["ph"], "C");
    assert_eq!(last["args"]["Particles"], 0);
    // Returned from main with the levels live: the last sample, at exit, still counts them.
    assert_eq!(last["args"]["Level"], 20_000);
    assert!(named(&events, "process").len() >= 21);
    // The timeline adds nothing to the report: the timer thread is gone before the exit frees
    // the runtimes' caches, and its allocations are the tracker's.
    assert!(!run.text.contains("Still reachable"), "{}", run.text);
}

#[test]
fn a_timeline_that_cannot_be_written_says_so_once_and_the_program_goes_on() {
    let exe = build("timeline_unwritable");
    let options = "timeline=/dev/full";
    let run = support::run_with(&exe, "report", options, &[], &["frames", "20"]);
    let stderr = run.stderr();
    assert!(run.output.status.success(), "{stderr}");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("k15-memory: timeline"))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].contains("No space left on device"), "{said:?}");
}

#[test]
fn a_program_that_marks_no_frames_is_sampled_every_10_ms() {
    let exe = build("timeline_timer");
    let run = run_timeline(&exe, "timer.json", &["timer", "300"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let events = events(&exe.parent().unwrap().join("timer.json"));
    check_counters(&events);
    assert!(marks(&events).is_empty());
    let samples = named(&events, "process");
    // 300 ms at one sample per 10 ms: 30, less what a loaded machine's scheduler delays.
    assert!((10..=40).contains(&samples.len()), "{}", samples.len());
    let level: Vec<u64> = named(&events, "live bytes by tag")
        .iter()
        .map(|e| e["args"]["Level"].as_u64().unwrap())
        .collect();
    // Level only grows, by whole 100-byte blocks, until the vector's destructor at exit.
    assert!(level.iter().all(|bytes| bytes % 100 == 0), "{level:?}");
    let before_exit = &level[..level.len() - 1];
    assert!(before_exit.windows(2).all(|w| w[0] <= w[1]), "{level:?}");
    assert!(*before_exit.last().unwrap() >= 100 * 100, "{level:?}");
    assert!(!run.text.contains("Still reachable"), "{}", run.text);
}

#[test]
fn a_timeline_stays_valid_when_a_signal_handler_exits() {
    for signal in ["TERM", "INT"] {
        let exe = build(&format!("timeline_{signal}"));
        let run = run_timeline(&exe, "signal.json", &["signal", signal, "5"]);
        assert_eq!(run.output.status.code(), Some(0), "{}", run.stderr());
        let events = events(&exe.parent().unwrap().join("signal.json"));
        check_counters(&events);
        assert_eq!(marks(&events), [1, 2, 3, 4, 5]);
        assert_eq!(level_at_marks(&events), [1000, 2000, 3000, 4000, 5000]);
    }
}

#[test]
fn a_forked_child_writes_its_own_timeline_or_none() {
    let exe = build("timeline_fork");
    let dir = exe.parent().unwrap();
    for file in std::fs::read_dir(dir).unwrap() {
        let path = file.unwrap().path();
        if path.to_string_lossy().contains("fork-") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let run = run_timeline(&exe, "fork-%p.json", &["fork"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let mut timelines: Vec<Vec<Value>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|f| f.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("fork-"))
        .map(|p| events(&p))
        .collect();
    assert_eq!(timelines.len(), 2, "the parent's and the child's");
    timelines.sort_by_key(|events| marks(events).len());
    let (child, parent) = (&timelines[0], &timelines[1]);
    assert_ne!(child[0]["pid"], parent[0]["pid"]);
    // The child's marks go on from the parent's count; its Level from the parent's 3000.
    assert_eq!(marks(child), [4, 5]);
    assert_eq!(level_at_marks(child), [4000, 5000]);
    assert_eq!(marks(parent), [1, 2, 3, 4]);
    assert_eq!(level_at_marks(parent), [1000, 2000, 3000, 4000]);

    // Without %p, the parent's file is the parent's alone: the child writes none.
    let run = run_timeline(&exe, "fork-one.json", &["fork"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let events = events(&dir.join("fork-one.json"));
    assert_eq!(marks(&events), [1, 2, 3, 4]);
}

/// Frame marks of 4 threads at once reach the file in the order they were numbered: a mark let
/// go of the frames' lock before its sample was written, and a later mark's came first (392 and
/// 393 after 394).
#[test]
fn frame_marks_of_several_threads_are_written_in_order() {
    let exe = build("timeline_threads");
    let run = run_timeline(&exe, "threads.json", &["threads", "4", "2000"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let events = events(&exe.parent().unwrap().join("threads.json"));
    check_counters(&events);
    let marks = marks(&events);
    let out_of_order: Vec<_> = marks.windows(2).filter(|w| w[1] != w[0] + 1).collect();
    assert!(out_of_order.is_empty(), "{out_of_order:?}");
    assert_eq!((marks.first(), marks.len()), (Some(&1), 8000));
}
