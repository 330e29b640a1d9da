//! The three CMake ways of README: `add_subdirectory` of the repository, `find_package` after
//! `cmake --install` (and the `k15-memory.pc` it installs, through pkg-config), and
//! `cmake/k15_inject.cmake` into a project left untouched. Each builds a small project with CMake
//! and reads the report its program writes.

mod support;
use std::path::Path;
use std::process::Command;

fn run_command(command: &mut Command) -> String {
    let out = command.output().expect("the command runs");
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Configures and builds `source` in `build`. The crate's cargo build goes to the target
/// directory the tests already built (a no-op for cargo) instead of a fresh one per project.
fn cmake_build(source: &Path, build: &Path, defines: &[String]) {
    let support_lib = support::static_lib();
    let target_dir = support_lib.parent().unwrap().parent().unwrap();
    run_command(
        Command::new("cmake")
            .arg("-S")
            .arg(source)
            .arg("-B")
            .arg(build)
            .arg(format!("-DK15_MEMORY_CARGO={}", env!("CARGO")))
            .arg(format!(
                "-DK15_MEMORY_CARGO_TARGET_DIR={}",
                target_dir.display()
            ))
            .args(defines),
    );
    run_command(Command::new("cmake").arg("--build").arg(build));
}

/// The leaks of tests/cmake/game: K15_NEW's `int[3]` with its file:line, and a plain `double`.
fn assert_game_leaks(run: &support::Run) {
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(
        run.stdout().contains("__cplusplus 201103"),
        "{}",
        run.stdout()
    );
    let source = support::repo().join("tests/cmake/game/main.cpp");
    let line = support::line_of("tests/cmake/game/main.cpp", "GAME LEAK");
    assert_eq!(
        run.leak_set(),
        vec![
            (8, false, None, 0),
            (12, true, Some(source.display().to_string()), line),
        ],
        "{}",
        run.text
    );
    assert!(run.errors().is_empty(), "{}", run.text);
}

#[test]
fn add_subdirectory_gives_the_target_to_a_cxx11_game() {
    let dir = support::scratch("cmake_subdirectory");
    let game = support::repo().join("tests/cmake/game");
    cmake_build(
        &game,
        &dir.join("build"),
        &[
            "-DK15_WAY=subdirectory".to_owned(),
            format!("-DK15_MEMORY_DIR={}", support::repo().display()),
        ],
    );
    assert_game_leaks(&support::run(&dir.join("build/game"), ""));
}

#[test]
fn installed_package_serves_find_package_and_pkg_config() {
    let dir = support::scratch("cmake_package");
    let prefix = dir.join("prefix");
    cmake_build(
        support::repo(),
        &dir.join("k15-build"),
        &[format!("-DCMAKE_INSTALL_PREFIX={}", prefix.display())],
    );
    run_command(
        Command::new("cmake")
            .arg("--install")
            .arg(dir.join("k15-build")),
    );
    for installed in [
        "include/k15/memory.h",
        "include/k15/engine.h",
        "lib/libk15_memory.a",
        "lib/k15-memory/libk15_memory.so",
        "lib/cmake/k15_memory/k15_memoryConfig.cmake",
        "lib/pkgconfig/k15-memory.pc",
    ] {
        assert!(prefix.join(installed).exists(), "{installed} not installed");
    }

    let game = support::repo().join("tests/cmake/game");
    cmake_build(
        &game,
        &dir.join("game-build"),
        &[
            "-DK15_WAY=package".to_owned(),
            format!("-DCMAKE_PREFIX_PATH={}", prefix.display()),
        ],
    );
    assert_game_leaks(&support::run(&dir.join("game-build/game"), ""));

    // pkg-config's flags, in the order a Makefile writes them: the library still lands after
    // the objects, and the leak set is the same.
    let flags = run_command(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "k15-memory"])
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")),
    );
    let exe = dir.join("pkg-game");
    run_command(
        Command::new("g++")
            .args([
                "-std=c++11",
                "-g",
                "-Wall",
                "-Wextra",
                "-pedantic",
                "-Werror",
            ])
            .arg(game.join("main.cpp"))
            .args(flags.split_whitespace())
            .arg("-o")
            .arg(&exe),
    );
    assert_game_leaks(&support::run(&exe, ""));
}

#[test]
fn inject_into_an_untouched_project_tracks_its_executable() {
    let dir = support::scratch("cmake_inject");
    let project = support::repo().join("tests/cmake/untouched");
    let inject = support::repo().join("cmake/k15_inject.cmake");
    cmake_build(
        &project,
        &dir.join("build"),
        &[format!("-DCMAKE_PROJECT_INCLUDE={}", inject.display())],
    );
    let run = support::run(&dir.join("build/untouched"), "");
    let stderr = run.stderr();
    assert!(run.output.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    assert!(
        run.stdout().contains("untouched: voice of 64"),
        "{}",
        run.stdout()
    );
    // The static library's leak and the executable's; the shared library's string was freed.
    assert_eq!(
        run.leak_set(),
        vec![(11, true, None, 0), (36, true, None, 0)],
        "{}",
        run.text
    );
    assert!(run.errors().is_empty(), "{}", run.text);
    let functions: Vec<_> = run
        .leaks()
        .iter()
        .map(|leak| leak["stack"][0]["function"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        functions.iter().any(|f| f.starts_with("make_leak")),
        "{functions:?}"
    );
}

/// The project's object files and their modification times.
fn objects(build: &Path) -> Vec<(std::path::PathBuf, std::time::SystemTime)> {
    fn walk(dir: &Path, found: &mut Vec<(std::path::PathBuf, std::time::SystemTime)>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() && !path.ends_with("k15-memory") {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "o") {
                found.push((path, entry.metadata().unwrap().modified().unwrap()));
            }
        }
    }
    let mut found = Vec::new();
    walk(build, &mut found);
    found.sort();
    found
}

/// Every file under `dir`, relative to it.
fn files_under(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir).unwrap();
                files.push(relative.display().to_string());
            }
        }
    }
    files.sort();
    files
}

#[test]
fn inject_into_an_existing_build_recompiles_nothing_and_installs_only_the_project() {
    let dir = support::scratch("cmake_inject_existing");
    let project = support::repo().join("tests/cmake/untouched");
    let build = dir.join("build");
    cmake_build(&project, &build, &[]);
    let before = objects(&build);
    assert_eq!(before.len(), 3, "{before:?}");
    // Timestamps of a rebuild would differ even within the same second.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let inject = support::repo().join("cmake/k15_inject.cmake");
    cmake_build(
        &project,
        &build,
        &[format!("-DCMAKE_PROJECT_INCLUDE={}", inject.display())],
    );
    assert_eq!(objects(&build), before, "an object was recompiled");
    // The relinked executable is tracked.
    let run = support::run(&build.join("untouched"), "");
    assert!(run.output.status.success(), "{}", run.stderr());
    assert_eq!(
        run.leak_set(),
        vec![(11, true, None, 0), (36, true, None, 0)],
        "{}",
        run.text
    );

    let prefix = dir.join("prefix");
    run_command(
        Command::new("cmake")
            .arg("--install")
            .arg(&build)
            .arg("--prefix")
            .arg(&prefix),
    );
    assert_eq!(files_under(&prefix), ["bin/untouched", "lib/libaudio.so"]);
}
