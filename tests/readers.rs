//! The `k15-memory` command on reports of real programs: `diff` across two builds, `merge` of
//! several processes, pprof read back by `go tool pprof`, SARIF read by go-sarif (types
//! generated from the 2.1.0 schema), the HTML page drawn by headless Chromium, and bad input.

mod support;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const SOURCE: &str = "tests/cpp/readers_builds.cpp";

fn reader() -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args(["--signal=KILL", "300", env!("CARGO_BIN_EXE_k15-memory")]);
    cmd.current_dir(support::repo());
    cmd
}

fn k15(args: &[&str]) -> Output {
    reader().args(args).output().expect("k15-memory runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// Reports of two builds of `readers_builds.cpp`, each from its own copy of the source (as
/// two checkouts would be): `base` without what `NEW_BUILD` adds, `new` with it, so that every
/// site of `new` is on another line and one more; and `rebuilt`, the base source once more.
struct Builds {
    base: PathBuf,
    new: PathBuf,
    rebuilt: PathBuf,
    new_source: String,
}

fn builds() -> &'static Builds {
    static BUILDS: OnceLock<Builds> = OnceLock::new();
    BUILDS.get_or_init(|| {
        let dir = support::scratch("readers_builds");
        let text = std::fs::read_to_string(support::repo().join(SOURCE)).unwrap();
        let report = |name: &str, with_new_build: bool| {
            let source = dir
                .join(format!("{name}-checkout"))
                .join("readers_builds.cpp");
            std::fs::create_dir_all(source.parent().unwrap()).unwrap();
            std::fs::write(&source, edition(&text, with_new_build)).unwrap();
            let exe = support::build(&dir, name, &[path(&source)], &["-I", "tests/cpp"]);
            let run = support::run(&exe, "");
            assert!(run.output.status.success(), "{name}: {}", run.stderr());
            (
                dir.join(format!("{name}.log.json")),
                path(&source).to_owned(),
            )
        };
        let (new, new_source) = report("new", true);
        Builds {
            base: report("base", false).0,
            new,
            rebuilt: report("rebuilt", false).0,
            new_source,
        }
    })
}

/// The source with its `#ifdef NEW_BUILD` blocks kept (their lines only) or left out.
fn edition(text: &str, with_new_build: bool) -> String {
    let mut inside = false;
    let mut out = String::new();
    for line in text.lines() {
        match line.trim() {
            "#ifdef NEW_BUILD" => inside = true,
            "#endif" if inside => inside = false,
            _ if inside && !with_new_build => {}
            _ => {
                out += line;
                out.push('\n');
            }
        }
    }
    out
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

/// The line of `function`'s frame in the report's stacks.
fn line_in_report(report: &Path, function: &str) -> u64 {
    let raw = support::read_json(report);
    let frame = raw["frames"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"] == function);
    frame.unwrap_or_else(|| panic!("no {function} in {}", report.display()))["line"]
        .as_u64()
        .unwrap()
}

#[test]
fn diff_matches_moved_sites_and_fails_on_a_new_one() {
    let Builds {
        base,
        new,
        rebuilt,
        new_source,
    } = builds();
    // The sites of both builds are on other lines: only their functions and files match.
    for function in ["load_textures()", "load_meshes()", "make_child()"] {
        assert_ne!(
            line_in_report(base, function),
            line_in_report(new, function)
        );
    }
    let out = k15(&["diff", "--json", path(base), path(new)]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let diff = json(&out);
    let new_sites = diff["new"].as_array().unwrap();
    assert_eq!(new_sites.len(), 1, "{diff:#}");
    assert_eq!(new_sites[0]["kind"], "direct");
    assert_eq!(new_sites[0]["bytes"], 256);
    let top = &new_sites[0]["stack"][0];
    assert_eq!(top["function"], "load_sounds()");
    assert_eq!(top["file"], new_source.as_str());
    assert_eq!(top["line"], support::line_of(new_source, "leak: sounds"));
    assert_eq!(diff["gone"], Value::Array(vec![]), "{diff:#}");
    assert_eq!(diff["grown"], Value::Array(vec![]), "{diff:#}");

    let text = k15(&["diff", path(base), path(new)]);
    assert_eq!(text.status.code(), Some(1));
    assert!(stdout(&text).contains("New direct leak: 256 bytes in 1 block"));
    assert!(stdout(&text).contains("load_sounds()"));

    // The other way round the site is gone, which is no failure.
    let back = k15(&["diff", "--json", path(new), path(base)]);
    assert_eq!(back.status.code(), Some(0));
    assert_eq!(json(&back)["gone"].as_array().unwrap().len(), 1);

    // Two builds of the same code (other paths, other addresses): nothing new.
    let same = k15(&["diff", path(base), path(rebuilt)]);
    assert_eq!(same.status.code(), Some(0), "{}", stdout(&same));
    assert!(stdout(&same).contains("0 sites new, 0 gone, 0 grown."));
}

#[test]
fn merge_joins_processes_by_site() {
    let dir = support::scratch("readers_merge");
    let exe = support::build(&dir, "app", &[SOURCE], &[]);
    let reports: Vec<String> = (0..3)
        .map(|i| {
            let run = support::run_with(&exe, &format!("run{i}"), "", &[], &[]);
            assert!(run.output.status.success());
            path(&dir.join(format!("run{i}.log.json"))).to_owned()
        })
        .collect();
    let pids: Vec<u64> = reports
        .iter()
        .map(|r| support::read_json(Path::new(r))["pid"].as_u64().unwrap())
        .collect();
    let merged = dir.join("merged.json");
    let mut args = vec!["merge", "-o", path(&merged)];
    args.extend(reports.iter().map(String::as_str));
    let out = k15(&args);
    assert!(out.status.success(), "{}", stderr(&out));

    let raw = support::read_json(&merged);
    let one = support::read_json(Path::new(&reports[0]));
    assert_eq!(
        raw["sites"].as_array().unwrap().len(),
        one["sites"].as_array().unwrap().len()
    );
    for site in raw["sites"].as_array().unwrap() {
        let mut from: Vec<u64> = site["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                assert_eq!(p["program"], path(&exe));
                p["pid"].as_u64().unwrap()
            })
            .collect();
        from.sort();
        let mut want = pids.clone();
        want.sort();
        assert_eq!(from, want, "{site}");
    }
    let blocks = |r: &Value| r["summary"]["leaked_blocks"].as_u64().unwrap();
    assert_eq!(blocks(&raw), 3 * blocks(&one));
    assert_eq!(
        raw["leaks"].as_array().unwrap().len(),
        3 * one["leaks"].as_array().unwrap().len()
    );

    // The merged report is a report: `show` and `diff` read it.
    let show = k15(&["show", path(&merged)]);
    assert!(show.status.success(), "{}", stderr(&show));
    let text = stdout(&show);
    assert!(text.contains("Merged from 3 processes."), "{text}");
    assert!(
        text.contains("Direct leak of 768 bytes in 3 blocks (new)"),
        "{text}"
    );
    let grown = k15(&["diff", "--json", &reports[0], path(&merged)]);
    assert_eq!(grown.status.code(), Some(0));
    let grown = json(&grown);
    assert!(grown["new"].as_array().unwrap().is_empty());
    assert_eq!(
        grown["grown"].as_array().unwrap().len(),
        one["sites"].as_array().unwrap().len()
    );
}

#[test]
fn show_filters_by_kind_and_count() {
    let base = &builds().base;
    let all = stdout(&k15(&["show", path(base)]));
    assert!(
        all.contains("Direct leak of 300 bytes in 3 blocks (new[])"),
        "{all}"
    );
    assert!(
        all.contains("Indirect leak of 48 bytes in 1 block (new)"),
        "{all}"
    );
    assert!(all.contains("load_textures()"));
    let indirect = stdout(&k15(&["show", "--kind", "indirect", path(base)]));
    assert!(!indirect.contains("Direct leak"), "{indirect}");
    assert!(indirect.contains("make_child()"), "{indirect}");
    let top = stdout(&k15(&["show", "--top", "1", path(base)]));
    assert_eq!(top.matches(" leak of ").count(), 1, "{top}");
    assert!(top.contains("... and 3 more sites"), "{top}");
}

#[test]
fn pprof_export_reads_in_go_tool_pprof() {
    let base = &builds().base;
    let dir = support::scratch("readers_pprof");
    let profile = dir.join("leaks.pb.gz");
    let out = k15(&["export", "--pprof", path(&profile), path(base)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let top = |index: &str| {
        let out = Command::new("go")
            .args(["tool", "pprof", "-top", &format!("-sample_index={index}")])
            .arg(&profile)
            .env("HOME", &dir)
            .output()
            .expect("go is installed (.ci/run installs golang-go)");
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    // `flat` of each function that allocated: its bytes and blocks, as the report has them.
    let flat = |text: &str, function: &str| -> String {
        let line = text.lines().find(|l| l.ends_with(function));
        line.unwrap_or_else(|| panic!("no {function} in\n{text}"))
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    };
    let space = top("inuse_space");
    assert!(space.contains("of 652B total"), "{space}");
    assert_eq!(flat(&space, "load_textures()"), "256B");
    assert_eq!(flat(&space, "load_meshes()"), "300B");
    assert_eq!(flat(&space, "load_scene()"), "48B");
    assert_eq!(flat(&space, "make_child()"), "48B");
    let objects = top("inuse_objects");
    assert_eq!(flat(&objects, "load_meshes()"), "3");
    assert_eq!(flat(&objects, "load_textures()"), "1");
}

#[test]
fn folded_export_lists_leaked_bytes_by_stack() {
    let base = &builds().base;
    let dir = support::scratch("readers_folded");
    let folded = dir.join("leaks.txt");
    assert!(k15(&["export", "--folded", path(&folded), path(base)])
        .status
        .success());
    let text = std::fs::read_to_string(&folded).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.contains(&"main;load_textures() 256"), "{text}");
    assert!(lines.contains(&"main;load_meshes() 300"), "{text}");
    assert!(
        lines.contains(&"main;load_scene();make_child() 48"),
        "{text}"
    );
}

#[test]
fn sarif_export_is_sarif_2_1_0_at_the_leaking_lines() {
    let Builds {
        new, new_source, ..
    } = builds();
    let dir = support::scratch("readers_sarif");
    let sarif = dir.join("leaks.sarif");
    // Run from the checkout, so that files are relative to it, as code scanning wants.
    let out = k15(&["export", "--sarif", path(&sarif), path(new)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let checked = Command::new("go")
        .args(["run", "tests/sarif/check_sarif.go"])
        .arg(&sarif)
        .current_dir(support::repo())
        .env("GO111MODULE", "off")
        .env("GOPATH", "/usr/share/gocode")
        .env("GOCACHE", dir.join("gocache"))
        .output()
        .expect("go is installed (.ci/run installs golang-go and go-sarif)");
    assert!(checked.status.success(), "{}", stderr(&checked));
    let mut results: Vec<String> = stdout(&checked).lines().map(str::to_owned).collect();
    results.sort();
    let relative = Path::new(new_source).strip_prefix(support::repo()).unwrap();
    let at = |rule: &str, marker: &str| {
        let line = support::line_of(new_source, marker);
        format!("{rule} error {}:{line}", relative.display())
    };
    let mut want = vec![
        at("leak/direct", "leak: textures"),
        at("leak/direct", "leak: meshes"),
        at("leak/direct", "leak: scene root"),
        at("leak/direct", "leak: sounds"),
        at("leak/indirect", "leak: scene child"),
    ];
    want.sort();
    assert_eq!(results, want);
}

/// The page as Chromium drew it, after its scripts ran.
fn rendered(page: &Path) -> String {
    let profile = page.with_extension("chromium");
    let out = Command::new("timeout")
        .args([
            "--signal=KILL",
            "120",
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium is installed (.ci/run installs it)");
    let dom = stdout(&out);
    assert!(
        dom.contains("data-rendered-ms="),
        "the page's script did not finish:\n{}",
        stderr(&out)
    );
    dom
}

/// How long the page took from navigation start to the end of its script, in ms.
fn render_ms(dom: &str) -> u64 {
    let at = dom.find("data-rendered-ms=\"").unwrap() + "data-rendered-ms=\"".len();
    dom[at..].split('"').next().unwrap().parse().unwrap()
}

#[test]
fn html_page_shows_the_leaks_in_chromium() {
    let base = &builds().base;
    let dir = support::scratch("readers_html");
    let page = dir.join("leaks.html");
    let out = k15(&["html", path(base), "-o", path(&page)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "no network"
    );
    let dom = rendered(&page);
    for shown in [
        "652 bytes in 6 blocks",
        "Direct leak of <span class=\"size\">300 bytes</span> in 3 blocks",
        "load_textures() (256 bytes, 39.3%)",
        "holds 1 indirect block (48 bytes):",
        "make_child()",
        "No memory errors.",
    ] {
        assert!(dom.contains(shown), "{shown} not in\n{dom}");
    }
}

#[test]
fn html_page_draws_a_timeline_of_many_frames_in_chromium() {
    // More frames than a browser takes as arguments of one call (`Math.max(...series)`).
    let frames = 200_000;
    let bytes: Vec<u64> = (0..frames).map(|i| i % 1000).collect();
    let report = serde_json::json!({
        "format": "k15-leaks/3", "program": "/bin/game", "pid": 1, "summary": {},
        "sites": [], "leaks": [], "frames": [], "stacks": [], "tags": [{ "name": "Render" }],
        "timeline": { "frames": (0..frames).collect::<Vec<u64>>(), "tags": { "Render": bytes } },
    });
    let dir = support::scratch("readers_timeline");
    let json = dir.join("timeline.json");
    std::fs::write(&json, report.to_string()).unwrap();
    let page = dir.join("timeline.html");
    let out = k15(&["html", path(&json), "-o", path(&page)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let dom = rendered(&page);
    for shown in [
        "Live bytes per tag, by frame (peak 999 bytes)",
        "data-metric=\"leaked\"",
    ] {
        assert!(dom.contains(shown), "{shown} not in the page");
    }
}

#[test]
fn html_path_writes_the_page_at_exit() {
    let dir = support::scratch("readers_html_path");
    let exe = support::build(&dir, "app", &[SOURCE], &[]);
    let page = dir.join("page-%p.html");
    let run = support::run(&exe, &format!("html_path={}", page.display()));
    let pid = run.raw_json["pid"].as_u64().unwrap();
    let page = dir.join(format!("page-{pid}.html"));
    assert!(
        run.stderr().contains(&format!("and {}", page.display())),
        "{}",
        run.stderr()
    );
    let dom = rendered(&page);
    assert!(dom.contains("652 bytes in 6 blocks"), "{dom}");
    assert!(dom.contains("load_meshes()"));
}

#[test]
fn a_million_leaks_page_is_small_and_quick() {
    let dir = support::scratch("readers_million");
    let exe = support::build(
        &dir,
        "leak_many",
        &["benches/programs/leak_many.cpp"],
        &["-O1"],
    );
    // 1,000,000 blocks from 1,000 distinct call stacks. Run directly: `support::run` would
    // inflate every block's stack in place, gigabytes for this report.
    let report = dir.join("million.log.json");
    let status = Command::new("timeout")
        .args(["--signal=KILL", "300"])
        .arg(&exe)
        .args(["many_stacks", "1000000", "1000"])
        .env(
            "K15_MEMORY_OPTIONS",
            format!("log_path={}", dir.join("million.log").display()),
        )
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let page = dir.join("million.html");
    let out = k15(&["html", path(&report), "-o", path(&page)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let bytes = std::fs::metadata(&page).unwrap().len();
    assert!(bytes < 20 << 20, "{bytes} bytes");
    let dom = rendered(&page);
    assert!(dom.contains("45.8 MiB in 1,000,000 blocks"), "summary");
    let ms = render_ms(&dom);
    println!("1,000,000-leak page: {bytes} bytes, drawn in {ms} ms");
    assert!(ms < 2000, "{ms} ms");
}

#[test]
fn bad_input_gets_one_line_and_exit_2() {
    let base = &builds().base;
    let dir = support::scratch("readers_bad");
    let write = |name: &str, text: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        path(&p).to_owned()
    };
    let report = std::fs::read(base).unwrap();
    let truncated = write("truncated.json", &report[..report.len() / 2]);
    let other = write("other.json", br#"{"format": "k15-leaks/9", "leaks": []}"#);
    let garbage = write("garbage.json", b"\x00\x01 not json");
    let broken = write("broken.json", br#"{"format": "k15-leaks/2", "sites": [], "leaks": [{"site": 4, "leak_kind": "direct", "size": 1}], "frames": [], "stacks": []}"#);
    let no_kind = write("no_kind.json", br#"{"format": "k15-leaks/2", "sites": [{"stack": null}], "leaks": [{"site": 0, "leak_kind": "", "size": 1}], "frames": [], "stacks": []}"#);
    let scalar_timeline = write("scalar_timeline.json", br#"{"format": "k15-leaks/3", "sites": [], "leaks": [], "frames": [], "stacks": [], "tags": [{"name": "A"}], "timeline": {"frames": [1], "tags": {"A": 5}}}"#);
    let missing = path(&dir.join("missing.json")).to_owned();
    let good = path(base).to_owned();
    let out_file = path(&dir.join("out")).to_owned();
    let mut cases: Vec<(Vec<String>, &str)> = Vec::new();
    for (bad, why) in [
        (&missing, "cannot read"),
        (&truncated, "truncated JSON"),
        (
            &other,
            "format \"k15-leaks/9\" is not one this reader knows",
        ),
        (&garbage, "not JSON"),
        (&broken, "site 4 out of range"),
        (&no_kind, "leak_kind \"\" is not one of"),
        (&scalar_timeline, "timeline: tags.A is not a list"),
    ] {
        let commands: [Vec<&str>; 9] = [
            vec!["show", bad],
            vec!["diff", &good, bad],
            vec!["diff", "--json", bad, &good],
            vec!["merge", &good, bad, "-o", &out_file],
            vec!["html", bad, "-o", &out_file],
            vec!["export", "--pprof", &out_file, bad],
            vec!["export", "--folded", &out_file, bad],
            vec!["export", "--sarif", &out_file, bad],
            vec!["show", bad, "--top", "3"],
        ];
        cases.extend(
            commands
                .into_iter()
                .map(|c| (c.into_iter().map(str::to_owned).collect(), why)),
        );
    }
    for (args, why) in [
        (vec!["show"], "required"),
        (
            vec!["show", &good, "--kind", "sideways"],
            "invalid value 'sideways'",
        ),
        (vec!["show", &good, "--top", "many"], "invalid value 'many'"),
        (vec!["diff", &good], "required"),
        (vec!["merge", &good], "required"),
        (vec!["export", &good], "required"),
        (
            vec!["export", "--pprof", "a", "--sarif", "b", &good],
            "cannot be used with",
        ),
        (vec!["frobnicate"], "unrecognized subcommand"),
        (vec![], "a command is required"),
        (
            vec!["html", &good, "-o", "/nonexistent/dir/x.html"],
            "cannot write",
        ),
    ] {
        cases.push((args.into_iter().map(str::to_owned).collect(), why));
    }
    for (args, why) in cases {
        let out = reader().args(&args).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line, not\n{err}");
        assert!(
            err.starts_with("k15-memory: ") && err.contains(why),
            "{args:?}: {err}"
        );
        assert!(stdout(&out).is_empty(), "{args:?}");
    }
}

#[test]
fn show_and_the_page_list_the_peak_s_consumers_and_the_most_allocations() {
    let dir = support::scratch("readers_profile");
    let exe = support::build(
        &dir,
        "profiler_sites",
        &["tests/cpp/profiler_sites.cpp"],
        &[],
    );
    let run = support::run(&exe, "profile=1");
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = dir.join("profiler_sites.log.json");

    let out = k15(&["show", "--kind", "profile", "--top", "3", path(&report)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let headings: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
        .collect();
    // Three of each list, as the tracker's own report has them (tests/profiler_sites.rs checks
    // those against heaptrack_print).
    assert_eq!(
        headings,
        [
            "  2000 allocations (2000 temporary) of 64000 bytes from:",
            "  2000 allocations (2000 temporary) of 64000 bytes from:",
            "  300 allocations (1 temporary) of 30000 bytes from:",
            "  163840 bytes in 40 blocks from:",
            "  72704 bytes in 1 block from:",
            "  1536 bytes in 3 blocks [Config] from:",
        ],
        "{text}"
    );
    assert!(
        text.contains("Live at the peak (238112 bytes in frame 0; 3 listed):"),
        "{text}"
    );
    assert!(
        text.contains("spawn_particles()") && !text.contains("Direct leak"),
        "{text}"
    );

    let page = dir.join("profile.html");
    let out = k15(&["html", path(&report), "-o", path(&page)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let dom = rendered(&page);
    for shown in [
        "Live at the peak (232.5 KiB)",
        "<summary>160.0 KiB in 40 blocks (anonymous namespace)::load_level()",
        "<summary>1.5 KiB in 3 blocks [Config] (anonymous namespace)::make_config()",
        "<summary>2,000 allocations (2,000 temporary) of 62.5 KiB (anonymous namespace)::spawn_particles()",
        "data-metric=\"peak\"",
        "data-metric=\"temporary\"",
    ] {
        assert!(dom.contains(shown), "{shown} not in\n{dom}");
    }
}
