//! Large blocks freed and allocated again in turn (levels loaded and unloaded) fault their pages
//! in no more often than under glibc, whose heap keeps them as the tracker keeps their mappings;
//! what is kept stays bounded (twice the largest block freed), a `calloc` over kept pages reads
//! zeros, and a second `free` of a block whose pages were kept is still a double free that
//! names the first (`free_stacks=1`). A program that unmaps, remaps or maps over such pages
//! (live or kept) as if they were its own runs on as under glibc: the calls fail with `EINVAL`.

mod support;

const SOURCE: &str = "tests/cpp/kept_mappings.cpp";

/// The numbers a run printed after `key` (`level N faults F` gives F for `level N faults`).
fn printed(stdout: &str, key: &str) -> i64 {
    stdout
        .lines()
        .find_map(|line| line.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {stdout}"))
}

#[test]
fn levels_of_large_blocks_fault_as_under_glibc_and_kept_pages_stay_bounded_and_checked() {
    let dir = support::scratch("kept_mappings");
    let plain = support::build(&dir, "plain", &[SOURCE], &["-DK15_MEMORY_DISABLED"]);
    let tracked = support::build(&dir, "tracked", &[SOURCE], &["-Wno-use-after-free"]);
    let glibc = std::process::Command::new(&plain)
        .output()
        .expect("the plain program runs");
    let glibc = String::from_utf8_lossy(&glibc.stdout).into_owned();
    let run = support::run(&tracked, "free_stacks=1");
    let stdout = run.stdout();
    assert!(stdout.contains("survived"), "{stdout}\n{}", run.stderr());

    // Each level writes about 6 MiB of fresh blocks. glibc maps the first level's and serves the
    // next ones from its heap (its threshold rose to the largest block freed): the first two
    // levels fault their pages in, the later ones nothing. So do the tracker's kept mappings.
    for level in 0..6 {
        let key = format!("level {level} faults");
        let (tracked_faults, glibc_faults) = (printed(&stdout, &key), printed(&glibc, &key));
        if level == 0 {
            assert!(glibc_faults > 1000, "{glibc}");
        }
        if level >= 2 {
            assert!(
                tracked_faults <= glibc_faults + 16,
                "{key}: {tracked_faults} tracked, {glibc_faults} under glibc\n{stdout}\n{glibc}"
            );
        }
    }

    assert_eq!(printed(&stdout, "calloc nonzero bytes"), 0, "{stdout}");

    // Kept once everything is freed: at most twice the largest block (3,500 KiB), as glibc
    // keeps up to twice its threshold at its heap's top (6,300 KiB here), and a little of the
    // tracker's own.
    let growth = printed(&stdout, "after_kib") - printed(&stdout, "start_kib");
    assert!(
        growth <= 2 * 3500 + 1024,
        "resident after freeing everything: {stdout}\nunder glibc: {glibc}"
    );

    assert_eq!(run.error_kinds(), ["double_free"], "{}", run.text);
    let double_free = &run.errors()[0];
    assert_eq!(double_free["size"], 800 * 1024);
    assert_eq!(
        double_free["free_stack"][0]["line"],
        support::line_of(SOURCE, "SECOND FREE OF A KEPT LARGE BLOCK")
    );
    assert_eq!(
        double_free["previous_free_stack"][0]["line"],
        support::line_of(SOURCE, "FIRST FREE OF A KEPT LARGE BLOCK")
    );
    assert!(run.leaks().is_empty(), "{}", run.text);
}

#[test]
fn unmapping_a_large_blocks_pages_fails_as_under_glibc_and_the_program_runs_on() {
    const PROGRAM: &str = "tests/cpp/unmap_blocks.cpp";
    let dir = support::scratch("unmap_blocks");
    let plain = support::build(&dir, "plain", &[PROGRAM], &["-DK15_MEMORY_DISABLED"]);
    let tracked = support::build(&dir, "tracked", &[PROGRAM], &[]);
    let glibc = std::process::Command::new(&plain)
        .output()
        .expect("the plain program runs");
    assert!(glibc.status.success());
    let glibc = String::from_utf8_lossy(&glibc.stdout).into_owned();
    assert!(glibc.contains("munmap(block) EINVAL"), "{glibc}");
    for round in 0..5 {
        let run = support::run(&tracked, "");
        let stdout = run.stdout();
        // Every call on a live block failed, the program's own ones went through, and no byte
        // of any block changed: the same lines as under glibc.
        assert_eq!(stdout, glibc, "round {round}\n{}", run.stderr());
        let said: Vec<_> = run
            .stderr()
            .lines()
            .filter(|line| line.contains("refused (EINVAL)"))
            .map(str::to_owned)
            .collect();
        assert_eq!(said.len(), 1, "said once: {said:?}");
        assert!(
            said[0].starts_with("k15-memory: munmap of 0x"),
            "{}",
            said[0]
        );
        assert!(
            run.errors().is_empty() && run.leaks().is_empty(),
            "{}",
            run.text
        );
    }
}
