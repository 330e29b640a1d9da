//! Linking cannot silently go wrong: the library before the sources fails loudly, and the
//! disabled build needs no library at all.

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
