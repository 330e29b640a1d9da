//! A program that runs out of memory under an address-space limit (`ulimit -v`) and goes on:
//! `malloc` and `calloc` return null and `new` throws, as under glibc, and the memory it frees
//! afterwards is address space again, for its own mappings, its threads and the tracker's report.

mod support;

/// Before, the first storm that filled the heap's reservation hung (the own heap asked the OS
/// for ever for a chunk it could not have); past that, a null block was freed (a crash), and
/// once blocks beyond the heap came from the own heap, whose chunks are never unmapped, the
/// address space stayed full: a 64 MiB buffer, a thread's stack and the report's own memory
/// were refused (Rust aborted the process at exit).
#[test]
fn a_program_that_runs_out_of_address_space_on_threads_goes_on_and_its_leaks_are_reported() {
    let dir = support::scratch("out_of_memory");
    let source = "tests/cpp/out_of_memory.cpp";
    let exe = support::build(&dir, "out_of_memory", &[source], &["-std=c++20"]);
    let leak_line = support::line_of(source, "// LEAK");
    let wrapper = support::under_ulimit(&exe, "out_of_memory_limited", "-v");
    // Limits under which the program also runs under glibc (8 threads need its arenas' room).
    for (kib, threads) in [("600000", "1"), ("600000", "4"), ("1048576", "8")] {
        let what = format!("{kib} KiB, {threads} threads");
        let run = support::run_with(&wrapper, "out_of_memory", "", &[], &[kib, threads]);
        let stdout = run.stdout();
        assert!(
            run.output.status.success(),
            "{what}: {:?}\n{stdout}\n{}",
            run.output.status,
            run.stderr()
        );
        for line in [
            "every storm ran out",
            "a thread started",
            "a large buffer given",
        ] {
            assert!(stdout.contains(line), "{what}: {stdout}");
        }
        assert!(run.error_kinds().is_empty(), "{what}: {}", run.text);
        let leaks: Vec<(u64, u64)> = run
            .leaks()
            .iter()
            .map(|leak| {
                let line = leak["stack"][0]["line"].as_u64();
                (leak["size"].as_u64().unwrap(), line.unwrap_or(0))
            })
            .collect();
        assert_eq!(leaks.len(), 1000, "{what}: {}", run.text);
        assert!(
            leaks.iter().all(|&leak| leak == (40, leak_line)),
            "{what}: {}",
            run.text
        );
    }
}
