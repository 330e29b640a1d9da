//! The headers from C++11 up: the same program (K15_NEW plain, array and over-aligned, an engine
//! pool, a typed pool, stats) built as C++11, 14, 17 and 20 with g++ and clang++, warning-free
//! under -pedantic, and its leak reported with K15_NEW's file and line in each.

mod support;
use std::process::Command;

const SOURCE: &str = "tests/cpp/standards.cpp";

fn build_and_check(compiler: &str, standard: &str) {
    let name = format!(
        "standards_{}_{}",
        compiler.replace("++", "xx"),
        standard.replace("++", "xx")
    );
    let dir = support::scratch(&name);
    let exe = dir.join(&name);
    let out = Command::new(compiler)
        .current_dir(support::repo())
        .arg(format!("-std={standard}"))
        .args(["-g", "-Wall", "-Wextra", "-pedantic", "-Werror"])
        .args(["-I", "include", "-I", "/usr/include/bullet", SOURCE])
        .arg(support::static_lib())
        .args(["-lpthread", "-ldl", "-o"])
        .arg(&exe)
        .output()
        .expect("the compiler runs");
    assert!(
        out.status.success(),
        "{compiler} -std={standard} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = support::run(&exe, "");
    assert!(run.output.status.success(), "{}", run.stderr());
    let stdout = run.stdout();
    let aligned_new = matches!(standard, "c++17" | "c++20");
    assert!(
        stdout.contains(&format!("aligned_new {}, aligned 1", u8::from(aligned_new))),
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
