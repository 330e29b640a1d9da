//! Under `quarantine=`, a write just past the end of a freed block (into the guard bytes its size
//! class leaves, or into the next block's header where it leaves none) is an `overrun` of that
//! freed block, with its allocation and free stacks, as valgrind's "0 bytes after a block of size
//! N free'd".

mod support;

use std::process::Command;

const SOURCE: &str = "tests/cpp/quarantine_tail.cpp";

#[test]
fn writes_past_the_end_of_freed_blocks_are_overruns_with_both_stacks() {
    let dir = support::scratch("quarantine_tail");
    let tracked = support::build(&dir, "quarantine_tail", &[SOURCE], &[]);
    let run = support::run_with(
        &tracked,
        "quarantine_tail",
        "malloc=0:quarantine=4M",
        &[],
        &[],
    );
    let stdout = run.stdout();
    assert!(run.output.status.success(), "{stdout}{}", run.stderr());
    assert!(stdout.contains("last line"), "{stdout}");
    let freed: Vec<(u64, String)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("freed "))
        .map(|l| {
            let (size, address) = l.split_once(' ').unwrap();
            (size.parse().unwrap(), address.to_owned())
        })
        .collect();
    assert_eq!(freed.len(), 9, "{stdout}");
    assert!(
        stdout.contains(&format!("check_heap: {}\n", freed.len())),
        "{stdout}"
    );

    let errors = run.errors();
    assert_eq!(errors.len(), freed.len(), "{}", run.text);
    for ((size, address), byte) in freed.iter().zip(b'A'..) {
        let error = errors
            .iter()
            .find(|e| e["address"] == address.as_str())
            .unwrap_or_else(|| panic!("{size} bytes at {address}: not named\n{}", run.text));
        assert_eq!(error["kind"], "overrun", "{error}");
        assert_eq!(error["size"], *size, "{error}");
        assert_eq!(error["offset"], *size, "{error}");
        assert_eq!(error["bytes"], format!("{byte:02x}"), "{error}");
        assert_eq!(
            error["alloc_stack"][0]["line"],
            support::line_of(SOURCE, "// ALLOC tail"),
            "{error}"
        );
        let freed_by = error["previous_free_stack"][0]["function"]
            .as_str()
            .unwrap_or_default();
        assert!(freed_by.contains("release"), "{error}");
    }
    assert!(run.text.contains("freed from:"), "{}", run.text);

    // Once repaired, each is reported once: the report's own check at exit finds nothing more.
    assert_eq!(run.leaks().len(), 0, "{}", run.text);

    // valgrind names the same blocks, each written 0 bytes after its end, after its free.
    let plain = support::build(
        &dir,
        "quarantine_tail_plain",
        &[SOURCE],
        &["-DK15_MEMORY_DISABLED"],
    );
    let out = Command::new("valgrind")
        .arg(&plain)
        .output()
        .expect("valgrind is installed (.ci/run installs it)");
    let text = String::from_utf8_lossy(&out.stderr);
    let named = support::valgrind_written_just_past(&text, "free'd");
    let sizes: Vec<u64> = freed.iter().map(|(size, _)| *size).collect();
    assert_eq!(named, sizes, "{text}");
}

#[test]
fn writes_after_free_name_the_free_of_every_kind_of_block_held() {
    let source = "tests/cpp/quarantine_aligned.cpp";
    let dir = support::scratch("quarantine_aligned");
    let exe = support::build(&dir, "quarantine_aligned", &[source], &[]);
    // 16: a block of the heap; 128 and up: of the aligned blocks' own placement.
    for options in ["quarantine=4M", "quarantine=4M:stack_depth=8"] {
        let run = support::run(&exe, options);
        let stdout = run.stdout();
        assert!(
            stdout.contains("check_heap: 4"),
            "{options}: {stdout}\n{}",
            run.text
        );
        assert_eq!(run.errors().len(), 4, "{options}: {}", run.text);
        for error in run.errors() {
            assert_eq!(error["kind"], "use_after_free", "{options}: {error}");
            assert_eq!(
                error["previous_free_stack"][0]["function"],
                "(anonymous namespace)::release_here(void*)",
                "{options}: {error}"
            );
        }
    }
}
