//! A program that changes its working directory before it exits: the options' relative paths
//! (`log_path`'s default `k15_leaks.log`, `suppressions=`) name files in the directory it
//! started in, where the user looks.

mod support;

/// Before, the report went to the directory the program had moved to (or to stderr, where
/// that was not writable), and the suppressions file was looked for there.
#[test]
fn relative_paths_name_files_where_the_program_started_after_it_changes_directory() {
    let dir = support::scratch("moves_directory");
    let source = "tests/cpp/moves_directory.cpp";
    let exe = support::build(&dir, "moves_directory", &[source], &[]);
    let elsewhere = dir.join("data");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(dir.join("rules.supp"), "leak:*vendor_cache*\n").unwrap();
    // The relative `log_path` after `run_with`'s own names the same file, from where the
    // program starts.
    let options = "log_path=moved.log:suppressions=rules.supp";
    let elsewhere_arg = elsewhere.to_str().unwrap();
    let run = support::run_with(&exe, "moved", options, &[], &[elsewhere_arg]);
    let stderr = run.stderr();
    assert!(run.output.status.success(), "{stderr}");
    assert!(
        !elsewhere.join("moved.log").exists(),
        "written where it moved to"
    );
    let written = dir.join("moved.log");
    assert!(
        stderr.contains(&format!("see {}", written.display())),
        "{stderr}"
    );
    let json = &run.json;
    let leaks = json["leaks"].as_array().expect("the JSON report");
    let leak_line = support::line_of(source, "// LEAK");
    let direct: Vec<(u64, u64)> = leaks
        .iter()
        .filter(|leak| leak["leak_kind"] == "direct")
        .map(|leak| {
            let line = leak["stack"][0]["line"].as_u64().unwrap_or(0);
            (leak["size"].as_u64().unwrap(), line)
        })
        .collect();
    assert_eq!(direct, [(33, leak_line)], "{json}");
    assert_eq!(json["suppressions"][0]["blocks"], 1, "{json}");
}
