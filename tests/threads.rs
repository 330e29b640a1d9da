//! Threads: cross-thread frees with exact counts and their memory coming back, more threads than
//! shards, and allocations in `thread_local` destructors at thread exit.

mod support;

#[test]
fn two_threads_cross_thread_frees_and_thread_exit_allocations() {
    let dir = support::scratch("threads");
    let exe = support::build(&dir, "threads", &["tests/cpp/threads.cpp"], &[]);
    // Without stacks, `new` takes its quick path: the counts are the same.
    counts_stay_exact(&support::run(&exe, "stack_depth=0"));
    let run = support::run(&exe, "");
    counts_stay_exact(&run);
    // Captured during thread exit, from the thread_local's destructor.
    let stack = &run.leaks()[0]["stack"];
    assert_eq!(
        stack[0]["function"], "(anonymous namespace)::ThreadExitWork::~ThreadExitWork()",
        "{}",
        run.text
    );
}

fn counts_stay_exact(run: &support::Run) {
    let stdout = run.stdout();
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(
        stdout.contains("allocated while both ran: 200000"),
        "{stdout}"
    );
    assert!(
        stdout.contains("live blocks while both ran: 200000"),
        "{stdout}"
    );
    // + 2: libstdc++ deletes each std::thread's state object when its function returns.
    assert!(stdout.contains("freed cross-thread: 200002"), "{stdout}");
    assert!(stdout.contains("threads done"), "{stdout}");

    // Each of the 100 short threads leaks one block from its thread_local destructor.
    let source = "tests/cpp/threads.cpp";
    let line = support::line_of(source, "// LEAK at thread exit");
    let leaks = run.leak_set();
    assert_eq!(leaks.len(), 100, "{}", run.text);
    assert!(
        leaks
            .iter()
            .all(|l| *l == (12, true, Some(source.to_owned()), line)),
        "{leaks:?}"
    );
    let threads: std::collections::HashSet<u64> = run
        .leaks()
        .iter()
        .map(|l| l["thread"].as_u64().unwrap())
        .collect();
    assert_eq!(threads.len(), 100, "one leak per thread");
    assert_eq!(run.json["summary"]["leaked_blocks"], 100);
    assert_eq!(run.json["summary"]["errors"], 0);
}

#[test]
fn fork_while_another_thread_allocates() {
    let dir = support::scratch("threads_fork");
    let exe = support::build(&dir, "fork", &["tests/cpp/fork.cpp"], &[]);
    let run = support::run(&exe, "");
    assert!(
        run.stdout().contains("healthy children: 200"),
        "{}",
        run.stdout()
    );
    assert_eq!(run.leaks().len(), 0, "{}", run.text);
}

#[test]
fn fork_while_another_thread_holds_the_registry_and_the_error_log() {
    let dir = support::scratch("threads_fork_busy");
    let flags = ["-Wno-free-nonheap-object"];
    let exe = support::build(&dir, "fork_busy", &["tests/cpp/fork_busy.cpp"], &flags);
    let run = support::run(&exe, "");
    assert!(
        run.stdout().contains("healthy children: 100"),
        "{:?} {}",
        run.output.status,
        run.stdout()
    );
    assert!(
        run.errors().iter().all(|e| e["kind"] == "invalid_free"),
        "{}",
        run.text
    );
}

#[test]
fn fork_while_other_threads_take_checkpoints_mark_frames_and_intern_tags() {
    let dir = support::scratch("threads_fork_leaf_locks");
    let exe = support::build(
        &dir,
        "fork_leaf_locks",
        &["tests/cpp/fork_leaf_locks.cpp"],
        &[],
    );
    let run = support::run(&exe, "");
    // Before `fork` held these locks, a child forked while another thread marked a frame waited
    // for that lock until its alarm ended it.
    assert!(
        run.stdout().contains("healthy children: 200"),
        "{:?} {}",
        run.output.status,
        run.stdout()
    );
}

#[test]
fn two_threads_racing_to_delete_the_same_blocks_free_each_once() {
    let dir = support::scratch("racing_frees");
    let exe = support::build(&dir, "racing_frees", &["tests/cpp/racing_frees.cpp"], &[]);
    // malloc=0: the counts are of the deletes only, not of the threads' own glibc blocks.
    // Without stacks, `new` takes its quick path.
    for stacks in ["stack_depth=4", "stack_depth=0"] {
        racing_deletes_free_each_block_once(&exe, stacks);
    }
}

fn racing_deletes_free_each_block_once(exe: &std::path::Path, stacks: &str) {
    let run = support::run(exe, &format!("{stacks}:malloc=0"));
    let stdout = run.stdout();
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(stdout.contains("live blocks dropped by: 20000"), "{stdout}");
    assert!(stdout.contains("frees: 20002"), "{stdout}");
    assert!(stdout.contains("done"), "{stdout}");
    assert!(!stdout.contains("overwritten"), "{stdout}");
    assert_eq!(run.json["summary"]["errors"], 20000, "{}", run.stderr());
    assert!(run.error_kinds().iter().all(|kind| kind == "double_free"));
    assert_eq!(run.json["summary"]["leaked_blocks"], 0, "{}", run.text);
}

#[test]
fn memory_freed_on_another_thread_comes_back_to_the_allocating_one() {
    let dir = support::scratch("handoff");
    let exe = support::build(&dir, "handoff", &["tests/cpp/handoff.cpp"], &[]);
    // Without stacks, `new` takes its quick path, and its lists are refilled by the general one.
    for stacks in ["stack_depth=4", "stack_depth=0"] {
        freed_memory_comes_back(&exe, stacks);
    }
}

fn freed_memory_comes_back(exe: &std::path::Path, stacks: &str) {
    let run = support::run(exe, stacks);
    let stdout = run.stdout();
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(stdout.contains("done"), "{stdout}");
    let number = |label: &str| -> i64 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} in {stdout}"));
        line[label.len()..].trim().parse().unwrap()
    };
    // 300 rounds of 10,000 blocks (about 2.8 MiB a round): without the consumer's frees
    // coming back to the producer, resident memory would grow by some 800 MiB.
    let growth = number("resident growth after warm-up KiB:");
    assert!(growth < 16 * 1024, "resident memory grew by {growth} KiB");
    assert!(number("frees:") >= 3_000_000, "{stdout}");
    assert_eq!(
        number("allocations:") - number("frees:"),
        number("live blocks left:"),
        "{stdout}"
    );
    assert_eq!(run.error_kinds(), ["double_free"], "{}", run.stderr());
    assert_eq!(run.json["summary"]["leaked_blocks"], 0, "{}", run.text);
}
