//! A C program, no C++ at all, linked with the library: its `malloc` tracked (`malloc=1`), a
//! Lua-style allocator routed through `k15_memory_alloc` under its own name, and a `free` of
//! such a block reported as a mismatch.

mod support;
use std::process::Command;

const SOURCE: &str = "tests/cpp/c_program.c";

#[test]
fn a_c_program_tracks_malloc_and_its_own_allocator_callbacks() {
    let exe = support::build_c(&support::scratch("c_program"), "c_program", SOURCE, &[]);
    let run = support::run(&exe, "malloc=1");
    let stdout = run.stderr();
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(stdout.contains("aligned: yes"), "{stdout}");
    assert!(stdout.contains("live: 2 blocks, 104 bytes"), "{stdout}");
    let leak = |language: &str| {
        let found: Vec<_> = run
            .leaks()
            .iter()
            .filter(|l| l["language"] == language)
            .collect();
        assert_eq!(found.len(), 1, "{language}: {}", run.text);
        found[0].clone()
    };
    let script = leak("lua");
    assert_eq!(script["size"], 96);
    assert_eq!(script["stack"][0]["function"], "script_alloc");
    assert_eq!(
        script["stack"][1]["line"],
        support::line_of(SOURCE, "/* LEAK lua */")
    );
    let name = leak("c");
    assert_eq!(name["size"], 8);
    assert_eq!(name["stack"][0]["function"], "load_level_name");
    assert_eq!(
        name["stack"][0]["line"],
        support::line_of(SOURCE, "/* LEAK malloc */")
    );
    assert_eq!(run.error_kinds(), ["mismatched_delete"], "{}", run.text);
    assert_eq!(run.errors()[0]["allocated_with"], "k15::memory::allocate");
    assert_eq!(run.errors()[0]["freed_with"], "free");
}

#[test]
fn the_c_header_builds_without_the_library_when_disabled() {
    let dir = support::scratch("c_program_disabled");
    let exe = dir.join("c_program_plain");
    let out = Command::new("gcc")
        .current_dir(support::repo())
        .args([
            "-std=c11",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-DK15_MEMORY_DISABLED",
        ])
        .args(["-I", "include", SOURCE, "-o"])
        .arg(&exe)
        .output()
        .expect("gcc runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("aligned: yes"), "{stderr}");
    assert!(stderr.contains("live: 0 blocks, 0 bytes"), "{stderr}");
}
