//! Stacks the thread does not own: allocations on a fiber (`swapcontext`, as a job system runs
//! its jobs; its stack named to the tracker with `running_on_stack` or not), in signal handlers
//! (on the alternate stack and on the thread's own), and on a stack of garbage get their call
//! stacks, through the signal frame into the interrupted code, as valgrind gives them; a walk
//! never reads past the guard pages around such a stack.

mod support;
use serde_json::Value;

const SOURCE: &str = "tests/cpp/foreign_stacks.cpp";

/// The functions of a leak's stack that lie in the test program's own `source`.
fn program_functions(leak: &Value, source: &str) -> Vec<String> {
    leak["stack"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            f["file"]
                .as_str()
                .is_some_and(|file| file.ends_with(source))
        })
        .map(|f| f["function"].as_str().unwrap().to_owned())
        .collect()
}

/// The same of valgrind's loss record for `bytes` bytes in 1 block.
fn valgrind_program_functions(valgrind: &str, bytes: u64, source: &str) -> Vec<String> {
    let file = format!("({}:", source.rsplit('/').next().unwrap());
    let head = format!("{bytes} bytes in 1 blocks are");
    let lines: Vec<&str> = valgrind
        .lines()
        .map(|l| l.split_once("== ").map_or(l, |x| x.1))
        .collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(&head))
        .unwrap_or_else(|| panic!("no record of {bytes} bytes:\n{valgrind}"));
    lines[start + 1..]
        .iter()
        .take_while(|l| l.trim_start().starts_with("at ") || l.trim_start().starts_with("by "))
        .filter(|l| l.contains(&file))
        .map(|l| {
            let named = l.split_once(": ").unwrap().1;
            named.rsplit_once(" (").unwrap().0.to_owned()
        })
        .collect()
}

fn leak_of(run: &support::Run, bytes: u64) -> &Value {
    run.leaks()
        .iter()
        .find(|l| l["size"] == bytes)
        .unwrap_or_else(|| panic!("no leak of {bytes} bytes:\n{}", run.text))
}

#[test]
fn a_leak_on_a_fiber_has_the_stack_valgrind_gives_it() {
    let dir = support::scratch("foreign_stacks_fiber");
    let plain = support::build(&dir, "fiber_plain", &[SOURCE], &["-DK15_MEMORY_DISABLED"]);
    let valgrind = support::valgrind_leak_check(&plain, &dir, &["fiber"]);
    let expected = valgrind_program_functions(&valgrind, 100, SOURCE);
    assert_eq!(
        expected,
        [
            "(anonymous namespace)::leak_in_job()",
            "(anonymous namespace)::job_body()",
            "(anonymous namespace)::fiber_entry()"
        ],
        "{valgrind}"
    );
    for (name, flags) in [("fiber", &[][..]), ("fiber_o2", &["-O2"][..])] {
        let exe = support::build(&dir, name, &[SOURCE], flags);
        // Also with the fiber's stack named to the tracker, as a job system would name it.
        for (options, args) in [
            ("", &["fiber"][..]),
            ("", &["named", "fiber"][..]),
            ("unwinder=frame_pointer", &["fiber"][..]),
        ] {
            let run = support::run_with(&exe, name, options, &[], args);
            assert!(
                run.output.status.success(),
                "{name} {options}: {}",
                run.stderr()
            );
            assert_eq!(run.leaks().len(), 1, "{}", run.text);
            let leak = leak_of(&run, 100);
            assert_eq!(
                leak["stack"][0]["line"],
                support::line_of(SOURCE, "// LEAK on a fiber"),
                "{}",
                run.text
            );
            let ours = program_functions(leak, SOURCE);
            match (options, name) {
                ("", _) => assert_eq!(ours, expected, "{name}: {}", run.text),
                // Frame pointers past the fiber's entry follow the rbp `getcontext` saved (the
                // frame that started the fiber), so only the fiber's own part is compared.
                (_, "fiber") => assert!(ours.starts_with(&expected), "{}", run.text),
                // `-O2` code keeps no frame pointers: only the first frame is sure.
                _ => assert_eq!(ours[0], expected[0], "{name} {options}: {}", run.text),
            }
        }
    }
}

#[test]
fn a_leak_in_a_signal_handler_has_the_interrupted_code_in_its_stack() {
    let dir = support::scratch("foreign_stacks_signal");
    let exe = support::build(&dir, "signal", &[SOURCE], &[]);
    let plain = support::build(&dir, "signal_plain", &[SOURCE], &["-DK15_MEMORY_DISABLED"]);
    let valgrind = support::valgrind_leak_check(&plain, &dir, &["signal"]);
    let run = support::run_with(&exe, "signal", "", &[], &["signal"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    assert_eq!(run.leaks().len(), 3, "{}", run.text);
    let in_handler = |raised_by: &str| {
        vec![
            "(anonymous namespace)::leak_in_handler(unsigned long)".to_owned(),
            format!("on_{raised_by}_stack"),
            format!("(anonymous namespace)::raise_on_{raised_by}_stack()"),
            "(anonymous namespace)::run_signals()".to_owned(),
            "main".to_owned(),
        ]
    };
    // On the thread's own stack: the same frames as valgrind's, from the handler to `main`.
    let own = program_functions(leak_of(&run, 66), SOURCE);
    assert_eq!(own, in_handler("own"), "{}", run.text);
    assert_eq!(
        own,
        valgrind_program_functions(&valgrind, 66, SOURCE),
        "{valgrind}"
    );
    // Between the handler and the interrupted code, the frame gdb calls the same.
    for bytes in [66, 77, 88] {
        let names: Vec<&str> = leak_of(&run, bytes)["stack"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["function"].as_str().unwrap_or("??"))
            .collect();
        let signal = names.iter().position(|&n| n == "<signal handler called>");
        let handler = names.iter().position(|n| n.starts_with("on_"));
        assert!(
            signal.is_some() && signal.map(|s| s - 1) == handler,
            "{names:?}"
        );
    }
    // On the alternate stack valgrind stops at the signal frame; the tracker goes on.
    let alternate = program_functions(leak_of(&run, 77), SOURCE);
    assert_eq!(alternate, in_handler("alternate"), "{}", run.text);
    let valgrind_alternate = valgrind_program_functions(&valgrind, 77, SOURCE);
    assert!(
        alternate.starts_with(&valgrind_alternate),
        "{alternate:?} {valgrind_alternate:?}"
    );
    // An alternate stack above the interrupted one: the walk goes down to it.
    assert_eq!(
        program_functions(leak_of(&run, 88), SOURCE),
        [
            "(anonymous namespace)::leak_in_handler(unsigned long)",
            "on_stack_above",
            "(anonymous namespace)::raise_below_the_alternate_stack()",
            "(anonymous namespace)::thread_below_its_alternate_stack(void*)",
        ],
        "{}",
        run.text
    );
}

/// A function run on a stack of garbage (values that look like return addresses and frame
/// pointers, some into the guard pages) by a stack switch without CFI: the leak's stack starts
/// where it should and the walk, DWARF or frame pointers, never faults on the guard pages.
#[test]
fn a_walk_over_garbage_between_guard_pages_never_faults() {
    let dir = support::scratch("foreign_stacks_garbage");
    for (name, flags) in [("garbage", &[][..]), ("garbage_o2", &["-O2"][..])] {
        let exe = support::build(&dir, name, &[SOURCE], flags);
        for options in ["", "unwinder=frame_pointer", "stack_depth=64"] {
            for _ in 0..5 {
                let run = support::run_with(&exe, name, options, &[], &["garbage"]);
                assert!(
                    run.output.status.success(),
                    "{name} {options}: {}",
                    run.stderr()
                );
                assert_eq!(run.leaks().len(), 2, "{}", run.text);
                for leak in run.leaks() {
                    assert_eq!(
                        leak["stack"][0]["function"], "(anonymous namespace)::leak_on_garbage()",
                        "{name} {options}: {}",
                        run.text
                    );
                }
            }
        }
    }
}

/// Threads each running hundreds of fibers one after another, every fiber stack mapped
/// for it (sizes vary) and unmapped after: a page one walk was allowed to read may be gone by
/// the next one. Counts stay exact and each fiber's leak has its function.
#[test]
fn fibers_mapped_and_unmapped_on_many_threads_keep_counts_and_stacks() {
    let dir = support::scratch("foreign_stacks_churn");
    let exe = support::build(&dir, "churn", &[SOURCE], &["-O2"]);
    for (options, named) in [("", false), ("", true), ("unwinder=frame_pointer", false)] {
        let args = [&["named"][..named as usize], &["churn", "6", "300"]].concat();
        let run = support::run_with(&exe, "churn", options, &[], &args);
        assert!(run.output.status.success(), "{options}: {}", run.stderr());
        let leaks = run.leaks();
        assert_eq!(run.json["summary"]["leaked_blocks"], 1800, "{}", run.text);
        assert_eq!(run.json["summary"]["errors"], 0, "{}", run.text);
        let line = support::line_of(SOURCE, "// LEAK once per fiber");
        assert!(
            leaks.iter().all(|l| l["size"] == 33
                && l["stack"][0]["line"] == line
                && l["stack"][0]["function"] == "(anonymous namespace)::churn_job()"),
            "{options}: {}",
            run.text
        );
    }
}

/// A report written from a fiber scans the fiber's stack when the program named it: a block
/// only a local of the job points to is reachable. Unnamed, the tracker cannot know where the
/// fiber's stack ends: it reads the stack whole if the program mapped it (as it reads every
/// mapping the program made, as valgrind does), and not at all if the mapping was hidden from
/// it (the block shows as a direct leak).
#[test]
fn a_report_written_on_a_named_fiber_scans_its_stack() {
    let dir = support::scratch("foreign_stacks_report");
    let exe = support::build(&dir, "report", &[SOURCE], &[]);
    let mid = dir.join("mid.log");
    let mid = mid.to_str().unwrap();
    for (hidden, named, kind) in [
        (false, true, "reachable"),
        (false, false, "reachable"),
        (true, true, "reachable"),
        (true, false, "direct"),
    ] {
        let prefix = [&["hidden"][..hidden as usize], &["named"][..named as usize]].concat();
        let args = [&prefix[..], &["report", mid]].concat();
        let run = support::run_with(&exe, "report", "", &[], &args);
        assert!(run.output.status.success(), "{}", run.stderr());
        let report = support::inflate(&support::read_json(&dir.join("mid.log.json")));
        let held = report["leaks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["size"] == 44)
            .unwrap_or_else(|| panic!("{args:?}: no 44-byte block in {report}"));
        assert_eq!(held["leak_kind"], kind, "{args:?}: {held}");
    }
}

/// Boost.Context, the fiber library engines build on (Debian's `libboost-context-dev`): a job's
/// leak has valgrind's frames down to `make_fcontext`, and fibers on 4 threads, each stack
/// mapped with a guard page and unmapped when its fiber ends, keep counts and stacks exact.
/// Nothing tells the tracker about the fibers.
#[test]
fn boost_context_fibers_have_their_stacks_unannounced() {
    const BOOST: &str = "tests/cpp/boost_fibers.cpp";
    let dir = support::scratch("foreign_stacks_boost");
    let sources = [BOOST, "-lboost_context"];
    let exe = support::build(&dir, "boost", &sources, &["-O2", "-I", "tests/cpp"]);
    let plain_flags = ["-O2", "-I", "tests/cpp", "-DK15_MEMORY_DISABLED"];
    let plain = support::build(&dir, "boost_plain", &sources, &plain_flags);
    let valgrind = support::valgrind_leak_check(&plain, &dir, &["one"]);
    let expected = valgrind_program_functions(&valgrind, 91, BOOST);
    assert_eq!(
        expected[..2],
        [
            "(anonymous namespace)::leak_in_boost_job()",
            "(anonymous namespace)::boost_job_body()"
        ],
        "{valgrind}"
    );
    let run = support::run_with(&exe, "boost", "", &[], &["one"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let leak = leak_of(&run, 91);
    assert_eq!(program_functions(leak, BOOST), expected, "{}", run.text);
    let last = leak["stack"].as_array().unwrap().last().unwrap();
    assert_eq!(last["function"], "make_fcontext", "{}", run.text);

    let run = support::run_with(&exe, "boost", "", &[], &["churn", "4", "250"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    assert_eq!(run.json["summary"]["leaked_blocks"], 1000, "{}", run.text);
    assert_eq!(run.json["summary"]["errors"], 0, "{}", run.text);
    assert!(
        run.leaks().iter().all(|l| l["size"] == 29
            && l["stack"][0]["function"] == "(anonymous namespace)::churn_job(unsigned long&)"),
        "{}",
        run.text
    );
}
