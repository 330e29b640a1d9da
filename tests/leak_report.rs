//! Reading the report: direct leaks first with what they hold, reachable blocks at the end,
//! `exitcode` counting leaks but not reachable blocks, `leak_kinds=`, `show_reachable=`,
//! `max_leaks=`, suppression files, `ignore_leak` and `ScopedLeakIgnore`.

mod support;
use std::path::PathBuf;

fn program(name: &str) -> PathBuf {
    let dir = support::scratch(name);
    support::build(&dir, "leak_report", &["tests/cpp/leak_report.cpp"], &[])
}

fn sizes_of(run: &support::Run, kind: &str) -> Vec<u64> {
    let mut sizes: Vec<u64> = run
        .leaks()
        .iter()
        .filter(|l| l["leak_kind"] == kind)
        .map(|l| l["size"].as_u64().unwrap())
        .collect();
    sizes.sort();
    sizes
}

#[test]
fn culprits_come_first_with_what_they_hold_and_reachable_blocks_last() {
    let exe = program("leak_report_order");
    let run = support::run(&exe, "");
    assert!(run.output.status.success(), "{}", run.stderr());
    let text = &run.text;
    // The three document roots are the only direct leaks besides the third-party ones and the
    // block allocated after the scope; their children are indirect.
    assert_eq!(sizes_of(&run, "direct"), [77, 79, 80, 80, 80, 97], "{text}");
    assert_eq!(sizes_of(&run, "indirect"), [80; 12], "{text}");
    assert_eq!(sizes_of(&run, "reachable"), [4096], "{text}");
    // Ignored blocks are not listed anywhere, but counted by rule.
    assert!(!run
        .leaks()
        .iter()
        .any(|l| [91, 93, 95].contains(&l["size"].as_u64().unwrap())));
    assert!(
        text.contains("Suppressed: 1 block (91 bytes) by `ignore_leak()`"),
        "{text}"
    );
    assert!(
        text.contains("Suppressed: 2 blocks (188 bytes) by `ScopedLeakIgnore`"),
        "{text}"
    );

    // The first entry is the culprit: the documents' roots, holding their children.
    let first_entry = text.find("leak of").expect(text);
    let roots = text
        .find("Direct leak of 240 bytes in 3 blocks (new) allocated from:")
        .expect(text);
    assert_eq!(first_entry, roots + "Direct ".len(), "{text}");
    let held = text[roots..]
        .find("  and 12 indirect blocks (960 bytes) through them:")
        .expect(text);
    let held_site = text[roots..]
        .find("    Indirect leak of 960 bytes in 12 blocks (new)")
        .expect(text);
    assert!(held < held_site);
    assert!(text[roots..].contains("parse_document()"));
    // Smaller direct leaks follow; the reachable registry (the largest block) comes last of all.
    let third_party = text.find("Direct leak of 79 bytes").expect(text);
    let reachable = text
        .find("Still reachable: 4096 bytes in 1 block from 1 site, not leaks")
        .expect(text);
    assert!(roots < third_party && third_party < reachable, "{text}");
    assert!(
        text[reachable..].contains("4096 bytes in 1 block (new) from main "),
        "{text}"
    );
    assert!(text.contains("Detected 1453 bytes leaked in 18 blocks from 4 allocation sites: 6 direct, 12 indirect."), "{text}");

    let summary = &run.json["summary"];
    assert_eq!(
        (
            summary["direct_blocks"].as_u64(),
            summary["indirect_blocks"].as_u64()
        ),
        (Some(6), Some(12))
    );
    assert_eq!(
        (
            summary["reachable_blocks"].as_u64(),
            summary["reachable_bytes"].as_u64()
        ),
        (Some(1), Some(4096))
    );
    assert_eq!(summary["leaked_blocks"], 18);
    assert_eq!(summary["suppressed_blocks"], 3);
    // Each indirect block names the direct leak holding it.
    let roots: Vec<&serde_json::Value> = run
        .leaks()
        .iter()
        .filter(|l| l["size"] == 80 && l["leak_kind"] == "direct")
        .collect();
    for leak in run.leaks().iter().filter(|l| l["leak_kind"] == "indirect") {
        let holder = &run.raw_json["leaks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["address"] == leak["address"])
            .unwrap()["held_by"];
        assert!(roots.iter().any(|r| r["address"] == *holder), "{leak}");
    }
    assert!(
        run.stderr().contains("k15-memory: 18 leaked blocks (1453 bytes), 1 block still reachable (4096 bytes), 3 blocks suppressed, 1 memory error: see "),
        "{}",
        run.stderr()
    );
}

#[test]
fn show_reachable_zero_and_max_leaks_shorten_the_text() {
    let exe = program("leak_report_short");
    let run = support::run(&exe, "show_reachable=0:max_leaks=2");
    let text = &run.text;
    assert!(
        text.contains(
            "Still reachable: 4096 bytes in 1 block, not leaks (show_reachable=1 lists them)."
        ),
        "{text}"
    );
    assert!(!text.contains("(new) from main"), "{text}");
    assert_eq!(text.matches("Direct leak of").count(), 2, "{text}");
    assert!(text.contains("... and 2 more direct-leak sites, 2 blocks (156 bytes) with what they hold, not listed (max_leaks=2)"), "{text}");
    // The JSON keeps every block.
    assert_eq!(run.leaks().len(), 19);
}

#[test]
fn exitcode_counts_leaks_and_errors_but_not_reachable_or_suppressed_blocks() {
    let exe = program("leak_report_exitcode");
    let dir = exe.parent().unwrap();
    let supp = dir.join("thirdparty.supp");
    std::fs::write(
        &supp,
        "# vendor leaks we cannot fix\nleak:thirdparty_*\n\nleak thirdparty\nbogus:x\ndouble_free:^free_twice\nleak:\n",
    )
    .unwrap();
    let code = |options: &str, arg: &str| {
        let run = support::run_with(&exe, "exitcode", options, &[], &[arg]);
        (run.output.status.code(), run)
    };
    // Third-party leaks only: they fail the run until suppressed.
    assert_eq!(code("exitcode=23", "thirdparty").0, Some(23));
    let supp_option = format!("exitcode=23:suppressions={}", supp.display());
    let (status, run) = code(&supp_option, "thirdparty");
    assert_eq!(status, Some(0), "{}\n{}", run.text, run.stderr());
    assert!(
        run.text
            .contains("Suppressed: 2 blocks (156 bytes) by `leak:thirdparty_*`"),
        "{}",
        run.text
    );
    let rules = run.json["suppressions"].as_array().unwrap();
    assert!(rules
        .iter()
        .any(|r| r["rule"] == "leak:thirdparty_*" && r["blocks"] == 2 && r["bytes"] == 156));
    // Bad lines are warned with their number, once; the good rules still apply.
    let stderr = run.stderr();
    assert!(
        stderr.contains(&format!(
            "{}:4: expected KIND:PATTERN in 'leak thirdparty', line ignored",
            supp.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains(":5: unknown kind 'bogus'"), "{stderr}");
    assert!(stderr.contains(":7: empty pattern"), "{stderr}");
    assert_eq!(stderr.matches(":4: expected").count(), 1, "{stderr}");
    // The reachable registry alone does not fail the run, unless leak_kinds= widens it.
    assert_eq!(
        code(&format!("{supp_option}:leak_kinds=all"), "thirdparty").0,
        Some(23)
    );
    assert_eq!(
        code(&format!("{supp_option}:leak_kinds=reachable"), "thirdparty").0,
        Some(23)
    );

    // The full program: the double free is suppressed by its rule, at the moment it happens
    // too, but the document trees still fail the run.
    let (status, run) = code(&supp_option, "all");
    assert_eq!(status, Some(23));
    assert_eq!(run.errors().len(), 0, "{}", run.text);
    assert!(
        !run.stderr().contains("Memory error: double_free"),
        "{}",
        run.stderr()
    );
    assert!(
        run.text
            .contains("Suppressed: 1 memory error by `double_free:^free_twice`"),
        "{}",
        run.text
    );
    let (_, run) = code("exitcode=23", "all");
    assert_eq!(run.error_kinds(), ["double_free"]);
    assert!(run.stderr().contains("Memory error: double_free"));
}
