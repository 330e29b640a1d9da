//! The engine allocators through `include/k15/engine.h`: leaks under the allocator's name with the user's stack, lookups, bad frees, threads, steady state.

mod support;

use support::{build, line_of, run_with, scratch, Run};

const SOURCE: &str = "tests/cpp/engine_face.cpp";

fn run_mode(mode: &str) -> Run {
    let dir = scratch(&format!("engine_{mode}"));
    let exe = build(&dir, "engine_face", &[SOURCE], &[]);
    let run = run_with(&exe, mode, "", &[], &[mode]);
    assert!(
        run.output.status.success(),
        "{mode} failed:\n{}{}",
        run.stdout(),
        run.stderr()
    );
    run
}

#[test]
fn leaks_of_every_allocator_carry_its_name_and_the_users_stack() {
    let run = run_mode("leaks");
    let mut leaks: Vec<(String, u64, String, u64)> = run
        .leaks()
        .iter()
        .map(|leak| {
            let top = &leak["stack"][0];
            (
                leak["language"].as_str().unwrap().to_owned(),
                leak["size"].as_u64().unwrap(),
                top["function"].as_str().unwrap_or("").to_owned(),
                top["line"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    leaks.sort();
    let at = |marker| line_of(SOURCE, marker);
    let expected = [
        ("arena", 300, "leak_from_block", at("// block leak")),
        ("frame", 24, "leak_from_stack", at("// stack leak")),
        ("game::Particle", 16, "leak_from_typed", at("// typed leak")),
        ("pool", 40, "leak_from_pool", at("// pool leak")),
        ("temporary", 72, "leak_from_dropped", at("// retired leak")),
    ];
    assert_eq!(leaks.len(), expected.len(), "{}", run.text);
    for (leak, (language, size, function, line)) in leaks.iter().zip(expected) {
        assert_eq!((leak.0.as_str(), leak.1), (language, size));
        assert!(leak.2.starts_with(function), "{leak:?}");
        assert_eq!(leak.3, line, "{leak:?}");
    }
    assert_eq!(run.json["summary"]["leaked_blocks"], 5);
    assert!(
        run.text
            .contains("Direct leak of 40 bytes in 1 block (pool)"),
        "{}",
        run.text
    );
}

#[test]
fn allocator_of_and_type_of_name_every_allocator() {
    let run = run_mode("lookups");
    assert_eq!(
        run.stdout(),
        "pool 1 -\nframe 2 -\narena 3 -\nparticles 4 game::Particle\nunknown 0 -\n"
    );
    assert!(run.leaks().is_empty());
}

#[test]
fn bad_frees_of_every_kind_are_reported_and_survived() {
    let run = run_mode("bad_frees");
    assert!(run.stdout().contains("survived"));
    let errors: Vec<(String, String, String, String)> = run
        .errors()
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["allocator"].as_str().unwrap().to_owned(),
                e["detail"].as_str().unwrap().to_owned(),
                e["free_stack"][0]["function"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            )
        })
        .collect();
    let expected = [
        (
            "invalid_free",
            "pool",
            "pointer not owned by this allocator",
        ),
        ("invalid_free", "arena", "pointer inside a block"),
        (
            "invalid_free",
            "frame",
            "stack block freed out of LIFO order",
        ),
        (
            "invalid_free",
            "particles",
            "pointer not owned by this allocator",
        ),
        ("double_free", "pool", "block already freed"),
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:?}");
    for (error, (kind, allocator, detail)) in errors.iter().zip(expected) {
        assert_eq!((error.0.as_str(), error.1.as_str()), (kind, allocator));
        assert!(error.2.starts_with(detail), "{error:?}");
        assert!(error.3.starts_with("bad_frees"), "{error:?}");
    }
    assert_eq!(run.stderr().matches("Memory error").count(), 5);
    assert!(run.leaks().is_empty());
}

#[test]
fn two_threads_free_each_others_pool_blocks_with_exact_counts() {
    let run = run_mode("threads");
    assert!(run
        .stdout()
        .contains("allocations 40000 frees 40000 live 0 failures 0"));
}

#[test]
fn a_frame_loop_that_allocates_nothing_reads_zero_and_checkpoints_count_later_leaks() {
    let run = run_mode("steady");
    assert!(run.leaks().is_empty(), "{}", run.text);
}

#[test]
fn a_sanitizer_build_of_engine_code_builds_and_runs_clean() {
    let dir = support::scratch("engine_sanitized");
    let exe = support::build(
        &dir,
        "sanitized",
        &["tests/cpp/engine_sanitized.cpp"],
        &["-fsanitize=address"],
    );
    let run = support::run(&exe, "");
    assert!(run.output.status.success(), "{}", run.stderr());
    assert_eq!(run.stdout().trim(), "ok 5 unknown unknown");
    assert!(run.json.is_null(), "k15-memory is off in a sanitizer build");
    assert!(
        !run.stderr().contains("ERROR: AddressSanitizer")
            && !run.stderr().contains("LeakSanitizer"),
        "{}",
        run.stderr()
    );
}
