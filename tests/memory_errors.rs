//! Each kind of bad free is reported with the right kind, and the program goes on with its
//! counts untouched; `halt_on_error` and `exitcode` turn errors into a failing process.

mod support;
use std::os::unix::process::ExitStatusExt;

fn program() -> std::path::PathBuf {
    let dir = support::scratch(&format!("memory_errors_{:?}", std::thread::current().id()));
    support::build(
        &dir,
        "memory_errors",
        &["tests/cpp/memory_errors.cpp"],
        &[
            "-Wno-mismatched-new-delete",
            "-Wno-free-nonheap-object",
            "-Wno-use-after-free",
        ],
    )
}

#[test]
fn every_bad_free_is_reported_and_survived() {
    // malloc=0: the program's malloc block is glibc's, so its delete is a stray pointer.
    let run = support::run(&program(), "malloc=0");
    let stdout = run.stdout();
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(stdout.contains("mismatch freed: yes"), "{stdout}");
    assert!(stdout.contains("counts unchanged: yes"), "{stdout}");
    assert!(stdout.contains("survived"), "{stdout}");
    assert_eq!(
        run.error_kinds(),
        [
            "mismatched_delete",
            "mismatched_delete",
            "double_free",
            "double_free",
            "double_free",
            "invalid_free",
            "invalid_free",
            "invalid_free",
            "invalid_free"
        ],
        "{}",
        run.text
    );
    let errors = run.errors();
    let source = "tests/cpp/memory_errors.cpp";
    assert_eq!(errors[0]["size"], 16);
    assert_eq!(errors[0]["allocated_with"], "new[]");
    assert_eq!(errors[0]["freed_with"], "delete");
    assert_eq!(errors[0]["file"], source);
    assert_eq!(
        errors[0]["line"],
        support::line_of(source, "// ALLOC array")
    );
    assert_eq!(errors[1]["allocated_with"], "new");
    assert_eq!(errors[1]["freed_with"], "delete[]");
    assert_eq!(errors[2]["size"], 4);
    assert_eq!(errors[3]["size"], 1 << 20);
    assert_eq!(errors[4]["size"], 64);
    // Every error carries the stack of the bad free; those of known blocks also the allocation's.
    let first_function =
        |stack: &serde_json::Value| stack[0]["function"].as_str().unwrap_or("").to_owned();
    for error in &errors[2..] {
        assert_eq!(first_function(&error["free_stack"]), "main", "{error}");
    }
    assert_eq!(
        first_function(&errors[2]["alloc_stack"]),
        "main",
        "the small block's allocation"
    );
    assert!(
        errors[5]["alloc_stack"].as_array().unwrap().is_empty(),
        "a foreign pointer has no allocation"
    );
    // Each error was printed on stderr when it happened, and no leak is left.
    assert_eq!(
        run.stderr().matches("k15-memory: Memory error:").count(),
        9,
        "{}",
        run.stderr()
    );
    assert_eq!(run.leaks().len(), 0, "{}", run.text);
    assert_eq!(run.json["summary"]["errors"], 9);
}

#[test]
fn halt_on_error_aborts_at_the_first_error() {
    let run = support::run(&program(), "halt_on_error=1");
    assert_eq!(
        run.output.status.signal(),
        Some(libc_sigabrt()),
        "{:?}",
        run.output.status
    );
    let stderr = run.stderr();
    assert_eq!(stderr.matches("Memory error:").count(), 1, "{stderr}");
    assert!(stderr.contains("mismatched_delete"), "{stderr}");
    assert!(!run.stdout().contains("survived"));
}

#[test]
fn exitcode_fails_the_process_when_errors_were_found() {
    let run = support::run(&program(), "exitcode=23");
    assert_eq!(run.output.status.code(), Some(23));
    assert!(run.stdout().contains("survived"));
}

#[test]
fn a_second_delete_of_any_size_is_reported_even_after_glibc_would_have_trimmed_its_memory() {
    let dir = support::scratch("double_free_sizes");
    let exe = support::build(
        &dir,
        "double_free_sizes",
        &["tests/cpp/double_free_sizes.cpp"],
        &["-Wno-use-after-free"],
    );
    let run = support::run(&exe, "stack_depth=0");
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(run.stdout().contains("done"), "{}", run.stdout());
    // Per size: the plain block, then the 64-byte-aligned array (its size rounded up to lines).
    let sizes: Vec<u64> = run
        .errors()
        .iter()
        .map(|e| e["size"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = [16u64, 1000, 40000, 100000, 131000, 200000, 1 << 20]
        .iter()
        .flat_map(|&size| [size, (size / 64 + 1) * 64])
        .collect();
    assert_eq!(sizes, expected, "{}", run.stderr());
    assert!(run.error_kinds().iter().all(|kind| kind == "double_free"));
    assert_eq!(run.leaks().len(), 0, "{}", run.text);
}

fn libc_sigabrt() -> i32 {
    6
}

#[test]
fn a_program_that_goes_on_after_an_error_does_not_keep_the_debug_info_read_to_print_it() {
    let dir = support::scratch("memory_errors_resident");
    let exe = support::build(
        &dir,
        "error_memory",
        &["tests/cpp/error_memory.cpp"],
        &["-O1"],
    );
    // The frames below `main` are printed too, so that libc's debug file is read.
    let run = support::run(&exe, "report=0:show_below_main=1");
    assert!(run.stderr().contains("double_free"), "{}", run.stderr());
    assert!(run.stderr().contains("__libc_start"), "{}", run.stderr());
    let stdout = run.stdout();
    let numbers: Vec<i64> = stdout
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    let [before, after] = numbers[..] else {
        panic!("{stdout}")
    };
    // Printing the error reads the program's and libc's debug info (libc's compressed debug
    // file decompressed whole once kept 11 MiB resident for the rest of the run); it is
    // released once the error is printed.
    assert!(
        after - before < 4 * 1024,
        "resident memory grew {} KiB with one error printed",
        after - before
    );
}

#[test]
fn thousands_of_live_large_blocks_are_resized_freed_and_their_second_frees_named() {
    let dir = support::scratch("large_blocks_many");
    let exe = support::build(
        &dir,
        "large_blocks_many",
        &["tests/cpp/large_blocks_many.cpp"],
        &["-Wno-use-after-free"],
    );
    let run = support::run(&exe, "stack_depth=4");
    let stdout = run.stdout();
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(stdout.contains("checked 14000 wrong 0"), "{stdout}");
    let printed = |what: &str| -> Vec<u64> {
        let mut sizes: Vec<u64> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix(what)?.trim().parse().ok())
            .collect();
        sizes.sort_unstable();
        sizes
    };
    let mut named: Vec<u64> = run
        .errors()
        .iter()
        .map(|e| e["size"].as_u64().unwrap())
        .collect();
    named.sort_unstable();
    assert_eq!(named, printed("twice "), "{}", run.text);
    assert!(run.error_kinds().iter().all(|kind| kind == "double_free"));
    assert_eq!(run.leaks().len(), 0, "{}", run.text);
}
