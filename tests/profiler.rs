//! The engine's memory profiler: tag scopes (`K15_MEMORY_SCOPE`, the C push/pop), their figures
//! through `tag_stats()` and in both reports, checked exactly against what a game loop
//! allocates (`tests/cpp/profiler_tags.cpp`).

mod support;

const TAGS_SOURCE: &str = "tests/cpp/profiler_tags.cpp";

/// What `profiler_tags.cpp` allocates under each tag, as its comments say: live blocks, live
/// bytes, peak bytes, allocations, bytes allocated, budget, in the order the tags are first seen.
const EXPECTED_TAGS: [(&str, [u64; 6]); 8] = [
    // Solver's 100 bytes live while Broadphase's four 64-byte pairs are.
    ("Physics", [1, 100, 356, 1500, 106_800, 0]),
    ("Physics/Solver", [1, 100, 100, 300, 30_000, 0]),
    ("Physics/Broadphase", [0, 0, 256, 1200, 76_800, 0]),
    // 30 textures of 4096 bytes kept, a 32-byte command list made and freed each frame.
    ("Render", [30, 122_880, 122_912, 330, 132_480, 0]),
    ("Render/Textures", [30, 122_880, 122_880, 30, 122_880, 0]),
    ("Audio", [0, 0, 8, 600, 2400, 0]),
    ("Loading", [0, 0, 8000, 200, 8000, 0]),
    ("Jobs", [50, 2400, 4800, 100, 4800, 0]),
];

#[test]
fn a_game_loop_s_tags_count_exactly_what_each_subsystem_allocated() {
    let dir = support::scratch("profiler_tags");
    let exe = support::build(&dir, "profiler_tags", &[TAGS_SOURCE], &[]);
    let run = support::run(&exe, "");
    assert!(run.output.status.success(), "{}", run.stderr());
    let printed: Vec<(String, [u64; 6])> = run
        .stdout()
        .lines()
        .filter_map(|line| line.strip_prefix("tag "))
        .map(|line| {
            let mut fields = line.split(' ');
            let name = fields.next().unwrap().to_owned();
            let figures: Vec<u64> = fields.map(|f| f.parse().unwrap()).collect();
            (name, figures.try_into().unwrap())
        })
        .collect();
    let expected: Vec<(String, [u64; 6])> = EXPECTED_TAGS
        .iter()
        .map(|(name, figures)| (name.to_string(), *figures))
        .collect();
    assert_eq!(printed, expected, "{}", run.stdout());

    // The report at exit says the same (nothing tagged changed after the program read them).
    assert_eq!(run.json["format"], "k15-leaks/3");
    let reported: Vec<(String, [u64; 6])> = run.json["tags"]
        .as_array()
        .expect("tags")
        .iter()
        .map(|t| {
            let figure = |key: &str| t[key].as_u64().unwrap();
            (
                t["name"].as_str().unwrap().to_owned(),
                [
                    figure("live_blocks"),
                    figure("live_bytes"),
                    figure("peak_bytes"),
                    figure("total_allocations"),
                    figure("total_bytes"),
                    figure("budget_bytes"),
                ],
            )
        })
        .collect();
    assert_eq!(reported, expected);

    // Each live block's site names its tag; blocks outside every scope have none.
    let tag_of_size = |size: u64| -> Vec<serde_json::Value> {
        let mut tags: Vec<_> = run
            .leaks()
            .iter()
            .filter(|l| l["size"] == size)
            .map(|l| l["tag"].clone())
            .collect();
        tags.dedup();
        tags
    };
    assert_eq!(tag_of_size(4096), ["Render/Textures"], "{}", run.text);
    assert_eq!(tag_of_size(100), ["Physics/Solver"], "{}", run.text);
    assert_eq!(tag_of_size(48), ["Jobs"], "{}", run.text);
    assert!(
        run.raw_json["sites"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["tag"].is_null() || s["tag"].is_string()),
        "{}",
        run.raw_json["sites"]
    );

    // Per frame: 301 marks, 300 frames; frame 1 (loop round 0) also made a texture.
    assert_eq!(run.json["summary"]["frames_marked"], 301);
    let frames = &run.json["per_frame"];
    assert_eq!(frames["frames"], 300);
    let per_frame = |v: &serde_json::Value| {
        (
            v["mean"].as_f64().unwrap(),
            v["max"].as_u64().unwrap(),
            v["max_frame"].as_u64().unwrap(),
        )
    };
    // 4 pairs, a solver state, a command list, two voices: 8 a frame, 9 with a texture.
    assert_eq!(per_frame(&frames["allocations"]), (8.1, 9, 1), "{frames}");
    let expected_per_frame = [
        ("Physics", (5.0, 5, 1), (356.0, 356, 1)),
        ("Physics/Solver", (1.0, 1, 1), (100.0, 100, 1)),
        ("Physics/Broadphase", (4.0, 4, 1), (256.0, 256, 1)),
        ("Render", (1.1, 2, 1), (441.6, 4096 + 32, 1)),
        ("Render/Textures", (0.1, 1, 1), (409.6, 4096, 1)),
        ("Audio", (2.0, 2, 1), (8.0, 8, 1)),
        // First seen after the last mark: in no frame.
        ("Loading", (0.0, 0, 0), (0.0, 0, 0)),
        ("Jobs", (0.0, 0, 0), (0.0, 0, 0)),
    ];
    for (tag, (name, allocations, bytes)) in run.json["tags"]
        .as_array()
        .unwrap()
        .iter()
        .zip(expected_per_frame)
    {
        assert_eq!(tag["name"], name);
        assert_eq!(
            per_frame(&tag["per_frame"]["allocations"]),
            allocations,
            "{tag}"
        );
        assert_eq!(per_frame(&tag["per_frame"]["bytes"]), bytes, "{tag}");
    }
    // The solver's first free was of a null pointer: 299 frees in 300 frames.
    assert_eq!(
        per_frame(&run.json["tags"][1]["per_frame"]["frees"]),
        (1.0, 1, 2),
        "{}",
        run.json["tags"][1]
    );

    // The text report's table, a row per tag.
    let table = run
        .text
        .split("Memory by tag")
        .nth(1)
        .expect("a table of tags");
    for (name, figures) in EXPECTED_TAGS {
        let row = table
            .lines()
            .find(|line| line.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{table}"));
        let numbers: Vec<String> = row
            .split_whitespace()
            .skip(1)
            .take(5)
            .map(str::to_owned)
            .collect();
        let wanted: Vec<String> = figures[..5].iter().map(u64::to_string).collect();
        assert_eq!(numbers, wanted, "{row}");
    }
}

#[test]
fn tag_scopes_compile_to_nothing_when_disabled() {
    let dir = support::scratch("profiler_tags_disabled");
    let exe = support::build(
        &dir,
        "profiler_tags_disabled",
        &[TAGS_SOURCE],
        &["-DK15_MEMORY_DISABLED"],
    );
    let out = std::process::Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "tags: 0\n");
}

#[test]
fn budgets_are_crossed_by_a_leaf_and_by_a_parent_once_per_crossing() {
    let dir = support::scratch("profiler_budgets");
    let exe = support::build(
        &dir,
        "profiler_budgets",
        &["tests/cpp/profiler_budgets.cpp"],
        &[],
    );
    let budgets = dir.join("budgets.txt");
    std::fs::write(
        &budgets,
        "# the test's budgets\n\
         Render/Textures 10K\n\
         Physics 1000   # a parent: its children count\n\
         \n\
         Audio lots\n",
    )
    .unwrap();
    let run = support::run(&exe, &format!("budgets={}", budgets.display()));
    let stderr = run.stderr();
    assert!(run.output.status.success(), "{stderr}");
    assert!(run.stdout().contains("went on"));
    // The bad line, once, with its number; the good ones give tag_stats() their budgets.
    let complaints: Vec<&str> = stderr.lines().filter(|l| l.contains("budgets=")).collect();
    assert_eq!(complaints.len(), 1, "{stderr}");
    assert!(complaints[0].contains(":5: `Audio lots`"), "{stderr}");
    for line in [
        "budget Render/Textures 10240",
        "budget Physics 1000",
        "budget Render 0",
    ] {
        assert!(
            run.stdout().lines().any(|l| l == line),
            "{line}: {}",
            run.stdout()
        );
    }

    // Printed as they happened, and in the report: the crossings in order.
    assert_eq!(stderr.matches("tag_over_budget").count(), 3, "{stderr}");
    let crossings: Vec<(String, u64, u64, u64)> = run
        .errors()
        .iter()
        .map(|e| {
            assert_eq!(e["kind"], "tag_over_budget", "{e}");
            (
                e["tag"].as_str().unwrap().to_owned(),
                e["budget_bytes"].as_u64().unwrap(),
                e["live_bytes"].as_u64().unwrap(),
                e["size"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        crossings,
        [
            ("Render/Textures".to_owned(), 10_240, 12_288, 4096),
            ("Render/Textures".to_owned(), 10_240, 12_288, 4096),
            ("Physics".to_owned(), 1000, 1200, 600),
        ]
    );
    // Each with the stack of the allocation that crossed the budget.
    let first_function = |e: &serde_json::Value| {
        e["alloc_stack"][0]["function"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let functions: Vec<String> = run.errors().iter().map(first_function).collect();
    assert!(functions[0].contains("load_texture"), "{functions:?}");
    assert!(functions[2].contains("broadphase"), "{functions:?}");
    assert!(
        run.text
            .contains("tag 'Physics' over its budget of 1000 bytes: 1200 bytes live"),
        "{}",
        run.text
    );
    // Nothing was freed: no free function to name.
    assert!(run.errors().iter().all(|e| e["freed_with"].is_null()));
}

#[test]
fn a_block_resized_under_another_tag_moves_to_that_tag_in_place_or_not() {
    let dir = support::scratch("profiler_realloc");
    let exe = support::build(
        &dir,
        "profiler_realloc",
        &["tests/cpp/profiler_realloc.cpp"],
        &[],
    );
    let run = support::run(&exe, "");
    assert!(run.output.status.success(), "{}", run.stderr());
    let stdout = run.stdout();
    assert!(
        stdout.contains("small in place 1, large moved 1"),
        "{stdout}"
    );
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("tag ")).collect();
    // name, live blocks, live bytes, allocations: after the reallocs, then after the frees.
    assert_eq!(
        lines,
        [
            "tag Loading 0 0 2",
            "tag World 2 5104 2",
            "tag Loading 0 0 2",
            "tag World 0 0 2",
        ],
        "{stdout}"
    );
}

/// A report written while threads allocate and free tagged blocks counts in its tag table the
/// blocks its leak list has: both read while the world is stopped (the table was read after the
/// threads went on, and counted hundreds of blocks more or fewer than the list).
#[test]
fn a_mid_run_report_s_tag_table_matches_its_leak_list() {
    let dir = support::scratch("profiler_tags_mid_run");
    let exe = support::build(
        &dir,
        "profiler_tags_mid_run",
        &["tests/cpp/profiler_tags_mid_run.cpp"],
        &[],
    );
    let output = std::process::Command::new("timeout")
        .args(["--signal=KILL", "120"])
        .arg(&exe)
        .arg("4")
        .current_dir(&dir)
        .env("K15_MEMORY_OPTIONS", "report=0")
        .output()
        .expect("the program runs");
    assert!(
        output.status.success(),
        "{:?}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
    for r in 0..4 {
        let json = support::read_json(&dir.join(format!("mid-{r}.log.json")));
        // Blocks and bytes listed per tag, counted against each parent too (as the table is).
        let mut listed: std::collections::HashMap<String, (u64, u64)> = Default::default();
        for leak in json["leaks"].as_array().expect("leaks") {
            let site = leak["site"].as_u64().unwrap() as usize;
            let Some(tag) = json["sites"][site]["tag"].as_str() else {
                continue;
            };
            let size = leak["size"].as_u64().unwrap();
            for (end, _) in tag.match_indices('/').chain([(tag.len(), "")]) {
                let counted = listed.entry(tag[..end].to_string()).or_default();
                counted.0 += 1;
                counted.1 += size;
            }
        }
        let tags = json["tags"].as_array().expect("tags");
        assert!(!tags.is_empty(), "report {r}");
        for tag in tags {
            let name = tag["name"].as_str().unwrap();
            let table = (
                tag["live_blocks"].as_u64().unwrap(),
                tag["live_bytes"].as_u64().unwrap(),
            );
            let in_list = listed.get(name).copied().unwrap_or_default();
            assert_eq!(table, in_list, "report {r}, tag {name}");
        }
    }
}
