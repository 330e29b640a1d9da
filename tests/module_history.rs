//! Modules that come and go: stacks captured in a plugin since unloaded, in a library later
//! mapped at the same address, and in each generation of a hot-reloaded plugin are symbolized
//! against the module that was mapped when they were captured, and walked by the unwind rules
//! of the module mapped when they were captured.

mod support;

fn plugin(dir: &std::path::Path, name: &str, function: &str) -> std::path::PathBuf {
    let define = format!("-DPLUGIN_NAME={function}");
    support::build_shared(dir, name, &["tests/cpp/plugin.cpp"], &[&define])
}

/// The leak of `size` in `run`'s report.
fn leak_of(run: &support::Run, size: u64) -> &serde_json::Value {
    run.leaks()
        .iter()
        .find(|l| l["size"] == size)
        .unwrap_or_else(|| panic!("no leak of {size}:\n{}", run.text))
}

/// The leak of `size`: its innermost frame's function and file.
fn top_frame(run: &support::Run, size: u64) -> (String, String) {
    let top = &leak_of(run, size)["stack"][0];
    (
        top["function"].as_str().unwrap_or("??").to_owned(),
        top["file"].as_str().unwrap_or("?").to_owned(),
    )
}

/// Runs the host's `replace a b` (`a` leaks 301 bytes and is unloaded, then `b` is loaded and
/// leaks 303) and checks that `b` was mapped where `a` was, the case under test.
fn replace_at_one_address(
    exe: &std::path::Path,
    a: &std::path::Path,
    b: &std::path::Path,
) -> support::Run {
    let run = support::run_with(
        exe,
        "replace",
        "",
        &[],
        &["replace", a.to_str().unwrap(), b.to_str().unwrap()],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let stdout = run.stdout();
    let bases: Vec<&str> = stdout.split_whitespace().skip(1).collect();
    assert_eq!(
        bases[0], bases[1],
        "the second library was not mapped where the first was: the case is not exercised"
    );
    run
}

#[test]
fn a_library_mapped_where_an_unloaded_plugin_was_does_not_take_its_frames() {
    let dir = support::scratch("module_history_replace");
    let a = plugin(&dir, "alpha", "alpha_allocates");
    let b = plugin(&dir, "beta", "beta_allocates");
    let exe = support::build(&dir, "plugin_host", &["tests/cpp/plugin_host.cpp"], &[]);
    let run = replace_at_one_address(&exe, &a, &b);
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
        leak_of(&run, size)["stack"][0]["module"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(module(301).ends_with("libalpha.so"), "{}", module(301));
    assert!(module(303).ends_with("libbeta.so"), "{}", module(303));
}

/// The functions of the leak of `size`'s stack, innermost first.
fn stack_functions(run: &support::Run, size: u64) -> Vec<String> {
    leak_of(run, size)["stack"]
        .as_array()
        .unwrap()
        .iter()
        .map(|frame| frame["function"].as_str().unwrap_or("??").to_owned())
        .collect()
}

/// A plugin unloaded and another loaded at its very place, whose function lies at the same
/// address but keeps a frame of another size (1000 and 3000 bytes of locals, built at -O2): the
/// second is walked by its own unwind rules, not by those compiled for the first at the same
/// return address (the process keeps one set of rules across module changes and forgets those
/// of a module that goes). Both stacks go on to the host's `call` and `main`; walked by the first
/// plugin's rules, the second's went from its function to a stale word of its frame (a function
/// of the tracker's) instead.
#[test]
fn a_library_mapped_where_an_unloaded_plugin_was_is_walked_by_its_own_rules() {
    let dir = support::scratch("module_history_rules");
    let framed = |name: &str, bytes: u32| {
        let function = format!("-DPLUGIN_NAME={name}_framed");
        let frame = format!("-DPLUGIN_FRAME={bytes}");
        let flags = [function.as_str(), frame.as_str(), "-O2"];
        support::build_shared(&dir, name, &["tests/cpp/plugin.cpp"], &flags)
    };
    let (a, b) = (framed("alpha", 1000), framed("gamma", 3000));
    let exe = support::build(&dir, "plugin_host", &["tests/cpp/plugin_host.cpp"], &[]);
    let run = replace_at_one_address(&exe, &a, &b);
    for (size, function) in [(301, "alpha_framed(int)"), (303, "gamma_framed(int)")] {
        let functions = stack_functions(&run, size);
        assert_eq!(functions[0], function, "{}", run.text);
        assert_eq!(
            functions[1..3],
            ["(anonymous namespace)::call(void*, int)", "main"],
            "{}",
            run.text
        );
    }
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

/// A plugin loaded, called (its stack walked through it) and unloaded 2,000 times: each cycle
/// adds about 8 KiB of resident memory (the two module snapshots it makes and the history's
/// record), where it added 224 KiB when each snapshot compiled unwind rules of its own.
#[test]
fn a_plugin_reloaded_thousands_of_times_adds_little_memory_per_reload() {
    let dir = support::scratch("module_history_cycles");
    let lib = plugin(&dir, "cycled", "cycled_allocates");
    let exe = support::build(&dir, "plugin_host", &["tests/cpp/plugin_host.cpp"], &[]);
    let run = support::run_with(
        &exe,
        "cycles",
        "",
        &[],
        &["cycles", lib.to_str().unwrap(), "2000"],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let per_cycle: f64 = run
        .stdout()
        .split_whitespace()
        .nth(1)
        .and_then(|kib| kib.parse().ok())
        .unwrap_or_else(|| panic!("no kib_per_cycle in {}", run.stdout()));
    assert!(per_cycle < 32.0, "{per_cycle} KiB per load and unload");
    assert_eq!(run.json["summary"]["leaked_blocks"], 0, "{}", run.text);
}
