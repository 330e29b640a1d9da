//! An engine built as a shared library with the tracker linked into it, run by a launcher that
//! knows nothing of the tracker: linked at start, every new/delete of the process is tracked and
//! the report comes after every static destructor; loaded by dlopen, where the tracker cannot be
//! the process's operator new, it says so in one line and the program runs on untracked.

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
    let engine = support::build_shared_with_tracker(&dir, "engine", &[ENGINE]);
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
    // The launcher's plain new (no file:line) is tracked as well as the engine's K15_NEW; every
    // block the statics of both modules free at exit is not a leak.
    assert_eq!(
        run.leak_set(),
        vec![
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
    let report = stderr.find("k15-memory: 2 leaked blocks").expect(&stderr);
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
fn engine_library_loaded_by_dlopen_warns_once_and_runs_untracked() {
    let dir = support::scratch("shared_engine_dlopen");
    let engine = support::build_shared_with_tracker(&dir, "engine", &[ENGINE]);
    let exe = launcher(&dir, None, &["-ldl"]);
    let run = support::run_with(&exe, "launcher", "", &[], &[engine.to_str().unwrap()]);
    let stderr = run.stderr();
    // K15_NEW's blocks come from the process's operator new, which libstdc++'s delete frees.
    assert!(run.output.status.success(), "{stderr}");
    assert!(
        run.stdout().contains("launcher: 10 meshes"),
        "{}",
        run.stdout()
    );
    assert_eq!(
        stderr
            .matches("k15-memory: warning: operator new of this process is")
            .count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("libstdc++"), "{stderr}");
    // Pinned by the tracker, the engine stays loaded after dlclose; its statics go at exit.
    let closed = stderr.find("launcher: engine closed").expect(&stderr);
    assert!(
        stderr
            .find("shared_engine: statics destroyed")
            .expect(&stderr)
            > closed
    );
    assert!(stderr.contains("launcher: statics destroyed"), "{stderr}");
    assert!(
        run.json.is_null(),
        "nothing was tracked, nothing to report: {}",
        run.text
    );
}
