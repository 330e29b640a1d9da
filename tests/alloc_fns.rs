//! `alloc_fns=PATTERN[,PATTERN...]` (valgrind's `--alloc-fns`): an engine's own allocation
//! wrappers, out of line or inlined, in a Debug (`-O0`) and a Release (`-O2`) build, leave the
//! top of every stack: in the report, for suppressions and for grouping blocks into sites
//! (`tests/cpp/alloc_fns.cpp`).

mod support;
use serde_json::Value;

const SOURCE: &str = "tests/cpp/alloc_fns.cpp";
const WRAPPERS: &str = "alloc_fns=engine::*AllocateImpl";

/// The leaks of `size` bytes.
fn of_size(run: &support::Run, size: u64) -> Vec<&Value> {
    run.leaks().iter().filter(|l| l["size"] == size).collect()
}

fn first_function(leak: &Value) -> &str {
    leak["stack"][0]["function"].as_str().unwrap_or("")
}

#[test]
fn wrappers_named_in_alloc_fns_leave_the_top_of_every_stack_in_debug_and_release() {
    let dir = support::scratch("alloc_fns");
    let rules = dir.join("wrappers.supp");
    std::fs::write(&rules, "leak:^engine::AllocateImpl\n").unwrap();
    let suppress = format!("suppressions={}", rules.display());
    for build in ["-O0", "-O2"] {
        let exe = support::build(&dir, &format!("alloc_fns{build}"), &[SOURCE], &[build]);

        // Without the option, the wrappers are the first frames (the inlined one too).
        let plain = support::run(&exe, "");
        assert!(plain.output.status.success(), "{}", plain.stderr());
        assert!(first_function(of_size(&plain, 72)[0]).starts_with("engine::AllocateImpl"));
        assert!(first_function(of_size(&plain, 96)[0]).starts_with("engine::InlineAllocateImpl"));
        let hooks = of_size(&plain, 128);
        assert_ne!(hooks[0]["site"], hooks[1]["site"], "{}", plain.text);
        let suppressed = support::run(&exe, &suppress);
        assert_eq!(
            suppressed.json["summary"]["suppressed_blocks"], 2,
            "{}",
            suppressed.text
        );

        let run = support::run(&exe, WRAPPERS);
        assert!(run.output.status.success(), "{build}: {}", run.stderr());
        for (size, function, marker) in [
            (72, "leak_outlined()", "// LEAK outlined"),
            (96, "leak_inlined()", "// LEAK inlined"),
            (128, "leak_through_hooks()", "// LEAK hooks"),
        ] {
            for leak in of_size(&run, size) {
                assert!(
                    first_function(leak).ends_with(function),
                    "{build}: {size} bytes:\n{}",
                    run.text
                );
                assert_eq!(leak["stack"][0]["line"], support::line_of(SOURCE, marker));
            }
        }
        // The hook's two blocks came through different wrappers from one call: one site.
        let hooks = of_size(&run, 128);
        assert_eq!(hooks.len(), 2);
        assert_eq!(hooks[0]["site"], hooks[1]["site"], "{build}:\n{}", run.text);
        assert!(
            run.text
                .contains("Direct leak of 256 bytes in 2 blocks (malloc) allocated from:"),
            "{}",
            run.text
        );
        // A rule on a wrapper's name no longer matches: its frames are gone.
        let both = format!("{WRAPPERS}:{suppress}");
        let suppressed = support::run(&exe, &both);
        assert_eq!(
            suppressed.json["summary"]["suppressed_blocks"], 0,
            "{}",
            suppressed.text
        );
        assert!(!run.text.contains("AllocateImpl"), "{}", run.text);
    }
}
