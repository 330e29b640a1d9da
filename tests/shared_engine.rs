//! An engine built as a shared library with the tracker linked into it, run by a launcher that
//! knows nothing of the tracker, and loading a plugin built without it. Linked at start, every
//! new/delete of the process is tracked and the report comes after every static destructor;
//! loaded by dlopen, the tracker takes the process's operators over from libstdc++ (and those of
//! the plugin it loads later) and tracks every new/delete from then on. A library that hides the
//! operators cannot: it says so in one line and runs on untracked.

mod support;
use std::path::{Path, PathBuf};

const ENGINE: &str = "tests/cpp/shared_engine.cpp";
const LAUNCHER: &str = "tests/cpp/engine_launcher.cpp";
const PLUGIN: &str = "tests/cpp/engine_plugin.cpp";

type LeakSet = Vec<(u64, bool, Option<String>, u64)>;

/// The engine library (with the tracker, `flags` at its link) and the plugin, in `dir`.
fn engine_and_plugin(dir: &Path, flags: &[&str]) -> (PathBuf, PathBuf) {
    let engine = support::build_shared_with_tracker(dir, "engine", &[ENGINE], flags);
    (engine, support::build_shared(dir, "plugin", &[PLUGIN], &[]))
}

/// The launcher; `-DK15_MEMORY_DISABLED` only tells `support::build` that it links no tracker of
/// its own (it does not include the header).
fn launcher(dir: &Path, engine: Option<&Path>, flags: &[&str]) -> PathBuf {
    let mut all = vec!["-DK15_MEMORY_DISABLED"];
    all.extend_from_slice(flags);
    let mut sources = vec![LAUNCHER];
    sources.extend(engine.map(|lib| lib.to_str().unwrap()));
    support::build(dir, "launcher", &sources, &all)
}

/// Runs the launcher; checks that it ran clean, and returns the run and its stderr.
fn run_launcher(exe: &Path, args: &[&Path]) -> (support::Run, String) {
    let args: Vec<&str> = args.iter().map(|path| path.to_str().unwrap()).collect();
    // malloc=0: the leak set compared is of `new[]`s (libdl and the C runtime malloc for
    // themselves when libraries are loaded).
    let run = support::run_with(exe, "launcher", "malloc=0", &[], &args);
    let stderr = run.stderr();
    assert!(run.output.status.success(), "{stderr}");
    let stdout = run.stdout();
    assert!(
        stdout.contains("launcher: 10 meshes, plugin made 100"),
        "{stdout}"
    );
    assert!(!stderr.contains("Memory error"), "{stderr}");
    (run, stderr)
}

/// The leaks of a tracked run (`launcher` bytes of plain `new[]`, besides the plugin's 12 and the
/// engine's K15_NEW), no memory error, and the report after both modules' statics.
fn assert_tracked(run: &support::Run, stderr: &str, launcher: &[u64]) {
    assert!(!stderr.contains("warning"), "{stderr}");
    let engine_leak = (
        20,
        true,
        Some(ENGINE.to_owned()),
        support::line_of(ENGINE, "ENGINE LEAK"),
    );
    let mut expected: LeakSet = vec![(12, true, None, 0), engine_leak];
    expected.extend(launcher.iter().map(|&size| (size, true, None, 0)));
    expected.sort();
    assert_eq!(run.leak_set(), expected, "{}", run.text);
    assert!(run.errors().is_empty(), "{}", run.text);
    // The summary line is the last thing the tracker prints.
    let report = stderr.rfind("k15-memory: ").expect(stderr);
    for statics in [
        "shared_engine: statics destroyed",
        "launcher: statics destroyed",
    ] {
        assert!(stderr.find(statics).expect(stderr) < report, "{stderr}");
    }
}

#[test]
fn engine_library_linked_at_start_tracks_the_whole_process_and_reports_last() {
    let dir = support::scratch("shared_engine_linked");
    let (engine, plugin) = engine_and_plugin(&dir, &[]);
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let exe = launcher(&dir, Some(&engine), &["-DENGINE_LINKED", &rpath]);
    let (run, stderr) = run_launcher(&exe, &[&plugin]);
    // The launcher's plain news (no file:line) are tracked, before and after the engine ran.
    assert_tracked(&run, &stderr, &[13, 28]);
    let functions: Vec<&str> = run
        .leaks()
        .iter()
        .flat_map(|l| l["stack"].as_array().into_iter().flatten())
        .filter_map(|f| f["function"].as_str())
        .collect();
    assert!(
        functions.contains(&"main") && functions.iter().any(|f| f.contains("engine_run")),
        "{}",
        run.text
    );
}

#[test]
fn engine_library_loaded_by_dlopen_takes_the_operators_over_and_reports_last() {
    let dir = support::scratch("shared_engine_dlopen");
    let (engine, plugin) = engine_and_plugin(&dir, &[]);
    let exe = launcher(&dir, None, &["-ldl"]);
    let (run, stderr) = run_launcher(&exe, &[&engine, &plugin]);
    // Tracked from the dlopen on: the launcher's later leak, not its earlier one; the plugin,
    // loaded after the take-over, too. The launcher's statics, allocated by libstdc++ before,
    // were handed back to it at exit.
    assert_tracked(&run, &stderr, &[13]);
    // Pinned by the tracker, the engine stays loaded after dlclose; its statics go at exit.
    let closed = stderr.find("launcher: engine closed").expect(&stderr);
    let engine_statics = stderr.find("shared_engine: statics destroyed");
    assert!(engine_statics.expect(&stderr) > closed, "{stderr}");
    // libstdc++'s own calls were redirected too: the engine's strings grow inside it.
    let total = run.json["summary"]["total_allocations"].as_u64().unwrap();
    assert!(total >= 30, "{total} allocations tracked\n{}", run.text);
}

#[test]
fn engine_library_hiding_the_operators_warns_once_and_runs_untracked() {
    let dir = support::scratch("shared_engine_hidden");
    let (engine, plugin) = engine_and_plugin(&dir, &["-Wl,--exclude-libs,ALL"]);
    let exe = launcher(&dir, None, &["-ldl"]);
    // K15_NEW's blocks come from libstdc++'s operator new; every block the engine's own delete
    // meets that the tracker did not serve goes back to libstdc++, without a memory error.
    let (_, stderr) = run_launcher(&exe, &[&engine, &plugin]);
    let warning = "k15-memory: warning: operator new of this process is ";
    assert_eq!(stderr.matches(warning).count(), 1, "{stderr}");
    assert!(stderr.contains("libstdc++"), "{stderr}");
    assert!(
        stderr.contains("shared_engine: statics destroyed"),
        "{stderr}"
    );
}
