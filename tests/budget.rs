//! Budget mode (`budget=`): the program's bytes are counted against the budget, whatever their
//! sizes; running out is a `budget_exceeded` error and a failed allocation, and the program goes
//! on.

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
    // 4 MiB less 1,000 small strings (112 KiB) and the vector (8 KiB): 38 blocks of 100 KiB.
    assert_eq!(blocks, 38, "{stdout}");
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

/// Blocks of one size (or a mix, 16 B to 4 KiB) until the budget refuses: the share of the
/// budget they hold (`benches/programs/memory_back.cpp fill`), the same again after another
/// thread freed them.
fn fill_fraction(exe: &std::path::Path, size: &str) -> f64 {
    let budget = 4 << 20;
    let run = support::run_with(
        exe,
        &format!("fill_{size}"),
        &format!("budget={budget}:report=0"),
        &[],
        &["fill", size, &budget.to_string()],
    );
    let stdout = run.stdout();
    let fraction = |key: &str| -> f64 {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key)?.parse().ok())
            .unwrap_or_else(|| panic!("{stdout}"))
    };
    let (fill, refill) = (fraction("fill "), fraction("refill "));
    // Freed on another thread, the blocks gave their bytes back before their lists settled.
    assert!(refill >= fill - 0.01, "{stdout}");
    fill
}

#[test]
fn blocks_of_any_size_fill_most_of_the_budget() {
    let dir = support::scratch("budget_fill");
    let exe = support::build(&dir, "fill", &["benches/programs/memory_back.cpp"], &[]);
    for size in ["16", "64", "200", "4096", "0"] {
        let fill = fill_fraction(&exe, size);
        assert!(
            fill >= 0.9,
            "blocks of {size} bytes filled {fill} of the budget"
        );
    }
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
