//! Modules that come and go: stacks captured in a plugin since unloaded, in a library later
//! mapped at the same address, and in each generation of a hot-reloaded plugin are symbolized
//! against the module that was mapped when they were captured.

mod support;

fn plugin(dir: &std::path::Path, name: &str, function: &str) -> std::path::PathBuf {
    let define = format!("-DPLUGIN_NAME={function}");
    support::build_shared(dir, name, &["tests/cpp/plugin.cpp"], &[&define])
}

/// The leak of `size`: its innermost frame's function and file.
fn top_frame(run: &support::Run, size: u64) -> (String, String) {
    let leak = run
        .leaks()
        .iter()
        .find(|l| l["size"] == size)
        .unwrap_or_else(|| panic!("no leak of {size}:\n{}", run.text));
    let top = &leak["stack"][0];
    (
        top["function"].as_str().unwrap_or("??").to_owned(),
        top["file"].as_str().unwrap_or("?").to_owned(),
    )
}

#[test]
fn a_library_mapped_where_an_unloaded_plugin_was_does_not_take_its_frames() {
    let dir = support::scratch("module_history_replace");
    let a = plugin(&dir, "alpha", "alpha_allocates");
    let b = plugin(&dir, "beta", "beta_allocates");
    let exe = support::build(&dir, "plugin_host", &["tests/cpp/plugin_host.cpp"], &[]);
    let run = support::run_with(
        &exe,
        "replace",
        "",
        &[],
        &["replace", a.to_str().unwrap(), b.to_str().unwrap()],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let bases: Vec<String> = run
        .stdout()
        .split_whitespace()
        .skip(1)
        .map(str::to_owned)
        .collect();
    assert_eq!(
        bases[0], bases[1],
        "the second library was not mapped where the first was: the case is not exercised"
    );
    assert_eq!(
        top_frame(&run, 301).0,
        "alpha_allocates(int)",
        "{}",
        run.text
    );
    assert_eq!(
        top_frame(&run, 303).0,
        "beta_allocates(int)",
        "{}",
        run.text
    );
    assert!(top_frame(&run, 301).1.ends_with("tests/cpp/plugin.cpp"));
    // Both report their own module's path.
    let module = |size: u64| {
        let leak = run.leaks().iter().find(|l| l["size"] == size).unwrap();
        leak["stack"][0]["module"].as_str().unwrap().to_owned()
    };
    assert!(module(301).ends_with("libalpha.so"), "{}", module(301));
    assert!(module(303).ends_with("libbeta.so"), "{}", module(303));
}

#[test]
fn each_generation_of_a_hot_reloaded_plugin_keeps_its_own_symbols() {
    let dir = support::scratch("module_history_reload");
    let generations: Vec<std::path::PathBuf> = (1..=3)
        .map(|g| {
            plugin(
                &dir,
                &format!("game_gen{g}"),
                &format!("generation_{g}_allocates"),
            )
        })
        .collect();
    let exe = support::build(&dir, "plugin_host", &["tests/cpp/plugin_host.cpp"], &[]);
    let target = dir.join("libgame.so");
    let mut args = vec!["reload".to_owned(), target.display().to_string()];
    args.extend(generations.iter().map(|g| g.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = support::run_with(&exe, "reload", "", &[], &args);
    assert!(
        run.output.status.success(),
        "{}{}",
        run.stdout(),
        run.stderr()
    );
    for g in 1..=3u64 {
        let (function, file) = top_frame(&run, 400 + g);
        assert_eq!(
            function,
            format!("generation_{g}_allocates(int)"),
            "{}",
            run.text
        );
        assert!(file.ends_with("tests/cpp/plugin.cpp"), "{file}");
    }
    // Three direct leaks, one per generation, none of them unsymbolized.
    assert_eq!(run.json["summary"]["direct_blocks"], 3, "{}", run.text);
    assert!(!run.text.contains("??"), "{}", run.text);
}
