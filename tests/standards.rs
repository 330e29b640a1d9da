//! The headers from C++11 up: the same program (K15_NEW plain, array and over-aligned, an engine
//! pool, a typed pool, stats) built as C++11, 14, 17 and 20 with g++ and clang++, warning-free
//! under -pedantic, and its leak reported with K15_NEW's file and line in each; and its
//! `-DK15_MEMORY_DISABLED` build in each, without the library.

mod support;
use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "tests/cpp/standards.cpp";

/// `SOURCE` built by `compiler` as `standard`; `disabled`: with `-DK15_MEMORY_DISABLED` and
/// without the library.
fn compile(compiler: &str, standard: &str, disabled: bool) -> PathBuf {
    let name = format!(
        "standards_{}_{}{}",
        compiler.replace("++", "xx"),
        standard.replace("++", "xx"),
        if disabled { "_disabled" } else { "" }
    );
    let dir = support::scratch(&name);
    let exe = dir.join(&name);
    let mut command = Command::new(compiler);
    command
        .current_dir(support::repo())
        .arg(format!("-std={standard}"))
        .args(["-g", "-Wall", "-Wextra", "-pedantic", "-Werror"])
        .args(["-I", "include", "-I", "/usr/include/bullet", SOURCE]);
    if disabled {
        command.arg("-DK15_MEMORY_DISABLED");
    } else {
        command.arg(support::static_lib());
    }
    let out = command
        .args(["-lpthread", "-ldl", "-o"])
        .arg(&exe)
        .output()
        .expect("the compiler runs");
    assert!(
        out.status.success(),
        "{compiler} -std={standard} (disabled: {disabled}) failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn build_and_check(compiler: &str, standard: &str) {
    let aligned_new = matches!(standard, "c++17" | "c++20");
    let aligned = format!("aligned_new {}, aligned 1", u8::from(aligned_new));
    let run = support::run(&compile(compiler, standard, false), "");
    assert!(run.output.status.success(), "{}", run.stderr());
    let stdout = run.stdout();
    assert!(
        stdout.contains(&aligned),
        "{compiler} -std={standard}: {stdout}"
    );
    let line = support::line_of(SOURCE, "STANDARDS LEAK");
    assert_eq!(
        run.leak_set(),
        vec![(12, false, Some(SOURCE.to_owned()), line)],
        "{compiler} -std={standard}:\n{}",
        run.text
    );
    assert!(run.errors().is_empty(), "{}", run.text);
    // The disabled build of the same program, engine allocators included, needs no library.
    let disabled = support::run(&compile(compiler, standard, true), "");
    assert!(disabled.output.status.success(), "{}", disabled.stderr());
    assert!(
        disabled.stdout().contains(&aligned),
        "{}",
        disabled.stdout()
    );
    assert!(disabled.json.is_null());
}

#[test]
fn cxx11() {
    build_and_check("g++", "c++11");
    build_and_check("clang++-14", "c++11");
}

#[test]
fn cxx14() {
    build_and_check("g++", "c++14");
    build_and_check("clang++-14", "c++14");
}

#[test]
fn cxx17() {
    build_and_check("g++", "c++17");
    build_and_check("clang++-14", "c++17");
}

#[test]
fn cxx20() {
    build_and_check("g++", "c++20");
    build_and_check("clang++-14", "c++20");
}
