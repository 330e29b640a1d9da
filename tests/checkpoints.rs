//! `checkpoint()` and `leaks_since()` over every tracked block, not only the engine allocators'
//! (`tests/cpp/checkpoints.cpp`): what a game allocated with plain `new`, `new[]` and `malloc`
//! (on two threads) after loading its level 2 and still holds after unloading it, exactly.

mod support;

#[test]
fn leaks_since_a_checkpoint_names_what_new_and_malloc_kept_after_it() {
    let dir = support::scratch("checkpoints");
    let exe = support::build(&dir, "checkpoints", &["tests/cpp/checkpoints.cpp"], &[]);
    for options in ["", "stack_depth=0", "malloc=0"] {
        let run = support::run(&exe, options);
        assert!(run.output.status.success(), "{options}: {}", run.stderr());
        let mut rows: Vec<String> = run
            .stdout()
            .lines()
            .filter_map(|line| line.strip_prefix("row "))
            .map(str::to_owned)
            .collect();
        rows.sort();
        // The engine pool's block, the three forgotten meshes and the worker's two arrays,
        // the forgotten script (untracked with malloc=0): nothing from before the checkpoint,
        // nothing freed since.
        let (mut expected, total) = if options == "malloc=0" {
            (vec!["level pool 1 48", "new[] 5 3128"], "total 6 3176")
        } else {
            (
                vec!["level pool 1 48", "malloc 1 200", "new[] 5 3128"],
                "total 7 3376",
            )
        };
        expected.sort();
        assert_eq!(rows, expected, "{options}: {}", run.stdout());
        assert!(run.stdout().contains(total), "{options}: {}", run.stdout());
    }
}
