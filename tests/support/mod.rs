//! Shared by the integration tests: build real C++ programs with g++ and the README's link line
//! against `target/release/libk15_memory.a`, run them, and read the reports they write.
#![allow(dead_code)] // each test binary uses its own part of this module

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The static library, built once per test binary (a no-op when `cargo test --release` is
/// already up to date).
pub fn static_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--release", "--lib", "--quiet"])
            .current_dir(repo())
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cargo build --release failed");
        repo().join("target/release/libk15_memory.a")
    })
}

/// A fresh directory for one test's binaries and reports.
/// A script beside `exe` that runs it under `ulimit FLAGS LIMIT` (`-v`, `-S -n`), the limit its
/// first argument and the program's arguments after it: `name` in the same folder.
pub fn under_ulimit(exe: &Path, name: &str, flags: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let program = exe.file_name().unwrap().to_string_lossy();
    let wrapper = exe.with_file_name(name);
    let script =
        format!("#!/bin/sh\nulimit {flags} \"$1\" || exit 99\nshift\nexec ./{program} \"$@\"\n");
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    wrapper
}

pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compiles and links `sources` (relative to the repo) the way README says:
/// `g++ -std=c++17 -g -I include <sources> target/release/libk15_memory.a -lpthread -ldl -o exe`.
/// `flags` go before the sources; `-DK15_MEMORY_DISABLED` builds without the library.
pub fn build(dir: &Path, name: &str, sources: &[&str], flags: &[&str]) -> PathBuf {
    let exe = dir.join(name);
    let disabled = flags.contains(&"-DK15_MEMORY_DISABLED");
    let mut cmd = Command::new("g++");
    cmd.current_dir(repo()).args([
        "-std=c++17",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-I",
        "include",
    ]);
    cmd.args(flags).args(sources);
    if !disabled {
        cmd.arg(static_lib());
    }
    cmd.args(["-lpthread", "-ldl", "-o"]).arg(&exe);
    let out = cmd.output().expect("g++ runs");
    assert!(
        out.status.success(),
        "g++ failed for {name}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Compiles and links a C program (`source`, relative to the repo) with gcc, no C++ of its own,
/// as README's C line says: the library, then `-lstdc++ -lpthread -ldl -lm`. `flags` go before
/// the source; `-DK15_MEMORY_DISABLED` builds without the library (plain glibc).
pub fn build_c(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let exe = dir.join(name);
    let mut cmd = Command::new("gcc");
    cmd.current_dir(repo())
        .args([
            "-std=c11", "-g", "-Wall", "-Wextra", "-Werror", "-I", "include",
        ])
        .args(flags)
        .arg(source);
    if !flags.contains(&"-DK15_MEMORY_DISABLED") {
        cmd.arg(static_lib());
    }
    let out = cmd
        .args(["-lstdc++", "-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .expect("gcc runs");
    assert!(
        out.status.success(),
        "gcc failed for {name}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The sources of the sample engine (README's first command).
pub const ENGINE_SAMPLE: [&str; 2] = ["samples/engine/main.cpp", "samples/engine/world.cpp"];

/// A shared library of the test's own (for statics in another module, stacks through it).
pub fn build_shared(dir: &Path, name: &str, sources: &[&str], flags: &[&str]) -> PathBuf {
    link_shared(dir, name, sources, flags, &[])
}

/// A shared library with the tracker linked into it, as README says for engines built as
/// shared libraries: `g++ -fPIC -shared <sources> libk15_memory.a -lpthread -ldl`.
pub fn build_shared_with_tracker(
    dir: &Path,
    name: &str,
    sources: &[&str],
    flags: &[&str],
) -> PathBuf {
    let tracker = static_lib().to_str().expect("a UTF-8 path");
    link_shared(dir, name, sources, flags, &[tracker, "-lpthread", "-ldl"])
}

fn link_shared(dir: &Path, name: &str, sources: &[&str], flags: &[&str], libs: &[&str]) -> PathBuf {
    let lib = dir.join(format!("lib{name}.so"));
    let out = Command::new("g++")
        .current_dir(repo())
        .args([
            "-std=c++17",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fPIC",
            "-shared",
            "-I",
            "include",
        ])
        .args(flags)
        .args(sources)
        .args(libs)
        .arg("-o")
        .arg(&lib)
        .output()
        .expect("g++ runs");
    assert!(
        out.status.success(),
        "g++ -shared failed for {name}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

/// `target/release/libk15_memory.so`, for LD_PRELOAD (built with the static library).
pub fn preload_lib() -> PathBuf {
    static_lib().with_extension("so")
}

/// What one run left behind.
pub struct Run {
    pub output: Output,
    pub text: String,
    /// The JSON report with each leak's site and every stack written out in place (see
    /// [`inflate`]), so tests read `leak["stack"][0]["function"]`.
    pub json: Value,
    /// The JSON report as written (`k15-leaks/3`: stacks and sites by index).
    pub raw_json: Value,
}

/// `k15-leaks/3` stores each frame, stack and allocation site once and refers to them by index:
/// this puts the site's fields into each leak and the frames in place of every stack index.
pub fn inflate(raw: &Value) -> Value {
    let mut json = raw.clone();
    if raw.is_null() {
        return json;
    }
    let frames = raw["frames"].as_array().expect("frames table");
    let stacks: Vec<Value> = raw["stacks"]
        .as_array()
        .expect("stacks table")
        .iter()
        .map(|ids| {
            let ids = ids.as_array().expect("a stack is a list of frame indices");
            ids.iter()
                .map(|i| frames[i.as_u64().unwrap() as usize].clone())
                .collect()
        })
        .collect();
    let stack = |v: &Value| stacks[v.as_u64().expect("stack index") as usize].clone();
    let sites = raw["sites"].as_array().expect("sites table").clone();
    for leak in json["leaks"].as_array_mut().expect("leaks") {
        let site = &sites[leak["site"].as_u64().expect("site index") as usize];
        for (key, value) in site.as_object().unwrap() {
            let value = if key == "stack" {
                stack(value)
            } else {
                value.clone()
            };
            leak[key] = value;
        }
    }
    for error in json["errors"].as_array_mut().expect("errors") {
        for (_, value) in error
            .as_object_mut()
            .unwrap()
            .iter_mut()
            .filter(|(k, _)| k.ends_with("_stack"))
        {
            if value.is_u64() {
                *value = stack(value);
            }
        }
    }
    json
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
    pub fn leaks(&self) -> &Vec<Value> {
        self.json["leaks"].as_array().expect("leaks array")
    }
    pub fn errors(&self) -> &Vec<Value> {
        self.json["errors"].as_array().expect("errors array")
    }
    pub fn error_kinds(&self) -> Vec<String> {
        self.errors()
            .iter()
            .map(|e| e["kind"].as_str().unwrap().to_owned())
            .collect()
    }
    /// The leaks as (size, array, file, line), sorted.
    pub fn leak_set(&self) -> Vec<(u64, bool, Option<String>, u64)> {
        let mut set: Vec<_> = self
            .leaks()
            .iter()
            .map(|l| {
                (
                    l["size"].as_u64().unwrap(),
                    l["array"].as_bool().unwrap(),
                    l["file"].as_str().map(str::to_owned),
                    l["line"].as_u64().unwrap(),
                )
            })
            .collect();
        set.sort();
        set
    }
}

/// Runs `exe` in its directory with `K15_MEMORY_OPTIONS=log_path=<dir>/<report>.log:<options>`
/// and reads both reports (JSON `null` where none was written).
pub fn run_with(
    exe: &Path,
    report: &str,
    options: &str,
    env: &[(&str, &str)],
    args: &[&str],
) -> Run {
    let dir = exe.parent().unwrap();
    let log = dir.join(format!("{report}.log"));
    let json_path = dir.join(format!("{report}.log.json"));
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&json_path);
    let mut all_options = format!("log_path={}", log.display());
    if !options.is_empty() {
        all_options = format!("{all_options}:{options}");
    }
    // A hang (a deadlock in the tracker) fails the test instead of stalling the run. The
    // environment reaches the program through `env`, so that `timeout` itself runs without a
    // preloaded tracker (it would write a report of its own mallocs over the program's).
    let assignments = env.iter().map(|(key, value)| format!("{key}={value}"));
    let output = Command::new("timeout")
        .args(["--signal=KILL", "300", "env"])
        .args(assignments)
        .arg(exe)
        .args(args)
        .current_dir(dir)
        .env("K15_MEMORY_OPTIONS", all_options)
        .output()
        .expect("the program runs");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let raw_json = read_json(&json_path);
    Run {
        output,
        text,
        json: inflate(&raw_json),
        raw_json,
    }
}

/// [`run_with`] of a program that must exit 0 having printed `survived`: it went on past every
/// memory error it made.
pub fn run_surviving(
    exe: &Path,
    report: &str,
    options: &str,
    env: &[(&str, &str)],
    args: &[&str],
) -> Run {
    let run = run_with(exe, report, options, env, args);
    assert!(
        run.output.status.success() && run.stdout().contains("survived"),
        "{}\n{}",
        run.stdout(),
        run.stderr()
    );
    run
}

/// A JSON report (`null` if there is none).
pub fn read_json(path: &Path) -> Value {
    std::fs::read_to_string(path)
        .map(|s| serde_json::from_str(&s).unwrap_or_else(|e| panic!("bad JSON report: {e}\n{s}")))
        .unwrap_or(Value::Null)
}

pub fn run(exe: &Path, options: &str) -> Run {
    run_with(
        exe,
        exe.file_name().unwrap().to_str().unwrap(),
        options,
        &[],
        &[],
    )
}

/// The line of `marker` in a source file (1-based), so tests name places, not numbers.
pub fn line_of(source: &str, marker: &str) -> u64 {
    let text = std::fs::read_to_string(repo().join(source)).unwrap();
    let index = text.lines().position(|l| l.contains(marker));
    index.unwrap_or_else(|| panic!("{marker} not in {source}")) as u64 + 1
}

/// Runs `cmd` with its output discarded and returns its exit status (as `wait4` gives it), its
/// CPU seconds (user + system) and its peak resident memory in KiB.
#[allow(clippy::zombie_processes)] // reaped by wait4, which also gives its resource usage
pub fn run_measured(cmd: &mut Command) -> (i32, f64, i64) {
    let child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the program runs");
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, which `Child` never waits for after this; both out
    // pointers are valid for the call.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert!(pid > 0, "wait4 failed");
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        status,
        seconds(usage.ru_utime) + seconds(usage.ru_stime),
        usage.ru_maxrss,
    )
}

/// What `valgrind --leak-check=full --show-leak-kinds=all` prints (its stderr) for `exe args`
/// run in `dir`: the referee the tests hold the tracker's leak sets against.
pub fn valgrind_leak_check(exe: &Path, dir: &Path, args: &[&str]) -> String {
    let out = Command::new("valgrind")
        .args([
            "--leak-check=full",
            "--show-leak-kinds=all",
            "--error-exitcode=0",
        ])
        .arg(exe)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("valgrind is installed (.ci/run installs it)");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// One line of valgrind's leak summary (`kind`: "definitely lost:", "still reachable:", ...):
/// (blocks, bytes).
pub fn valgrind_summary(valgrind_output: &str, kind: &str) -> (u64, u64) {
    let line = valgrind_output
        .lines()
        .find(|l| l.contains(kind))
        .unwrap_or_else(|| panic!("no {kind} in:\n{valgrind_output}"));
    let numbers: Vec<u64> = line
        .split_once(kind)
        .unwrap()
        .1
        .split_whitespace()
        .filter_map(|w| w.replace(',', "").parse().ok())
        .collect();
    (numbers[1], numbers[0]) // "N bytes in M blocks"
}

/// valgrind's definitely plus indirectly lost (blocks, bytes).
pub fn valgrind_lost(valgrind_output: &str) -> (u64, u64) {
    let direct = valgrind_summary(valgrind_output, "definitely lost:");
    let indirect = valgrind_summary(valgrind_output, "indirectly lost:");
    (direct.0 + indirect.0, direct.1 + indirect.1)
}

/// (leak kind, size) -> blocks: what a test compares with valgrind's loss records.
pub type Census = BTreeMap<(String, u64), u64>;

/// One loss record of valgrind's (`--show-leak-kinds=all`): its blocks' class as the tracker
/// names it (`direct`, `indirect`, `reachable`; `possible` for valgrind's possibly lost), their
/// bytes and count (for a definitely lost
/// record, its own blocks, not those it holds), and its stack's lines.
pub struct LossRecord<'a> {
    pub kind: &'static str,
    pub bytes: u64,
    pub blocks: u64,
    pub stack: Vec<&'a str>,
}

/// Every loss record of valgrind's output.
pub fn loss_records(text: &str) -> Vec<LossRecord<'_>> {
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.split_once("== ").map_or(l, |x| x.1))
        .collect();
    let mut records = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some((head, kind)) = line
            .split_once(" are ")
            .and_then(|(head, rest)| Some((head, rest.split(" in loss record").next()?)))
        else {
            continue;
        };
        let stack = lines[i + 1..]
            .iter()
            .take_while(|l| l.trim_start().starts_with("at ") || l.trim_start().starts_with("by "))
            .copied()
            .collect();
        // "120 (16 direct, 104 indirect) bytes in 1 blocks": the record's own blocks are the
        // direct part; the indirect ones have records of their own.
        let numbers: Vec<u64> = head
            .split(|c: char| !c.is_ascii_digit() && c != ',')
            .filter_map(|w| w.replace(',', "").parse().ok())
            .collect();
        let (bytes, blocks) = match head.contains("direct,") {
            true => (numbers[1], numbers[3]),
            false => (numbers[0], numbers[1]),
        };
        let kind = match kind {
            "definitely lost" => "direct",
            "indirectly lost" => "indirect",
            "still reachable" => "reachable",
            "possibly lost" => "possible", // no class of the tracker's: tests say where they allow it
            other => panic!("valgrind classes a block '{other}':\n{text}"),
        };
        records.push(LossRecord {
            kind,
            bytes,
            blocks,
            stack,
        });
    }
    records
}

/// valgrind's loss records (`--show-leak-kinds=all`) whose stack passes through `file`.
pub fn valgrind_census(plain: &Path, args: &[&str], file: &str) -> (Census, String) {
    let text = valgrind_leak_check(plain, plain.parent().unwrap(), args);
    let mut census = Census::new();
    for record in loss_records(&text) {
        if !record.stack.iter().any(|l| l.contains(file)) {
            continue;
        }
        assert_eq!(record.bytes % record.blocks, 0, "mixed sizes in one record");
        let size = record.bytes / record.blocks;
        *census.entry((record.kind.to_owned(), size)).or_default() += record.blocks;
    }
    (census, text)
}

/// The report's blocks (reachable ones included) whose stack passes through `file`.
pub fn k15_census(run: &Run, file: &str) -> Census {
    let mut census = Census::new();
    for leak in run.leaks() {
        let frames = leak["stack"].as_array().unwrap();
        if frames
            .iter()
            .any(|f| f["file"].as_str().is_some_and(|f| f.ends_with(file)))
        {
            let kind = leak["leak_kind"].as_str().unwrap().to_owned();
            *census
                .entry((kind, leak["size"].as_u64().unwrap()))
                .or_default() += 1;
        }
    }
    census
}

/// A census written out: (leak kind, size, blocks).
pub fn census(pairs: &[(&str, u64, u64)]) -> Census {
    pairs
        .iter()
        .map(|&(kind, size, blocks)| ((kind.to_owned(), size), blocks))
        .collect()
}

/// Runs `tracked mode` (its report named `mode`, with `options`) and checks its census of the
/// blocks whose stacks pass through `file` against `want`, and against valgrind's of
/// `plain mode` (the `-DK15_MEMORY_DISABLED` build of the same program).
pub fn assert_census_as_valgrind(
    (tracked, plain): (&Path, &Path),
    mode: &str,
    options: &str,
    file: &str,
    want: &Census,
) {
    let run = run_with(tracked, mode, options, &[], &[mode]);
    assert!(run.output.status.success(), "{mode}: {}", run.stderr());
    let ours = k15_census(&run, file);
    assert_eq!(&ours, want, "{mode}: we said:\n{}", run.text);
    let (theirs, valgrind_text) = valgrind_census(plain, &[mode], file);
    assert_eq!(
        ours, theirs,
        "{mode}: valgrind said:\n{valgrind_text}\nwe said:\n{}",
        run.text
    );
}

/// The sizes of the blocks valgrind's output says were written 0 bytes past their end, in order,
/// of blocks in `state` (`alloc'd` or `free'd`).
pub fn valgrind_written_just_past(valgrind_output: &str, state: &str) -> Vec<u64> {
    valgrind_output
        .lines()
        .filter_map(|l| {
            l.split_once("is 0 bytes after a block of size ")?
                .1
                .strip_suffix(state)
        })
        .map(|size| size.trim().replace(',', "").parse().unwrap())
        .collect()
}
