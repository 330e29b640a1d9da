//! The readers on a hand-written `k15-leaks/3` report: tags, profile and timeline, which no
//! writer of this tree produces yet (the integration tests read real `k15-leaks/2` reports).

use crate::report::Report;

const V3: &str = r#"{
  "format": "k15-leaks/3", "program": "/bin/game", "pid": 7,
  "summary": { "leaked_blocks": 2, "leaked_bytes": 96, "direct_blocks": 2, "direct_bytes": 96,
               "errors": 1, "total_allocations": 40, "peak_bytes": 4096, "frames_marked": 3 },
  "sites": [ { "stack": 0, "array": false, "file": null, "line": 0, "language": "c++",
               "allocated_with": "new", "tag": "Render/Mesh" },
             { "stack": 1, "array": true, "file": null, "line": 0, "language": "c++",
               "allocated_with": "new[]", "tag": null } ],
  "leaks": [ {"site":0,"leak_kind":"direct","size":64,"seq":1,"thread":1,"address":"0x10"},
             {"site":1,"leak_kind":"direct","size":32,"seq":2,"thread":1,"address":"0x20"} ],
  "errors": [ { "kind": "tag_over_budget", "tag": "Render", "budget_bytes": 1000,
                "live_bytes": 1024, "stack": 0 } ],
  "tags": [ { "name": "Render", "live_blocks": 1, "live_bytes": 64, "peak_bytes": 1024,
              "total_allocations": 30, "total_bytes": 3000, "budget_bytes": 1000 },
            { "name": "Render/Mesh", "live_blocks": 1, "live_bytes": 64, "peak_bytes": 1024,
              "total_allocations": 30, "total_bytes": 3000, "budget_bytes": 0 } ],
  "profile": { "peak": { "bytes": 4096, "frame": 2,
                         "sites": [ { "stack": 0, "tag": "Render/Mesh", "blocks": 4, "bytes": 4096 } ] },
               "sites": [ { "stack": 0, "tag": "Render/Mesh", "allocations": 30, "bytes": 3000, "temporary": 20 },
                          { "stack": 1, "tag": null, "allocations": 10, "bytes": 320, "temporary": 0 } ] },
  "timeline": { "frames": [1, 2, 3], "tags": { "Render": [0, 1024, 64] } },
  "frames": [ { "function": "Mesh::load()", "file": "/src/mesh.cpp", "line": 12, "inlined": false,
                "address": "0x401000", "module": "/bin/game" },
              { "function": "main", "file": "/src/main.cpp", "line": 5, "inlined": false,
                "address": "0x402000", "module": "/bin/game" },
              { "function": "Audio::init()", "file": "/src/audio.cpp", "line": 9, "inlined": false,
                "address": "0x403000", "module": "/bin/game" } ],
  "stacks": [ [0, 1], [2, 1] ]
}"#;

#[test]
fn the_page_carries_every_view_of_a_v3_report() {
    let page = crate::html_from_report_json(V3).unwrap();
    for part in [
        r#""peak":[[0,4096]]"#,
        r#""allocations":[[0,30],[1,10]]"#,
        r#""temporary":[[0,20],[1,0]]"#,
        r#""budget_bytes":1000"#,
        r#""timeline":{"Render":[0,1024,64]}"#,
        r#""kind":"tag_over_budget","size":0,"stacks":[["stack",0]],"tag":"Render""#,
    ] {
        assert!(page.contains(part), "{part}");
    }
}

#[test]
fn show_takes_a_parent_tag_for_its_children() {
    let report = Report::from_json(V3).unwrap();
    let only = |tag: &str| {
        let filter = crate::show::Filter {
            tag: Some(tag.to_owned()),
            ..Default::default()
        };
        crate::show::text(&report, &filter)
    };
    assert!(only("Render").contains("Mesh::load()"));
    assert!(only("Render/Mesh").contains("[Render/Mesh]"));
    assert!(!only("Render").contains("Audio::init()"));
    assert!(
        !only("Rend").contains("Mesh::load()"),
        "a tag's prefix is not its parent"
    );
}

#[test]
fn pprof_has_allocation_totals_and_tag_labels() {
    let report = Report::from_json(V3).unwrap();
    let mut gz = Vec::new();
    crate::pprof::write(&report, &mut gz).unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut bytes).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    for name in [
        "inuse_space",
        "alloc_objects",
        "alloc_space",
        "tag",
        "Render/Mesh",
        "Mesh::load()",
    ] {
        assert!(text.contains(name), "{name}");
    }
}

#[test]
fn merge_keeps_tags_and_profile() {
    let report = Report::from_json(V3).unwrap();
    let merged = crate::merge::merge(&[report.clone(), report]);
    assert_eq!(merged.format, "k15-leaks/3");
    assert_eq!(merged.tags[0].total_allocations, 60);
    assert_eq!(merged.tags[0].peak_bytes, 1024, "a peak is not a sum");
    let profile = merged.profile.unwrap();
    assert_eq!(profile.sites[0].allocations, 60);
    assert_eq!(profile.peak.unwrap().bytes, 4096);
    assert_eq!(
        merged.sites[0].processes.len(),
        1,
        "one program, one pid, twice"
    );
}

/// `V3` with its first leak's `"leak_kind":"direct"` replaced by `kind`.
fn v3_with_leak_kind(kind: &str) -> String {
    V3.replacen(
        r#""leak_kind":"direct""#,
        &format!(r#""leak_kind":{kind:?}"#),
        1,
    )
}

#[test]
fn a_leak_kind_not_documented_is_a_malformed_report() {
    for kind in ["", "évident", "Direct"] {
        let why = Report::from_json(&v3_with_leak_kind(kind)).unwrap_err().0;
        assert!(
            why.starts_with("malformed report: leak_kind") && why.contains("direct, indirect"),
            "{kind:?}: {why}"
        );
    }
    Report::from_json(&v3_with_leak_kind("reachable")).unwrap();
}

#[test]
fn show_capitalizes_a_kind_by_character() {
    // A report built in memory is not checked: `show` must not slice its strings by bytes.
    let mut report = Report::from_json(V3).unwrap();
    for (kind, shown) in [
        ("évident", "Évident leak of 64 bytes"),
        ("", " leak of 64 bytes"),
    ] {
        report.leaks[0].leak_kind = kind.to_owned();
        let text = crate::show::text(&report, &Default::default());
        assert!(text.contains(shown), "{kind:?}: {text}");
    }
}

/// `V3` with `timeline` for its timeline.
fn v3_with_timeline(timeline: &str) -> String {
    let v3_timeline = r#"{ "frames": [1, 2, 3], "tags": { "Render": [0, 1024, 64] } }"#;
    assert!(V3.contains(v3_timeline));
    V3.replacen(v3_timeline, timeline, 1)
}

#[test]
fn a_timeline_the_page_cannot_draw_is_a_malformed_report() {
    for (timeline, why) in [
        ("5", "neither an object nor a list"),
        (r#"{"frames": [1, 2]}"#, "no \"tags\""),
        (
            r#"{"frames": [1, 2], "tags": {"A": 5}}"#,
            "tags.A is not a list",
        ),
        (
            r#"{"frames": [1, 2], "tags": {"A": null}}"#,
            "tags.A is not a list",
        ),
        (
            r#"{"tags": {"A": [1, "2"]}}"#,
            "tags.A[1] is not a byte count",
        ),
        (r#"{"tags": {"A": [-1]}}"#, "tags.A[0] is not a byte count"),
        (r#"{"tags": [{"live_bytes": [1]}]}"#, "tags[0] has no name"),
        (
            r#"[{"frame": 1, "tags": {"A": 1}}, 7]"#,
            "[1] is not an object",
        ),
        (
            r#"[{"frame": 1, "tags": [1]}]"#,
            "[0].tags is not an object",
        ),
    ] {
        let err = Report::from_json(&v3_with_timeline(timeline))
            .unwrap_err()
            .0;
        assert!(
            err.starts_with("malformed report: timeline: ") && err.contains(why),
            "{timeline}: {err}"
        );
    }
}

#[test]
fn the_page_gets_every_timeline_shape_as_series_per_tag() {
    for timeline in [
        r#"[{"frame": 1, "tags": {"A": 1}}, {"frame": 2, "live_bytes": {"A": 2, "B": 3}}]"#,
        r#"{"tags": [{"name": "A", "live_bytes": [1, 2]}, {"name": "B", "live_bytes": [null, 3]}]}"#,
        r#"{"frames": [1, 2], "tags": {"A": [1, 2], "B": [null, 3]}}"#,
    ] {
        let page = crate::html_from_report_json(&v3_with_timeline(timeline)).unwrap();
        assert!(
            page.contains(r#""timeline":{"A":[1,2],"B":[null,3]}"#),
            "{timeline}"
        );
    }
}

#[test]
fn a_merged_report_keeps_each_process_s_indirect_blocks_with_its_own_direct_leak() {
    // Two runs of one program without address randomization: both leaked a block at 0x10, and
    // only the second run's (from site 1) holds an indirect block (from site 0).
    let leak = |site, kind: &str, address: &str, held_by: Option<&str>| crate::report::Leak {
        site,
        leak_kind: kind.to_owned(),
        size: 8,
        seq: 0,
        thread: 1,
        address: Some(address.to_owned()),
        held_by: held_by.map(str::to_owned),
        process: None,
    };
    let mut first = Report::from_json(V3).unwrap();
    first.leaks = vec![leak(0, "direct", "0x10", None)];
    let mut second = first.clone();
    second.pid = 8;
    second.leaks = vec![
        leak(1, "direct", "0x10", None),
        leak(0, "indirect", "0x30", Some("0x10")),
    ];
    let merged = crate::merge::merge(&[second, first]);
    let merged = Report::from_json(&serde_json::to_string(&merged).unwrap()).unwrap();
    let held: Vec<_> = merged.held().into_iter().collect();
    assert_eq!(held, [((1, 0), (1, 8))], "site 1 holds site 0's block");
}

#[test]
fn sarif_uris_are_percent_encoded_and_relative_paths_are_references() {
    let mut report = Report::from_json(V3).unwrap();
    report.frames[0].file = Some("/work/my checkout/src/#1 100%.cpp".to_owned());
    report.frames[1].file = Some("./elf/dl-init.c".to_owned());
    report.frames[2].file = Some("/opt/a b/c:d?.cpp".to_owned());
    let log = crate::sarif::log(&report, std::path::Path::new("/work/my checkout"));
    let run = &log["runs"][0];
    assert_eq!(
        run["originalUriBaseIds"]["%SRCROOT%"]["uri"],
        "file:///work/my%20checkout/"
    );
    let mut artifacts: Vec<String> = run["results"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["stacks"][0]["frames"].as_array().unwrap())
        .map(|f| f["location"]["physicalLocation"]["artifactLocation"].to_string())
        .collect();
    artifacts.sort();
    artifacts.dedup();
    assert_eq!(
        artifacts,
        [
            r#"{"uri":"elf/dl-init.c","uriBaseId":"%SRCROOT%"}"#,
            r#"{"uri":"file:///opt/a%20b/c%3Ad%3F.cpp"}"#,
            r#"{"uri":"src/%231%20100%25.cpp","uriBaseId":"%SRCROOT%"}"#,
        ]
    );
}

/// `V3` with a third leak, of `size` bytes, from site 0 (whose other leak has 64 bytes).
fn v3_with_a_leak_of(size: u64) -> Report {
    let mut report = Report::from_json(V3).unwrap();
    let mut leak = report.leaks[0].clone();
    leak.size = size;
    report.leaks.push(leak);
    report
}

#[test]
fn sums_near_the_u64_limit_saturate_rather_than_wrap() {
    let report = v3_with_a_leak_of(u64::MAX);
    let text = crate::show::text(&report, &Default::default());
    assert!(
        text.contains("Direct leak of 18446744073709551615 bytes in 2 blocks"),
        "{text}"
    );
    let top = crate::show::text(
        &report,
        &crate::show::Filter {
            top: 1,
            ..Default::default()
        },
    );
    assert!(top.contains("(32 bytes), not listed"), "{top}");
    let folded = crate::folded::text(&report);
    assert!(
        folded.contains("main;Mesh::load() 18446744073709551615\n"),
        "{folded}"
    );

    let mut huge = Report::from_json(V3).unwrap();
    huge.summary
        .insert("leaked_bytes".to_owned(), u64::MAX.into());
    huge.tags[0].total_bytes = u64::MAX;
    huge.profile.as_mut().unwrap().sites[0].bytes = u64::MAX;
    let merged = crate::merge::merge(&[huge.clone(), huge]);
    assert_eq!(merged.figure("leaked_bytes"), u64::MAX);
    assert_eq!(merged.tags[0].total_bytes, u64::MAX);
    assert_eq!(merged.profile.unwrap().sites[0].bytes, u64::MAX);
}

/// What the test reads of a pprof profile: its samples' values (prost skips the other fields).
#[derive(Clone, PartialEq, prost::Message)]
struct PprofSamples {
    #[prost(message, repeated, tag = "2")]
    sample: Vec<PprofSample>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PprofSample {
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
}

#[test]
fn pprof_clamps_what_int64_cannot_hold() {
    let mut report = v3_with_a_leak_of(1 << 63);
    report.profile.as_mut().unwrap().sites[0].bytes = u64::MAX;
    let mut gz = Vec::new();
    crate::pprof::write(&report, &mut gz).unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut bytes).unwrap();
    let profile = <PprofSamples as prost::Message>::decode(&bytes[..]).unwrap();
    let values: Vec<&Vec<i64>> = profile.sample.iter().map(|s| &s.value).collect();
    assert!(
        values.iter().flat_map(|v| v.iter()).all(|&v| v >= 0),
        "{values:?}"
    );
    assert!(values.iter().any(|v| v[1] == i64::MAX), "{values:?}");
    assert!(values.iter().any(|v| v[3] == i64::MAX), "{values:?}");
}

#[test]
fn the_page_s_placeholders_in_a_program_name_stay_text() {
    let mut report = Report::from_json(V3).unwrap();
    report.program = Some("/x/{{data}}{{style}}{{title}}".to_owned());
    let page = crate::html::page(&report);
    assert!(
        page.contains("<title>k15-memory: {{data}}{{style}}{{title}}</title>"),
        "{}",
        &page[..page.find("</title>").unwrap_or(page.len())]
    );
    assert_eq!(page.matches("id=\"k15-data\"").count(), 1);
}

#[test]
fn names_with_control_characters_stay_on_their_line_and_off_the_terminal() {
    let mut report = Report::from_json(V3).unwrap();
    report.frames[0].function = Some("a\nb;c\0d\te\u{1b}[31mred\u{7f}".to_owned());
    report.frames[0].file = Some("/src/we\nird.cpp".to_owned());
    report.program = Some("/bin/\u{1b}]0;title\u{7}".to_owned());
    let folded = crate::folded::text(&report);
    assert!(
        folded.contains("main;a\\nb:c\\x00d\\te\\x1b[31mred\\x7f 64\n"),
        "{folded}"
    );
    assert_eq!(folded.lines().count(), 2, "{folded}");
    let text = crate::show::text(&report, &Default::default());
    assert!(
        text.contains("#0 a\\nb;c\\x00d\\te\\x1b[31mred\\x7f /src/we\\nird.cpp:12\n"),
        "{text}"
    );
    assert!(text.contains("program /bin/\\x1b]0;title\\x07\n"), "{text}");
    assert!(
        !text.contains(['\0', '\u{1b}', '\u{7}', '\u{7f}']),
        "{text}"
    );
}
