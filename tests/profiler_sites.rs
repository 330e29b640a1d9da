//! `profile=1`: most allocations, temporary allocations and the peak's consumers per allocating
//! stack, compared with heaptrack_print on the plain build of the same program
//! (`tests/cpp/profiler_sites.cpp`): the same sites, calls, temporary allocations and peak bytes.

mod support;

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

const SOURCE: &str = "tests/cpp/profiler_sites.cpp";
const FILE: &str = "profiler_sites.cpp";

/// A site as both tools name it: the `file:line` of its frames in the program's own source.
type Place = Vec<String>;

/// One entry of a heaptrack_print list: its heading and its place.
struct Entry {
    heading: String,
    place: Place,
}

/// heaptrack_print's lists, by their titles (`MOST CALLS TO ALLOCATION FUNCTIONS`, ...).
fn heaptrack_lists(text: &str) -> BTreeMap<String, Vec<Entry>> {
    let mut lists: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
    let mut title = String::new();
    for line in text.lines() {
        if !line.is_empty() && line == line.to_uppercase() && !line.starts_with(' ') {
            title = line.to_owned();
        } else if !line.starts_with(' ') && !line.is_empty() && !title.is_empty() {
            lists.entry(title.clone()).or_default().push(Entry {
                heading: line.to_owned(),
                place: Vec::new(),
            });
        } else if let Some(at) = line.trim_start().strip_prefix("at ") {
            if let (Some(entry), true) = (
                lists.get_mut(&title).and_then(|l| l.last_mut()),
                at.contains(FILE),
            ) {
                entry.place.push(at.rsplit('/').next().unwrap().to_owned());
            }
        }
    }
    lists
}

/// The first number of a heading (`2000 calls to ...`, `163.84K peak memory ...`) as written.
fn first_word(heading: &str) -> String {
    heading.split(' ').next().unwrap().to_owned()
}

/// Bytes as heaptrack_print writes them: `32B`, `1.54K`, `163.84K`, `2.10M`.
fn heaptrack_bytes(bytes: u64) -> String {
    match bytes {
        0..=999 => format!("{bytes}B"),
        1000..=999_999 => format!("{:.2}K", bytes as f64 / 1e3),
        _ => format!("{:.2}M", bytes as f64 / 1e6),
    }
}

/// The place of a profile site of the JSON report.
fn place_of(report: &Value, site: &Value) -> Place {
    let stack = &report["stacks"][site["stack"].as_u64().unwrap() as usize];
    stack
        .as_array()
        .unwrap()
        .iter()
        .map(|f| &report["frames"][f.as_u64().unwrap() as usize])
        .filter(|f| f["file"].as_str().is_some_and(|file| file.ends_with(FILE)))
        .map(|f| format!("{FILE}:{}", f["line"]))
        .collect()
}

#[test]
fn most_calls_temporary_allocations_and_the_peak_s_consumers_are_heaptrack_s() {
    let dir = support::scratch("profiler_sites");
    let exe = support::build(&dir, "profiler_sites", &[SOURCE], &[]);
    let plain = support::build(
        &dir,
        "profiler_sites_plain",
        &[SOURCE],
        &["-DK15_MEMORY_DISABLED"],
    );
    let traced = dir.join("heaptrack.out");
    let out = Command::new("timeout")
        .args(["300", "heaptrack", "-o"])
        .arg(&traced)
        .arg(&plain)
        .current_dir(&dir)
        .output()
        .expect("heaptrack runs (Debian's heaptrack)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let data = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_str().unwrap().contains("heaptrack.out."))
        .expect("heaptrack's data file");
    let printed = Command::new("heaptrack_print")
        .args(["-m", "0", "-n", "100", "-f"])
        .arg(&data)
        .output()
        .expect("heaptrack_print runs");
    let heaptrack = String::from_utf8_lossy(&printed.stdout).into_owned();
    let lists = heaptrack_lists(&heaptrack);

    let run = support::run(&exe, "profile=1");
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = &run.raw_json;
    let profile = &report["profile"];
    let ours = |list: &str, figure: &str| -> Vec<(Place, u64)> {
        profile[list]["sites"]
            .as_array()
            .or(profile[list].as_array())
            .unwrap()
            .iter()
            .map(|s| (place_of(report, s), s[figure].as_u64().unwrap()))
            .filter(|(place, figure)| !place.is_empty() && *figure > 0)
            .collect()
    };
    let theirs = |title: &str| -> Vec<(Place, String)> {
        lists[title]
            .iter()
            .filter(|e| !e.place.is_empty())
            .map(|e| (e.place.clone(), first_word(&e.heading)))
            .collect()
    };
    let line = |marker: &str| support::line_of(SOURCE, marker);
    let (particle, chunk, message, config) = (
        line("profiler_sites: particle"),
        line("profiler_sites: chunk"),
        line("profiler_sites: message"),
        line("profiler_sites: config"),
    );

    // Most calls: the same sites in the same order, with the same counts.
    let calls: Vec<(Place, String)> = ours("sites", "allocations")
        .into_iter()
        .map(|(place, n)| (place, n.to_string()))
        .collect();
    assert_eq!(
        calls,
        theirs("MOST CALLS TO ALLOCATION FUNCTIONS"),
        "{heaptrack}"
    );
    let first_lines: Vec<String> = calls.iter().map(|(place, _)| place[0].clone()).collect();
    let at = |line: u64| format!("{FILE}:{line}");
    assert_eq!(
        first_lines,
        [
            at(particle),
            at(particle),
            at(message),
            at(chunk),
            at(config)
        ]
    );

    // Temporary allocations: the particles (each freed before the next allocation) and the last
    // message (freed before anything else was allocated).
    let temporary: Vec<(Place, String)> = ours("sites", "temporary")
        .into_iter()
        .map(|(place, n)| (place, n.to_string()))
        .collect();
    assert_eq!(
        temporary,
        theirs("MOST TEMPORARY ALLOCATIONS"),
        "{heaptrack}"
    );
    assert_eq!(
        temporary
            .iter()
            .map(|(_, n)| n.as_str())
            .collect::<Vec<_>>(),
        ["2000", "2000", "1"]
    );

    // The peak's consumers: what was live at the peak, largest first, in bytes as heaptrack
    // writes them; the peak itself too.
    let peak: Vec<(Place, String)> = ours("peak", "bytes")
        .into_iter()
        .map(|(place, bytes)| (place, heaptrack_bytes(bytes)))
        .collect();
    assert_eq!(peak, theirs("PEAK MEMORY CONSUMERS"), "{heaptrack}");
    let peak_bytes = profile["peak"]["bytes"].as_u64().unwrap();
    assert!(
        heaptrack.contains(&format!(
            "peak heap memory consumption: {}",
            heaptrack_bytes(peak_bytes)
        )),
        "ours {peak_bytes}\n{heaptrack}"
    );
    // Exactly: 40 chunks, three configs and one particle (the libstdc++ pool besides).
    let exact: Vec<(u64, u64, Value)> = profile["peak"]["sites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !place_of(report, s).is_empty())
        .map(|s| {
            (
                s["blocks"].as_u64().unwrap(),
                s["bytes"].as_u64().unwrap(),
                s["tag"].clone(),
            )
        })
        .collect();
    assert_eq!(
        exact,
        [
            (40, 40 * 4096, Value::Null),
            (3, 3 * 512, "Config".into()),
            (1, 32, Value::Null)
        ]
    );
    assert_eq!(profile["peak"]["frame"], 0, "no frame marked");

    // The text lists the top sites.
    assert!(run.text.contains("Most allocations ("), "{}", run.text);
    assert!(
        run.text
            .contains("2000 allocations (2000 temporary) of 64000 bytes, from:"),
        "{}",
        run.text
    );
    assert!(
        run.text.contains("163840 bytes in 40 blocks, from:"),
        "{}",
        run.text
    );
}

#[test]
fn with_stacks_off_sites_are_k15_new_places_and_profile_is_off_by_default() {
    let dir = support::scratch("profiler_sites_no_stacks");
    let exe = support::build(&dir, "profiler_sites", &[SOURCE], &[]);
    let run = support::run(&exe, "profile=1:stack_depth=0");
    assert!(run.output.status.success(), "{}", run.stderr());
    let profile = &run.raw_json["profile"];
    let config = profile["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["file"].as_str().is_some_and(|f| f.ends_with(FILE)))
        .expect("the K15_NEW site");
    assert_eq!(
        config["line"].as_u64(),
        Some(support::line_of(SOURCE, "profiler_sites: config"))
    );
    assert_eq!(
        (config["allocations"].as_u64(), config["tag"].as_str()),
        (Some(3), Some("Config"))
    );
    // Every plain `new` and `malloc` is one site without a place: 4340 allocations or more.
    let plain = &profile["sites"][0];
    assert!(plain["file"].is_null() && plain["allocations"].as_u64().unwrap() >= 4340);
    let line = support::line_of(SOURCE, "profiler_sites: config");
    assert!(
        run.text.contains(&format!(
            "3 allocations (0 temporary) of 1536 bytes, tag Config, at {SOURCE}:{line}"
        )),
        "{}",
        run.text
    );

    let off = support::run(&exe, "");
    assert!(off.raw_json["profile"].is_null());
    assert!(!off.text.contains("Most allocations"));
}
