//! The C family (`malloc=1`): leaks through every function with exact sizes, kinds and stacks,
//! realloc chains, mismatches across families, foreign pointers, threads and a shared library,
//! the tracker's own memory kept out, and valgrind agreeing on a malloc-heavy program.

mod support;
use serde_json::Value;
use std::path::PathBuf;

const SOURCE: &str = "tests/cpp/malloc_family.cpp";

fn program(test: &str) -> PathBuf {
    let dir = support::scratch(&format!("malloc_{test}"));
    let dso = support::build_shared(&dir, "malloc_dso", &["tests/cpp/malloc_dso.cpp"], &[]);
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    support::build(
        &dir,
        "malloc_family",
        &[SOURCE, dso.to_str().unwrap()],
        &[
            &rpath,
            "-Wno-mismatched-new-delete",
            "-Wno-free-nonheap-object",
            "-Wno-use-after-free",
        ],
    )
}

fn run(test: &str, options: &str) -> support::Run {
    support::run_surviving(&program(test), test, options, &[], &[test])
}

fn functions(stack: &Value) -> Vec<String> {
    stack
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["function"].as_str().unwrap_or("??").to_owned())
        .collect()
}

/// Whether a symbolized frame is `function` of the program (in its anonymous namespace).
fn names(frame: &str, function: &str) -> bool {
    frame.contains(&format!("::{function}(")) || frame.starts_with(&format!("{function}("))
}

/// The leak whose stack passes through `function` (a function of the test program).
fn leak_from<'a>(run: &'a support::Run, function: &str) -> &'a Value {
    let found: Vec<&Value> = run
        .leaks()
        .iter()
        .filter(|l| functions(&l["stack"]).iter().any(|f| names(f, function)))
        .collect();
    assert_eq!(found.len(), 1, "one leak from {function}:\n{}", run.text);
    found[0]
}

#[test]
fn each_function_of_the_family_leaks_with_its_size_kind_and_stack() {
    let run = run("leaks", "malloc=1");
    let stdout = run.stdout();
    assert!(
        stdout.contains("realloc chain: 1 block, 24 bytes, freed by realloc 0: yes"),
        "{stdout}"
    );
    assert!(stdout.contains("usable: 24 0 4096"), "{stdout}");
    assert!(stdout.contains("aligned: yes"), "{stdout}");
    assert!(
        !stdout.contains("not zeroed") && !stdout.contains("lost the bytes"),
        "{stdout}"
    );
    // (function of the program, size, allocating function, called directly)
    let expected = [
        ("leak_malloc", 11, "malloc", true),
        ("leak_calloc", 21, "calloc", true),
        ("leak_realloc", 13, "realloc", true),
        ("leak_reallocarray", 40, "realloc", true),
        ("leak_aligned_alloc", 192, "aligned_alloc", true),
        ("leak_posix_memalign", 33, "posix_memalign", true),
        ("leak_memalign", 45, "memalign", true),
        ("leak_valloc", 57, "valloc", true),
        ("leak_pvalloc", 4096, "pvalloc", true),
        ("realloc_chain", 24, "realloc", true),
        ("leak_strdup", 12, "malloc", false),
        ("leak_asprintf", 12, "malloc", false),
    ];
    for (function, size, allocated_with, direct) in expected {
        let leak = leak_from(&run, function);
        assert_eq!(leak["size"], size, "{function}: {leak}");
        assert_eq!(leak["allocated_with"], allocated_with, "{function}: {leak}");
        assert_eq!(leak["language"], "c", "{function}: {leak}");
        assert_eq!(leak["array"], false);
        let stack = functions(&leak["stack"]);
        if direct {
            assert!(names(&stack[0], function), "{function}: {stack:?}");
        } else {
            // glibc's function allocates (#0), the program's called it (#1 or further down).
            assert!(!names(&stack[0], function), "{function}: {stack:?}");
        }
        assert!(
            run.text
                .contains(&format!("{size} bytes in 1 block ({allocated_with})")),
            "{}",
            run.text
        );
    }
    let getline = leak_from(&run, "leak_getline");
    assert_eq!(getline["allocated_with"], "malloc");
    // Nothing but the program's calls went wrong: the tracker's own memory made no errors.
    assert_eq!(run.json["summary"]["errors"], 0, "{}", run.text);
}

#[test]
fn free_realloc_and_delete_across_families_are_mismatches_and_release_the_block() {
    let run = run("mismatches", "malloc=1");
    assert!(run.stdout().contains("released: yes"), "{}", run.stdout());
    assert_eq!(run.error_kinds(), ["mismatched_delete"; 4], "{}", run.text);
    let errors = run.errors();
    let pairs: Vec<(&str, &str, u64)> = errors
        .iter()
        .map(|e| {
            (
                e["allocated_with"].as_str().unwrap(),
                e["freed_with"].as_str().unwrap(),
                e["size"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        pairs,
        [
            ("new", "free", 4),
            ("new[]", "realloc", 16),
            ("malloc", "delete", 4),
            ("malloc", "delete[]", 32)
        ]
    );
    // Both stacks: where the block came from, and the line that released it wrongly.
    let markers = [
        "// FREE new",
        "// REALLOC new[]",
        "// DELETE malloc",
        "// DELETE[] malloc",
    ];
    for (error, marker) in errors.iter().zip(markers) {
        let allocated = functions(&error["alloc_stack"]);
        assert!(allocated[0].contains("::make_"), "{allocated:?}");
        let freed = &error["free_stack"][0];
        assert!(
            names(freed["function"].as_str().unwrap(), "mismatches"),
            "{error}"
        );
        assert_eq!(freed["line"], support::line_of(SOURCE, marker), "{error}");
    }
    // The realloc'd block lives on as the program's (a realloc block, 100 bytes).
    let moved: Vec<&Value> = run
        .leaks()
        .iter()
        .filter(|l| l["allocated_with"] == "realloc")
        .collect();
    assert_eq!(moved.len(), 1, "{}", run.text);
    assert_eq!(moved[0]["size"], 100);
    assert!(names(&functions(&moved[0]["stack"])[0], "mismatches"));
    assert!(
        run.text
            .contains("4 bytes allocated with malloc, released with delete (the block was freed)"),
        "{}",
        run.text
    );
}

#[test]
fn with_tracking_off_free_and_realloc_of_new_blocks_are_still_mismatches() {
    let run = run("mismatches", "malloc=0");
    // glibc's blocks given to delete cannot be told from stray pointers: reported, left alone.
    assert_eq!(
        run.error_kinds(),
        [
            "mismatched_delete",
            "mismatched_delete",
            "invalid_free",
            "invalid_free"
        ],
        "{}",
        run.text
    );
    assert_eq!(run.errors()[0]["freed_with"], "free");
    assert_eq!(run.errors()[1]["freed_with"], "realloc");
    assert_eq!(run.errors()[2]["freed_with"], "delete");
}

#[test]
fn foreign_pointers_are_reported_with_tracking_on_and_never_given_to_the_wrong_allocator() {
    let run = run("foreign", "malloc=1");
    let stdout = run.stdout();
    assert!(
        stdout.contains("realloc of a stack pointer: null"),
        "{stdout}"
    );
    assert!(stdout.contains("glibc usable: 0"), "{stdout}");
    assert_eq!(
        run.error_kinds(),
        [
            "invalid_free",
            "invalid_free",
            "invalid_free",
            "invalid_free",
            "invalid_free",
            "double_free"
        ],
        "{}",
        run.text
    );
    assert_freed_at(
        &run,
        &[
            "// FREE glibc",
            "// FREE mmap",
            "// FREE stack",
            "// FREE near null",
            "// REALLOC stack",
            "// FREE twice",
        ],
    );
    assert_eq!(run.errors()[4]["freed_with"], "realloc");
    assert_eq!(run.errors()[5]["size"], 40);
}

#[test]
fn with_tracking_off_glibc_blocks_go_back_to_glibc_and_only_bad_pointers_are_reported() {
    let run = run("foreign_to_glibc", "malloc=0");
    // 104 or more
    assert!(run.stdout().contains("glibc usable: 1"), "{}", run.stdout());
    // glibc's block went back to glibc; only the pointers glibc never handed out are reported.
    assert_eq!(
        run.error_kinds(),
        [
            "invalid_free",
            "invalid_free",
            "invalid_free",
            "invalid_free"
        ],
        "{}",
        run.text
    );
    assert_freed_at(
        &run,
        &[
            "// FREE mmap",
            "// FREE stack",
            "// FREE near null",
            "// REALLOC stack",
        ],
    );
    assert_eq!(run.json["summary"]["leaked_blocks"], 0, "{}", run.text);
}

#[test]
fn blocks_from_a_thread_and_from_a_shared_library_are_tracked() {
    let run = run("threads", "malloc=1");
    assert!(
        run.stdout().contains("own stack known: yes"),
        "{}",
        run.stdout()
    );
    let from_thread = run
        .leaks()
        .iter()
        .find(|l| l["size"] == 333)
        .expect("the thread's leak");
    assert_eq!(
        from_thread["thread"], 3,
        "after main and the first thread: {from_thread}"
    );
    assert!(names(&functions(&from_thread["stack"])[0], "make_buffer"));
    let from_dso = run
        .leaks()
        .iter()
        .find(|l| l["size"] == 444)
        .expect("the DSO's leak");
    assert_eq!(functions(&from_dso["stack"])[0], "dso_make_buffer");
    assert!(from_dso["stack"][0]["file"]
        .as_str()
        .unwrap()
        .ends_with("tests/cpp/malloc_dso.cpp"));
    assert!(
        run.leaks().iter().all(|l| l["size"] != 300),
        "freed on another thread"
    );
    assert_eq!(run.json["summary"]["errors"], 0, "{}", run.text);
}

#[test]
fn the_trackers_own_memory_never_comes_back_through_the_family() {
    for unwinder in ["dwarf", "frame_pointer"] {
        let run = run("reentrancy", &format!("malloc=1:unwinder={unwinder}"));
        assert!(
            run.stdout().contains("allocations: 80, frees: 80"),
            "{unwinder}: {}",
            run.stdout()
        );
        assert_eq!(run.json["summary"]["errors"], 0, "{}", run.text);
    }
}

/// pvalloc of a size within a page of `SIZE_MAX` rounded it up to 0 and served a block.
#[test]
fn sizes_beyond_the_address_space_are_refused_by_every_function_with_enomem() {
    for options in ["malloc=1", "malloc=0"] {
        let run = run("huge_sizes", options);
        assert!(
            run.stdout()
                .contains("huge sizes served: 0, other errno: 0, counts unchanged: yes"),
            "{options}: {}",
            run.stdout()
        );
        assert_eq!(run.json["summary"]["errors"], 0, "{options}: {}", run.text);
    }
}

#[test]
fn malloc_0_leaves_the_family_to_glibc() {
    let run = run("leaks", "malloc=0");
    assert!(run.stdout().contains("aligned: yes"), "{}", run.stdout());
    assert!(
        run.stdout().contains("realloc chain: 0 block, 0 bytes"),
        "{}",
        run.stdout()
    );
    // Nothing was tracked: no leak, no error, but the report is written all the same (issue 38:
    // every process writes its report and its stderr line, `malloc=0` or not).
    assert_eq!(run.json["summary"]["leaked_blocks"], 0, "{}", run.text);
    assert_eq!(run.json["summary"]["total_allocations"], 0, "{}", run.text);
    assert!(run.text.contains("No leaks"), "{}", run.text);
}

#[test]
fn the_runtimes_caches_are_freed_before_the_report_so_a_clean_program_shows_no_leak() {
    let dir = support::scratch("malloc_runtime_caches");
    let exe = support::build(
        &dir,
        "runtime_caches",
        &["tests/cpp/runtime_caches.cpp"],
        &[],
    );
    let clean = support::run_with(&exe, "clean", "malloc=1", &[], &[]);
    assert!(clean.output.status.success(), "{}", clean.stderr());
    assert!(clean.stdout().ends_with("done"), "{}", clean.stdout());
    assert!(
        clean.stdout().contains("caught 12 3.25 1"),
        "{}",
        clean.stdout()
    );
    assert!(clean.json["summary"]["total_allocations"].as_u64().unwrap() > 100);
    assert_eq!(clean.json["summary"]["leaked_blocks"], 0, "{}", clean.text);
    assert_eq!(clean.json["summary"]["errors"], 0, "{}", clean.text);
    // A thread still running at exit may be using the caches: they are left, and reported.
    let busy = support::run_with(&exe, "busy", "malloc=1", &[], &["busy"]);
    assert!(busy.output.status.success(), "{}", busy.stderr());
    assert!(busy.stdout().ends_with("done"), "{}", busy.stdout());
    let stdout_buffer = busy.leaks().iter().find(|l| {
        l["stack"]
            .as_array()
            .is_some_and(|s| s.iter().any(|f| f["function"] == "_IO_file_doallocate"))
    });
    // Kept by stdout's FILE, a global: reachable, not lost.
    let stdout_buffer = stdout_buffer.unwrap_or_else(|| panic!("{}", busy.text));
    assert_eq!(stdout_buffer["leak_kind"], "reachable", "{}", busy.text);
    assert_eq!(busy.json["summary"]["errors"], 0, "{}", busy.text);
}

#[test]
fn the_samples_show_only_their_own_leaks_with_malloc_on() {
    let dir = support::scratch("malloc_samples");
    let engine = support::build(&dir, "engine", &support::ENGINE_SAMPLE, &[]);
    let run = support::run(&engine, "malloc=1");
    assert_eq!(
        (
            &run.json["summary"]["leaked_blocks"],
            &run.json["summary"]["leaked_bytes"]
        ),
        (&Value::from(3), &Value::from(1336)),
        "{}",
        run.text
    );
    let bullet = support::build(
        &dir,
        "bullet",
        &[
            "samples/bullet/main.cpp",
            "-lBulletDynamics",
            "-lBulletCollision",
            "-lLinearMath",
        ],
        &["-I", "/usr/include/bullet"],
    );
    let run = support::run(&bullet, "malloc=1");
    assert_eq!(run.leaks().len(), 1, "{}", run.text);
    assert_eq!(run.leaks()[0]["language"], "bullet");
}

/// valgrind's "definitely lost" blocks of the -DK15_MEMORY_DISABLED build, and ours.
#[test]
fn valgrind_agrees_on_a_malloc_heavy_program() {
    let dir = support::scratch("malloc_valgrind");
    let source = "tests/cpp/malloc_heavy.cpp";
    let tracked = support::build(&dir, "heavy", &[source], &[]);
    let plain = support::build(&dir, "heavy_plain", &[source], &["-DK15_MEMORY_DISABLED"]);
    let ours = support::run(&tracked, "malloc=1");
    assert!(ours.output.status.success(), "{}", ours.stderr());
    // Every leak is the program's: the runtimes' caches were freed before the report.
    let program_leaks = ours.leaks();
    let bytes: u64 = program_leaks
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .sum();
    let text = support::valgrind_leak_check(&plain, &dir, &[]);
    let lost = support::valgrind_lost(&text);
    assert_eq!(
        lost,
        (program_leaks.len() as u64, bytes),
        "valgrind said:\n{text}\nwe said:\n{}",
        ours.text
    );
    assert!(lost.0 >= 100, "{text}");
}

/// Each error's free stack starts at the line of `SOURCE` holding the marker, in order.
fn assert_freed_at(run: &support::Run, markers: &[&str]) {
    let lines: Vec<u64> = run
        .errors()
        .iter()
        .map(|e| e["free_stack"][0]["line"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = markers
        .iter()
        .map(|m| support::line_of(SOURCE, m))
        .collect();
    assert_eq!(lines, expected, "{}", run.text);
}
