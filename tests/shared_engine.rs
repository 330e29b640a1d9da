//! An engine built as a shared library with the tracker linked into it, run by a launcher that
//! knows nothing of the tracker: linked at start, every new/delete of the process is tracked and
//! the report comes after every static destructor; loaded by dlopen, the tracker takes the
//! process's operators over from libstdc++ and tracks every new/delete from then on. A library
//! that hides the operators cannot: it says so in one line and runs on untracked.

mod support;
use std::path::{Path, PathBuf};

const ENGINE: &str = "tests/cpp/shared_engine.cpp";
const LAUNCHER: &str = "tests/cpp/engine_launcher.cpp";

/// The launcher; `-DK15_MEMORY_DISABLED` only tells `support::build` that it links no tracker of
/// its own (it does not include the header).
fn launcher(dir: &Path, engine: Option<&Path>, flags: &[&str]) -> PathBuf {
    let mut all = vec!["-DK15_MEMORY_DISABLED"];
    all.extend_from_slice(flags);
    let mut sources = vec![LAUNCHER];
    sources.extend(engine.map(|lib| lib.to_str().unwrap()));
    support::build(dir, "launcher", &sources, &all)
}

#[test]
fn engine_library_linked_at_start_tracks_the_whole_process_and_reports_last() {
    let dir = support::scratch("shared_engine_linked");
    let engine = support::build_shared_with_tracker(&dir, "engine", &[ENGINE], &[]);
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let exe = launcher(&dir, Some(&engine), &["-DENGINE_LINKED", &rpath]);
    let run = support::run(&exe, "");
    let stderr = run.stderr();
    assert!(run.output.status.success(), "{stderr}");
    assert!(
        run.stdout().contains("launcher: 10 meshes"),
        "{}",
        run.stdout()
    );
    assert!(!stderr.contains("warning"), "{stderr}");
    // The launcher's plain news (no file:line) are tracked as well as the engine's K15_NEW;
    // every block the statics of both modules free at exit is not a leak.
    assert_eq!(
        run.leak_set(),
        vec![
            (13, true, None, 0),
            (
                20,
                true,
                Some(ENGINE.to_owned()),
                support::line_of(ENGINE, "ENGINE LEAK")
            ),
            (28, true, None, 0),
        ],
        "{}",
        run.text
    );
    assert!(run.errors().is_empty(), "{}", run.text);
    let report = stderr.find("k15-memory: 3 leaked blocks").expect(&stderr);
    for statics in [
        "shared_engine: statics destroyed",
        "launcher: statics destroyed",
    ] {
        assert!(stderr.find(statics).expect(&stderr) < report, "{stderr}");
    }
    assert!(
        run.text.contains("main ") && run.text.contains("engine_run"),
        "{}",
        run.text
    );
}

#[test]
fn engine_library_loaded_by_dlopen_takes_the_operators_over_and_reports_last() {
    let dir = support::scratch("shared_engine_dlopen");
    let engine = support::build_shared_with_tracker(&dir, "engine", &[ENGINE], &[]);
    let exe = launcher(&dir, None, &["-ldl"]);
    let run = support::run_with(&exe, "launcher", "", &[], &[engine.to_str().unwrap()]);
    let stderr = run.stderr();
    assert!(run.output.status.success(), "{stderr}");
    assert!(
        run.stdout().contains("launcher: 10 meshes"),
        "{}",
        run.stdout()
    );
    assert!(!stderr.contains("warning"), "{stderr}");
    // Tracked from the dlopen on: the engine's leak and the launcher's later one, not the
    // launcher's earlier one. The launcher's statics, allocated by libstdc++ before, were handed
    // back to it at exit without a memory error.
    assert_eq!(
        run.leak_set(),
        vec![
            (13, true, None, 0),
            (
                20,
                true,
                Some(ENGINE.to_owned()),
                support::line_of(ENGINE, "ENGINE LEAK")
            ),
        ],
        "{}",
        run.text
    );
    assert!(run.errors().is_empty(), "{}", run.text);
    // Pinned by the tracker, the engine stays loaded after dlclose; its statics go at exit, and
    // the report after them and after the launcher's.
    let closed = stderr.find("launcher: engine closed").expect(&stderr);
    let report = stderr.find("k15-memory: 2 leaked blocks").expect(&stderr);
    let engine_statics = stderr
        .find("shared_engine: statics destroyed")
        .expect(&stderr);
    let launcher_statics = stderr.find("launcher: statics destroyed").expect(&stderr);
    assert!(
        closed < engine_statics && engine_statics < report && launcher_statics < report,
        "{stderr}"
    );
    // libstdc++'s own calls were redirected too: the engine's strings grow inside it.
    let total = run.json["summary"]["total_allocations"].as_u64().unwrap();
    assert!(total >= 30, "{total} allocations tracked\n{}", run.text);
}

#[test]
fn engine_library_hiding_the_operators_warns_once_and_runs_untracked() {
    let dir = support::scratch("shared_engine_hidden");
    let engine =
        support::build_shared_with_tracker(&dir, "engine", &[ENGINE], &["-Wl,--exclude-libs,ALL"]);
    let exe = launcher(&dir, None, &["-ldl"]);
    let run = support::run_with(&exe, "launcher", "", &[], &[engine.to_str().unwrap()]);
    let stderr = run.stderr();
    // K15_NEW's blocks come from libstdc++'s operator new; every block the engine's own delete
    // meets that the tracker did not serve goes back to libstdc++, without a memory error.
    assert!(run.output.status.success(), "{stderr}");
    assert!(
        run.stdout().contains("launcher: 10 meshes"),
        "{}",
        run.stdout()
    );
    let warning = "k15-memory: warning: operator new of this process is ";
    assert_eq!(stderr.matches(warning).count(), 1, "{stderr}");
    assert!(stderr.contains("libstdc++"), "{stderr}");
    assert!(!stderr.contains("Memory error"), "{stderr}");
    assert!(
        stderr.contains("shared_engine: statics destroyed"),
        "{stderr}"
    );
}
