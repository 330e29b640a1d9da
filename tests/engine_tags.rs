//! Issue 37's tags on the engine allocators: a block a pool, stack, block allocator, typed pool
//! or `allocate()` serves inside `K15_MEMORY_SCOPE` counts against the scope's tag in
//! `tag_stats()` and the report, until it is freed, rewound or destroyed
//! (`tests/cpp/engine_tags.cpp`), and a leaked one names its tag.

mod support;

const SOURCE: &str = "tests/cpp/engine_tags.cpp";

/// The figures the program prints at `when`: tag -> live blocks, live bytes, allocations,
/// bytes allocated.
fn printed(stdout: &str, when: &str) -> Vec<(String, [u64; 4])> {
    stdout
        .lines()
        .filter_map(|line| line.strip_prefix(&format!("{when} ")))
        .map(|line| {
            let mut fields = line.split(' ');
            let name = fields.next().unwrap().to_owned();
            let figures: Vec<u64> = fields.map(|f| f.parse().unwrap()).collect();
            (name, figures.try_into().unwrap())
        })
        .collect()
}

fn tags(rows: &[(&str, [u64; 4])]) -> Vec<(String, [u64; 4])> {
    rows.iter().map(|&(n, f)| (n.to_owned(), f)).collect()
}

#[test]
fn engine_allocators_blocks_count_against_the_scope_s_tag() {
    let dir = support::scratch("engine_tags");
    let exe = support::build(&dir, "engine_tags", &[SOURCE], &[]);
    let run = support::run(&exe, "");
    assert!(run.output.status.success(), "{}", run.stderr());
    let stdout = run.stdout();
    // Typed pool objects are 40 bytes (`Thing`), whatever their callers ask for.
    assert_eq!(
        printed(&stdout, "made"),
        tags(&[
            ("Engine", [8, 872, 8, 872]),
            ("Engine/Pool", [2, 300, 2, 300]),
            ("Engine/Stack", [2, 128, 2, 128]),
            ("Engine/Blocks", [1, 300, 1, 300]),
            ("Engine/Things", [2, 80, 2, 80]),
            ("Engine/Named", [1, 64, 1, 64]),
        ]),
        "{stdout}"
    );
    // A pool block freed, the stack rewound, an object destroyed.
    assert_eq!(
        printed(&stdout, "freed"),
        tags(&[
            ("Engine", [4, 504, 8, 872]),
            ("Engine/Pool", [1, 100, 2, 300]),
            ("Engine/Stack", [0, 0, 2, 128]),
            ("Engine/Blocks", [1, 300, 1, 300]),
            ("Engine/Things", [1, 40, 2, 80]),
            ("Engine/Named", [1, 64, 1, 64]),
        ]),
        "{stdout}"
    );
    let dropped = printed(&stdout, "dropped");
    assert_eq!(
        dropped.last().unwrap(),
        &("Engine/Dropped".to_owned(), [1, 128, 1, 128]),
        "{stdout}"
    );
    // The report's tags agree with tag_stats() at exit, and each leak names its tag.
    let report_tags = run.json["tags"].as_array().unwrap();
    for (name, [live_blocks, live_bytes, allocations, bytes]) in &dropped {
        let t = report_tags
            .iter()
            .find(|t| t["name"] == name.as_str())
            .unwrap();
        assert_eq!(
            [
                &t["live_blocks"],
                &t["live_bytes"],
                &t["total_allocations"],
                &t["total_bytes"]
            ],
            [live_blocks, live_bytes, allocations, bytes],
            "{name}: {}",
            run.text
        );
    }
    let mut leaked: Vec<(u64, String, String)> = run
        .leaks()
        .iter()
        .filter(|l| l["leak_kind"] == "direct")
        .map(|l| {
            (
                l["size"].as_u64().unwrap(),
                l["language"].as_str().unwrap().to_owned(),
                l["tag"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect();
    leaked.sort();
    let want = [
        (40, "tags.things", "Engine/Things"),
        (64, "named", "Engine/Named"),
        (100, "tags.pool", "Engine/Pool"),
        (128, "tags.dropped", "Engine/Dropped"),
        (300, "tags.blocks", "Engine/Blocks"),
    ]
    .map(|(size, language, tag)| (size, language.to_owned(), tag.to_owned()));
    assert_eq!(leaked, want, "{}", run.text);
}
