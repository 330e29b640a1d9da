//! Budget mode (`budget=`): blocks are carved from memory taken at start-up; running out is a
//! `budget_exceeded` error and a failed allocation, and the program goes on.

mod support;

#[test]
fn running_out_of_budget_throws_reports_and_recovers() {
    let dir = support::scratch("budget");
    let exe = support::build(&dir, "budget", &["tests/cpp/budget.cpp"], &[]);
    let run = support::run(&exe, "budget=4M");
    let stdout = run.stdout();
    assert!(run.output.status.success(), "{}", run.stderr());
    let blocks: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("bad_alloc after "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    // 4 MiB, half of it for large blocks: about twenty 100 KiB blocks fit, never the whole budget.
    assert!((10..=20).contains(&blocks), "{stdout}");
    assert!(stdout.contains("nothrow: null"), "{stdout}");
    assert!(stdout.contains("after freeing: memory"), "{stdout}");
    assert!(stdout.contains("survived"));

    assert_eq!(
        run.error_kinds(),
        ["budget_exceeded", "budget_exceeded"],
        "{}",
        run.text
    );
    let first = &run.errors()[0];
    assert_eq!(first["size"], 100 * 1024);
    assert_eq!(first["file"], "tests/cpp/budget.cpp");
    assert_eq!(
        first["line"],
        support::line_of("tests/cpp/budget.cpp", "// SPENDS THE BUDGET")
    );
    assert_eq!(
        first["alloc_stack"][0]["function"],
        "(anonymous namespace)::fill_the_budget(std::vector<char*, std::allocator<char*> >&)"
    );
    assert_eq!(run.leaks().len(), 0, "{}", run.text);
    assert!(
        run.stderr().contains("Memory error: budget_exceeded"),
        "{}",
        run.stderr()
    );
}

#[test]
fn pool_classes_size_the_pool_and_leave_the_rest_to_large_blocks() {
    let dir = support::scratch("budget_classes");
    let exe = support::build(&dir, "budget", &["tests/cpp/budget.cpp"], &[]);
    // 512 KiB of 256-byte blocks for the small strings, 1.5 MiB left for 100 KiB blocks.
    let run = support::run(&exe, "budget=2M:pool_classes=256x2048");
    let stdout = run.stdout();
    let blocks: usize = stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("bad_alloc after ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap();
    assert!((10..=15).contains(&blocks), "{stdout}");
    assert!(stdout.contains("survived"), "{stdout}");
}

#[test]
fn a_budget_smaller_than_its_pool_classes_is_refused_with_a_warning() {
    let dir = support::scratch("budget_refused");
    let exe = support::build(&dir, "budget", &["tests/cpp/budget.cpp"], &[]);
    let run = support::run_with(
        &exe,
        "budget",
        "budget=1M:pool_classes=256x8192",
        &[],
        &["small-only"],
    );
    assert!(run.output.status.success());
    assert!(
        run.stderr()
            .contains("pool_classes need more than the budget; running without a budget"),
        "{}",
        run.stderr()
    );
    assert!(run.stdout().contains("small only"));
}

#[test]
fn leaks_in_budget_mode_are_listed_once() {
    let dir = support::scratch("budget_leaks");
    let exe = support::build(&dir, "options", &["tests/cpp/options.cpp"], &[]);
    let run = support::run(&exe, "budget=8M");
    assert_eq!(
        run.leak_set(),
        [(
            20,
            true,
            Some("tests/cpp/options.cpp".to_owned()),
            support::line_of("tests/cpp/options.cpp", "K15_NEW int[5]")
        )]
    );
    assert_eq!(run.leaks()[0]["language"], "c++");
}
