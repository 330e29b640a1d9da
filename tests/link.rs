//! Linking cannot silently go wrong: the library before the sources fails loudly (for an
//! executable, and for a shared library at its users' link and at dlopen), and the disabled
//! build needs no library at all.

mod support;
use std::process::Command;

#[test]
fn archive_before_sources_fails_with_a_clear_message() {
    let dir = support::scratch("link_wrong_order");
    let out = Command::new("g++")
        .current_dir(support::repo())
        .args(["-std=c++17", "-g", "-I", "include"])
        .arg(support::static_lib())
        .args(["tests/cpp/options.cpp", "-lpthread", "-ldl", "-o"])
        .arg(dir.join("wrong"))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a wrong link order must not link silently"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("k15_memory_link_error_put_libk15_memory_a_after_your_sources"),
        "{stderr}"
    );
}

#[test]
fn disabled_build_links_without_the_library_and_reports_nothing() {
    let dir = support::scratch("link_disabled");
    let exe = support::build(
        &dir,
        "disabled",
        &["tests/cpp/options.cpp"],
        &["-DK15_MEMORY_DISABLED"],
    );
    let now = dir.join("now.log");
    let run = support::run_with(&exe, "disabled", "", &[], &[now.to_str().unwrap()]);
    assert!(run.output.status.success());
    assert!(run.stdout().contains("write_leak_report: false"));
    assert!(run.json.is_null() && !now.exists());
    let nm = Command::new("nm").arg("-C").arg(&exe).output().unwrap();
    let symbols = String::from_utf8_lossy(&nm.stdout);
    assert!(
        !symbols.contains(" T operator new"),
        "libstdc++'s operators serve this build:\n{symbols}"
    );
    assert!(
        !symbols.contains("k15_memory_link_error"),
        "no link anchor in a disabled build"
    );
}

/// A program with a `pthread_create` of its own links with the static library (whose
/// interposer is weak: two strong definitions did not link), its definition serves every thread
/// start (`std::thread`'s in libstdc++ too), and those threads' leaks are reported.
#[test]
fn a_program_with_its_own_pthread_create_links_and_keeps_it() {
    let dir = support::scratch("link_own_pthread_create");
    let exe = support::build(
        &dir,
        "own_pthread_create",
        &["tests/cpp/own_pthread_create.cpp"],
        &[],
    );
    let run = support::run(&exe, "");
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(
        run.stdout()
            .contains("created by the program's own pthread_create: 3"),
        "{}",
        run.stdout()
    );
    let sizes: Vec<u64> = run
        .leaks()
        .iter()
        .filter(|leak| leak["leak_kind"] == "direct")
        .map(|leak| leak["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [5001, 5001, 5001], "{}", run.text);
}

#[test]
fn archive_before_sources_of_a_shared_library_fails_at_link_and_at_dlopen() {
    let dir = support::scratch("link_wrong_order_shared");
    let archive = support::static_lib().to_str().unwrap();
    // build_shared puts its flags before the sources: the wrong order.
    let engine = support::build_shared(
        &dir,
        "engine",
        &["tests/cpp/shared_engine.cpp"],
        &[archive, "-ldl"],
    );
    let anchor = "k15_memory_link_error_put_libk15_memory_a_after_your_sources";
    let out = Command::new("g++")
        .current_dir(support::repo())
        .args(["-DENGINE_LINKED", "tests/cpp/engine_launcher.cpp"])
        .arg(&engine)
        .arg("-o")
        .arg(dir.join("linked"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "the launcher must not link");
    assert!(String::from_utf8_lossy(&out.stderr).contains(anchor));
    let launcher = support::build(
        &dir,
        "launcher",
        &["tests/cpp/engine_launcher.cpp"],
        &["-DK15_MEMORY_DISABLED", "-ldl"],
    );
    let run = support::run_with(
        &launcher,
        "launcher",
        "",
        &[],
        &[engine.to_str().unwrap(), "unused"],
    );
    assert_eq!(run.output.status.code(), Some(3), "dlopen must fail");
    assert!(run.stderr().contains(anchor), "{}", run.stderr());
}
