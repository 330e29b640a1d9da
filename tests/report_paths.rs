//! Reports of many processes and reports that cannot be written: `%p` in the paths, a forked
//! child's own report, the whole report on stderr when its file fails, the one summary line of
//! a clean run, counts in the singular, and which process of a run keeps the configured path
//! under `LD_PRELOAD` (its busiest, every other report beside it, none lost).

mod support;
use std::path::Path;

fn pids(run: &support::Run) -> (String, String) {
    let out = run.stdout();
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.len(), 4, "{out}");
    (words[1].to_owned(), words[3].to_owned())
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn percent_p_gives_each_process_its_own_report() {
    let dir = support::scratch("report_paths_pid");
    let exe = support::build(&dir, "fork_report", &["tests/cpp/fork_report.cpp"], &[]);
    let pattern = dir.join("game.%p.log");
    let run = support::run_with(
        &exe,
        "unused",
        &format!("log_path={}", pattern.display()),
        &[],
        &[],
    );
    let (parent, child) = pids(&run);
    let parent_log = read(&dir.join(format!("game.{parent}.log")));
    let child_log = read(&dir.join(format!("game.{child}.log")));
    assert!(parent_log.contains(&format!("==k15-memory== pid {parent} ")));
    assert!(
        parent_log.contains("Direct leak of 111 bytes in 1 block"),
        "{parent_log}"
    );
    assert!(!parent_log.contains("222 bytes"), "{parent_log}");
    // The child reports the block it leaked, not the one it inherited (the parent reports that).
    assert!(child_log.contains(&format!("==k15-memory== pid {child} ")));
    assert!(
        child_log.contains("Direct leak of 222 bytes in 1 block"),
        "{child_log}"
    );
    assert!(!child_log.contains("111 bytes"), "{child_log}");
    let child_json = support::read_json(&dir.join(format!("game.{child}.log.json")));
    assert_eq!(child_json["pid"].to_string(), child);
    assert_eq!(child_json["summary"]["leaked_blocks"], 1);
    // Singular counts.
    assert!(
        parent_log.contains(
            "Detected 111 bytes leaked in 1 block from 1 allocation site: 1 direct, 0 indirect."
        ),
        "{parent_log}"
    );
    assert!(
        run.stderr()
            .contains("k15-memory: 1 leaked block (111 bytes), 0 memory errors: see "),
        "{}",
        run.stderr()
    );
}

#[test]
fn a_forked_child_never_overwrites_its_parents_report() {
    let dir = support::scratch("report_paths_fork");
    let exe = support::build(&dir, "fork_report", &["tests/cpp/fork_report.cpp"], &[]);
    let run = support::run(&exe, "");
    let (_, child) = pids(&run);
    assert!(
        run.text.contains("Direct leak of 111 bytes"),
        "{}",
        run.text
    );
    assert!(
        !run.text.contains("222 bytes"),
        "the child overwrote the parent's report:\n{}",
        run.text
    );
    assert_eq!(run.json["summary"]["leaked_blocks"], 1);
    let child_log = read(&dir.join(format!("fork_report.log.{child}")));
    assert!(
        child_log.contains("Direct leak of 222 bytes"),
        "{child_log}"
    );
    assert!(dir.join(format!("fork_report.log.json.{child}")).exists());
}

#[test]
fn an_unwritable_report_goes_to_stderr_whole_and_names_the_failing_file() {
    let dir = support::scratch("report_paths_unwritable");
    let exe = support::build(&dir, "fork_report", &["tests/cpp/fork_report.cpp"], &[]);
    let bad = "/nonexistent/dir/game.log";
    let run = support::run_with(&exe, "unused", &format!("log_path={bad}"), &[], &[]);
    let stderr = run.stderr();
    assert!(
        stderr.contains(&format!("could not write the leak report to {bad}: ")),
        "{stderr}"
    );
    assert!(
        stderr.contains("Direct leak of 111 bytes in 1 block (new[]) allocated from:"),
        "{stderr}"
    );
    assert!(
        stderr.contains("SUMMARY: k15-memory: 111 bytes leaked in 1 block;"),
        "{stderr}"
    );
    assert!(
        stderr.contains("k15-memory: 1 leaked block (111 bytes), 0 memory errors"),
        "{stderr}"
    );

    // Only the JSON fails: the error names the JSON file, and the text is where it should be.
    let text = dir.join("ok.log");
    let bad_json = "/nonexistent/dir/game.json";
    let options = format!("log_path={}:json_path={bad_json}", text.display());
    let run = support::run_with(&exe, "unused", &options, &[], &["clean"]);
    let stderr = run.stderr();
    assert!(
        stderr.contains(&format!("could not write the JSON report to {bad_json}: ")),
        "{stderr}"
    );
    assert!(
        !stderr.contains(&format!("leak report to {}", text.display())),
        "{stderr}"
    );
    assert!(read(&text).contains("No leaks"));
}

#[test]
fn a_clean_run_prints_its_one_summary_line() {
    let dir = support::scratch("report_paths_clean");
    let exe = support::build(&dir, "fork_report", &["tests/cpp/fork_report.cpp"], &[]);
    let run = support::run_with(&exe, "clean", "", &[], &["clean"]);
    assert!(run.output.status.success());
    let stderr = run.stderr();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("k15-memory: 0 leaked blocks (0 bytes), 0 memory errors: see "),
        "{stderr}"
    );
    assert!(run.text.contains("No leaks"), "{}", run.text);
}

#[test]
fn write_leak_report_expands_percent_p_too() {
    let dir = support::scratch("report_paths_write_now");
    let exe = support::build(&dir, "options", &["tests/cpp/options.cpp"], &[]);
    let pattern = dir.join("now.%p.log");
    let run = support::run_with(
        &exe,
        "unused",
        "report=0",
        &[],
        &[pattern.to_str().unwrap()],
    );
    assert!(
        run.stdout().contains("write_leak_report: true"),
        "{}",
        run.stdout()
    );
    let written: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("now."))
        .collect();
    let pid = written
        .iter()
        .find_map(|name| name.strip_prefix("now.")?.strip_suffix(".log"))
        .unwrap_or_else(|| panic!("{written:?}"));
    assert!(pid.parse::<u32>().is_ok(), "{written:?}");
    assert!(
        written.contains(&format!("now.{pid}.log.json")),
        "{written:?}"
    );
}

/// A program of `tests/cpp/NAME.cpp` built without the tracker (`-DK15_MEMORY_DISABLED`), to run
/// under `LD_PRELOAD`, in a scratch folder of its own: the folder and the program's path.
fn built_for_preload(scratch: &str, name: &str) -> (std::path::PathBuf, String) {
    let dir = support::scratch(scratch);
    let source = format!("tests/cpp/{name}.cpp");
    let exe = support::build(&dir, name, &[source.as_str()], &["-DK15_MEMORY_DISABLED"]);
    (dir, exe.to_str().unwrap().to_owned())
}

/// Runs `command` in `dir` with the tracker preloaded and its report at `<dir>/launch.log`.
fn preloaded(dir: &Path, command: &[&str], options: &str) -> std::process::Output {
    let log = dir.join("launch.log");
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("launch.log")
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    std::process::Command::new("timeout")
        .args(["--signal=KILL", "60"])
        .args(command)
        .current_dir(dir)
        .env("LD_PRELOAD", support::preload_lib())
        .env(
            "K15_MEMORY_OPTIONS",
            format!("log_path={}{options}", log.display()),
        )
        .output()
        .expect("the launcher runs")
}

/// A launcher under `LD_PRELOAD` (`/usr/bin/time`, a bash script that forks the program) ends after
/// its program and wrote its own report over the program's: the user read "No leaks ...
/// program /usr/bin/time". Now the program's report stays at the configured path, the
/// launcher's goes beside it with its pid appended, and its stderr line says why.
#[test]
fn a_launcher_under_ld_preload_never_hides_the_programs_report() {
    let (dir, program) = built_for_preload("report_paths_launcher", "live_table");
    let program = program.as_str();
    let script = format!("{program} parked; true");
    for launcher in [
        vec!["/usr/bin/time", program, "parked"],
        vec!["bash", "-c", script.as_str()],
    ] {
        let output = preloaded(&dir, &launcher, "");
        assert!(output.status.success(), "{launcher:?}: {output:?}");
        let report = read(&dir.join("launch.log"));
        assert!(
            report.contains(&format!("program {program}\n")),
            "{launcher:?}: {report}"
        );
        assert!(
            report.contains("Direct leak of 4242 bytes in 1 block"),
            "{report}"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        let beside = format!(
            "({} was written by another process of this run)",
            dir.join("launch.log").display()
        );
        let launcher_line = stderr
            .lines()
            .find(|l| l.contains(&beside))
            .unwrap_or_else(|| panic!("{launcher:?}: {stderr}"));
        let launcher_log = launcher_line
            .split("see ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .unwrap();
        let launchers_report = read(Path::new(launcher_log));
        assert!(
            launchers_report.contains("==k15-memory== pid ")
                && !launchers_report.contains(&format!("program {program}\n")),
            "{launchers_report}"
        );
    }
}

/// With `malloc=0`, a process that never made a `new` (here `/bin/true`) writes its report and
/// its stderr line all the same (before: neither).
#[test]
fn a_process_without_a_new_writes_its_report_with_malloc_off() {
    let dir = support::scratch("report_paths_no_new");
    let output = preloaded(&dir, &["/bin/true"], ":malloc=0");
    assert!(output.status.success(), "{output:?}");
    let report = read(&dir.join("launch.log"));
    assert!(report.contains("No leaks"), "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("k15-memory: 0 leaked blocks (0 bytes), 0 memory errors: see "),
        "{stderr}"
    );
}

/// A program under `LD_PRELOAD` that spawns helpers (`/bin/sh` running `ls`, from four threads,
/// each a tracked process that ends before the program): the first helper to end took the
/// configured path, and the program's own report (50 leaks) went beside it, so the user read
/// "No leaks ... program /bin/ls". Now the path keeps the report of the run's busiest process
/// (here the program's, with or without leaks); the program moves the helper's report beside it
/// with that helper's pid, and says so; every helper's report is kept.
#[test]
fn helpers_a_program_spawns_never_take_its_report_path() {
    let (dir, program) = built_for_preload("report_paths_helpers", "spawns_helpers");
    let program = program.as_str();
    let log = dir.join("launch.log");
    for (mode, finding) in [
        ("leaks", "Direct leak of 5000 bytes in 50 blocks"),
        ("clean", "No leaks"),
    ] {
        let output = preloaded(&dir, &[program, mode], "");
        assert!(output.status.success(), "{mode}: {output:?}");
        let report = read(&log);
        assert!(
            report.contains(&format!("program {program}\n")) && report.contains(finding),
            "{mode}: {report}"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        let moved_to = format!("{}.", log.display());
        let program_line = stderr
            .lines()
            .find(|l| l.contains(&format!("see {} (the report of pid ", log.display())))
            .unwrap_or_else(|| panic!("{mode}: {stderr}"));
        let moved = program_line
            .split(" is now ")
            .nth(1)
            .and_then(|rest| rest.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{program_line}"));
        assert!(moved.starts_with(&moved_to), "{program_line}");
        // Its JSON report went with it, and the program's is at the configured path.
        let helper_pid = &moved[moved_to.len()..];
        let moved_json = read(&dir.join(format!("launch.log.json.{helper_pid}")));
        assert!(
            moved_json.contains(&format!("\"pid\": {helper_pid}")),
            "{moved_json}"
        );
        let json = read(&dir.join("launch.log.json"));
        assert!(
            json.contains(&format!("\"program\": \"{program}\"")),
            "{json}"
        );
        let helpers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.starts_with("launch.log.") && !name.contains("json")
            })
            .collect();
        assert!(helpers.len() >= 12, "{mode}: {helpers:?}");
        assert!(
            helpers.iter().any(|p| p.to_str() == Some(moved)),
            "{helpers:?}"
        );
        for helper in &helpers {
            let text = read(helper);
            assert!(
                text.contains("==k15-memory== pid ")
                    && text.contains("SUMMARY: k15-memory: ")
                    && !text.contains(&format!("program {program}\n")),
                "{}: {text}",
                helper.display()
            );
        }
    }
}

/// Twelve processes of one run ending at once (`sh -c ls` started in the background by a shell,
/// all under `LD_PRELOAD`): each chose its path on its own, within a clock tick of the others,
/// so several took another's fresh report for an earlier run's and wrote over it (4 to 7 of the
/// 12 reports were kept). Now every one is kept, and a later run still writes over this one's.
#[test]
fn processes_of_a_run_ending_at_once_keep_every_report() {
    let dir = support::scratch("report_paths_at_once");
    let script = "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sh -c 'ls / > /dev/null' & done; wait";
    let reports_of = |dir: &Path, program: &str| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("launch.log") && !name.contains("json")
            })
            .map(|e| read(&e.path()))
            .filter(|text| text.contains(&format!(" program {program}\n")))
            .collect()
    };
    for _ in 0..3 {
        let output = preloaded(&dir, &["bash", "-c", script], "");
        assert!(output.status.success(), "{output:?}");
        assert_eq!(reports_of(&dir, "/usr/bin/ls").len(), 12, "{output:?}");
    }
    // A second run writes its report over the first's, and moves none of the first's aside.
    let (dir, program) = built_for_preload("report_paths_next_run", "spawns_helpers");
    let program = program.as_str();
    let first = preloaded(&dir, &[program, "clean"], "");
    assert!(first.status.success(), "{first:?}");
    let files = |dir: &Path| std::fs::read_dir(dir).unwrap().count();
    let after_first = files(&dir);
    let header = |text: &str| text.lines().nth(1).unwrap_or_default().to_owned();
    let first_report = header(&read(&dir.join("launch.log")));
    let second = std::process::Command::new(program)
        .arg("leaks")
        .current_dir(&dir)
        .env("LD_PRELOAD", support::preload_lib())
        .env(
            "K15_MEMORY_OPTIONS",
            format!("log_path={}", dir.join("launch.log").display()),
        )
        .output()
        .unwrap();
    assert!(second.status.success(), "{second:?}");
    let second_report = read(&dir.join("launch.log"));
    assert!(
        header(&second_report) != first_report
            && second_report.contains(&format!("program {program}\n"))
            && second_report.contains("Direct leak of 5000 bytes in 50 blocks"),
        "{second_report}"
    );
    // The first run's report is gone, not moved aside; the second run's helpers wrote theirs
    // beside the program's.
    let kept_first = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().contains("json"))
        .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| header(&t) == first_report));
    assert!(!kept_first, "{first_report}");
    assert!(files(&dir) > after_first);
}
