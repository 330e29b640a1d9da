//! Call stacks in the leak log: captured at allocation, symbolized at exit, innermost user frame
//! first, through inlined code, shared libraries, threads, std::function and Rust.

mod support;
use serde_json::Value;

/// `(function, file name, line, inlined)` of each frame.
fn frames(stack: &Value) -> Vec<(String, String, u64, bool)> {
    stack
        .as_array()
        .expect("a stack")
        .iter()
        .map(|f| {
            let file = f["file"].as_str().unwrap_or("");
            (
                f["function"].as_str().unwrap_or("??").to_owned(),
                file.rsplit('/').next().unwrap().to_owned(),
                f["line"].as_u64().unwrap(),
                f["inlined"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// The leak whose `K15_NEW` site or first frame is the line of `marker` in `source`.
fn leak_at<'a>(run: &'a support::Run, source: &str, marker: &str) -> &'a Value {
    let line = support::line_of(source, marker);
    let first_frame_at = |l: &Value| {
        l["stack"][0]["line"] == line
            && l["stack"][0]["file"]
                .as_str()
                .is_some_and(|f| f.ends_with(source))
    };
    run.leaks()
        .iter()
        .find(|l| (l["line"] == line && l["file"] == source) || first_frame_at(l))
        .unwrap_or_else(|| panic!("no leak at {source}:{line}\n{}", run.text))
}

/// Every leak of a run as (size, frames), sorted: what two builds of one program must share.
type Symbolized = Vec<(Option<u64>, Vec<(String, String, u64, bool)>)>;

fn symbolized(run: &support::Run) -> Symbolized {
    let mut all: Symbolized = run
        .leaks()
        .iter()
        .map(|l| (l["size"].as_u64(), frames(&l["stack"])))
        .collect();
    all.sort();
    all
}

fn function_names(stack: &Value) -> Vec<String> {
    frames(stack).into_iter().map(|f| f.0).collect()
}

#[test]
fn engine_sample_stacks_start_at_the_user_frame() {
    let dir = support::scratch("symbolization_engine");
    let exe = support::build(&dir, "engine", &support::ENGINE_SAMPLE, &[]);
    let run = support::run(&exe, "");
    let world = "samples/engine/world.cpp";

    let sky = frames(&leak_at(&run, world, "K15_NEW Vec3[64]")["stack"]);
    assert_eq!(
        sky[0],
        (
            "engine::World::load_sky()".into(),
            "world.cpp".into(),
            support::line_of(world, "K15_NEW Vec3[64]"),
            false
        )
    );
    assert_eq!((sky[1].0.as_str(), sky[1].1.as_str()), ("main", "main.cpp"));
    assert_eq!(
        sky[1].2,
        support::line_of("samples/engine/main.cpp", "world.load_sky()")
    );
    // As in valgrind, a stack through `main` ends there: libc's start-up and `_start` are not
    // shown unless asked for (`show_below_main=1`, below).
    assert_eq!(sky.len(), 2, "{sky:?}");

    let spawn = frames(&leak_at(&run, world, "K15_NEW Entity;")["stack"]);
    assert_eq!(spawn[0].0, "engine::World::spawn(int, char const*)");

    // The job buffer: from the templated allocator header, through std::function, on a thread.
    let header = "samples/engine/aligned_allocator.h";
    let job = function_names(&leak_at(&run, header, "__FILE__, __LINE__")["stack"]);
    assert!(
        job[0].starts_with("engine::AlignedAllocator<float"),
        "{job:?}"
    );
    assert!(
        job[1].starts_with("engine::AlignedArray<float") && job[1].contains("grow"),
        "{job:?}"
    );
    assert!(
        job.iter()
            .any(|f| f.starts_with("std::function<float ()>::operator()")),
        "{job:?}"
    );
    assert!(
        job.iter().any(|f| f == "start_thread"),
        "through libstdc++'s thread start: {job:?}"
    );
    assert!(
        !job.iter().any(|f| f.contains("start_in_the_record")),
        "the tracker's own thread start is not shown: {job:?}"
    );

    // The text report shows the same frames, numbered.
    assert!(
        run.text.contains("    #0 engine::World::load_sky() "),
        "{}",
        run.text
    );
    assert!(
        !run.text.contains("k15_memory::") && !run.text.contains("operator new"),
        "{}",
        run.text
    );
}

#[test]
fn inlined_frames_show_with_their_own_lines() {
    let dir = support::scratch("symbolization_inlined");
    let exe = support::build(&dir, "inlined", &["tests/cpp/inlined_leak.cpp"], &["-O2"]);
    let run = support::run(&exe, "");
    let source = "tests/cpp/inlined_leak.cpp";
    let stack = frames(&run.leaks()[0]["stack"]);
    let expect = |i: usize, function: &str, marker: &str, inlined: bool| {
        assert_eq!(
            stack[i],
            (
                function.to_owned(),
                "inlined_leak.cpp".to_owned(),
                support::line_of(source, marker),
                inlined
            ),
            "{stack:?}"
        );
    };
    expect(0, "emit_one", "// INNERMOST", true);
    expect(1, "emit_burst", "// MIDDLE", true);
    expect(2, "spawn_particles()", "// OUTER", false);
    assert_eq!(stack[3].0, "main");
}

#[test]
fn stacks_cross_a_shared_library_a_thread_and_std_function() {
    let dir = support::scratch("symbolization_paths");
    let dso = support::build_shared(
        &dir,
        "stack_dso",
        &["tests/cpp/stack_dso.cpp"],
        &["-O2", "-fomit-frame-pointer"],
    );
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let exe = support::build(
        &dir,
        "stack_paths",
        &["tests/cpp/stack_paths.cpp", dso.to_str().unwrap()],
        &[&rpath],
    );
    let run = support::run(&exe, "");
    assert_eq!(run.leaks().len(), 4, "{}", run.text);

    // Before main, from the library's static constructor, called by the dynamic loader.
    let boot = leak_at(&run, "tests/cpp/stack_dso.cpp", "// BEFORE MAIN");
    let boot_stack = function_names(&boot["stack"]);
    assert!(
        boot_stack[0].contains("static_initialization")
            || boot_stack[0].starts_with("_GLOBAL__sub_I"),
        "{boot_stack:?}"
    );
    assert!(
        boot_stack.iter().any(|f| f.contains("_dl_init")),
        "{boot_stack:?}"
    );

    let in_dso = leak_at(&run, "tests/cpp/stack_dso.cpp", "// DSO ALLOC");
    assert_eq!(
        &function_names(&in_dso["stack"])[..2],
        ["dso_make_widget", "main"]
    );

    let source = "tests/cpp/stack_paths.cpp";
    let callback = function_names(&leak_at(&run, source, "// CALLBACK LEAK")["stack"]);
    let expected = [
        "(anonymous namespace)::leak_in_callback(int)",
        "std::function<void (int)>::operator()(int) const",
        "dso_call_back",
        "main",
    ];
    let found: Vec<&String> = callback
        .iter()
        .filter(|f| expected.contains(&f.as_str()))
        .collect();
    assert_eq!(found, expected, "in this order: {callback:?}");

    let threaded = function_names(&leak_at(&run, source, "// FUNCTION LEAK")["stack"]);
    let expected = [
        "std::function<void ()>::operator()() const",
        "(anonymous namespace)::worker_body()",
        "start_thread",
    ];
    let found: Vec<&String> = threaded
        .iter()
        .filter(|f| expected.contains(&f.as_str()))
        .collect();
    assert_eq!(found, expected, "in this order: {threaded:?}");
    assert!(
        threaded[0].contains("lambda"),
        "the lambda is the first frame: {threaded:?}"
    );
}

#[test]
fn pie_and_non_pie_builds_give_the_same_report() {
    let dir = support::scratch("symbolization_pie");
    let sources = support::ENGINE_SAMPLE;
    let pie = support::build(&dir, "engine_pie", &sources, &["-fPIE", "-pie"]);
    let fixed = support::build(&dir, "engine_fixed", &sources, &["-fno-PIE", "-no-pie"]);
    let (a, b) = (support::run(&pie, ""), support::run(&fixed, ""));
    assert_eq!(symbolized(&a), symbolized(&b));
    assert!(symbolized(&a).iter().all(|(_, stack)| stack.len() >= 2));
}

#[test]
fn compressed_debug_sections_give_the_same_report() {
    // `-gz` compresses the program's DWARF with zlib (as Debian's debug files are): the report
    // decompresses only the units its stacks fall into, and must read them as the plain build.
    let dir = support::scratch("symbolization_gz");
    let sources = support::ENGINE_SAMPLE;
    let plain = support::build(&dir, "engine_plain", &sources, &["-O2"]);
    let compressed = support::build(&dir, "engine_gz", &sources, &["-O2", "-gz=zlib"]);
    let sections = std::process::Command::new("readelf")
        .args(["-S", "-W"])
        .arg(&compressed)
        .output()
        .expect("readelf runs");
    let sections = String::from_utf8_lossy(&sections.stdout);
    assert!(
        sections
            .lines()
            .any(|l| l.contains(".debug_info") && l.contains(" C ")),
        "-gz left .debug_info uncompressed:\n{sections}"
    );
    let (a, b) = (support::run(&plain, ""), support::run(&compressed, ""));
    assert_eq!(symbolized(&a), symbolized(&b));
    let world = "samples/engine/world.cpp";
    let sky = frames(&leak_at(&b, world, "K15_NEW Vec3[64]")["stack"]);
    assert_eq!(
        (sky[0].0.as_str(), sky[0].2),
        (
            "engine::World::load_sky()",
            support::line_of(world, "K15_NEW Vec3[64]")
        )
    );
}

#[test]
fn compressed_dwarf_is_read_once_and_only_for_the_frames_shown() {
    let dir = support::scratch("symbolization_gz_memory");
    let exe = support::build(
        &dir,
        "engine_gz",
        &support::ENGINE_SAMPLE,
        &["-O2", "-gz=zlib"],
    );
    // Finding `main` (to cut the frames below it) once read the program's DWARF for every
    // frame, `_start` too: no unit covers `_start`, so every unit `.debug_aranges` leaves out
    // was decompressed (all of rustc's, the tracker's own), and since rustc's units refer to
    // each other, `.debug_info` whole; then the report read it all again. 20 MiB over the run
    // without the report; now the symbol table finds `main`, and the sections every lookup
    // needs (strings, ranges: mostly the tracker's own) are decompressed once, about 12 MiB.
    let run = support::run(&exe, "");
    let world = "samples/engine/world.cpp";
    let sky = frames(&leak_at(&run, world, "K15_NEW Vec3[64]")["stack"]);
    assert_eq!(sky[0].0, "engine::World::load_sky()");
    assert_eq!(sky.last().map(|f| f.0.as_str()), Some("main"));
    let (silent, reported) = (
        least_peak_rss_kib(&exe, "report=0"),
        least_peak_rss_kib(&exe, ""),
    );
    println!("peak RSS {reported} KiB with the report, {silent} KiB without");
    assert!(
        reported - silent < 16 * 1024,
        "the report raised the peak from {silent} KiB to {reported} KiB"
    );
}

#[test]
fn stack_depth_zero_gives_empty_stacks() {
    let dir = support::scratch("symbolization_depth0");
    let exe = support::build(&dir, "engine", &support::ENGINE_SAMPLE, &[]);
    let run = support::run(&exe, "stack_depth=0");
    assert_eq!(run.leaks().len(), 3);
    assert!(run
        .leaks()
        .iter()
        .all(|l| l["stack"].as_array().unwrap().is_empty()));
    assert!(run.text.contains("(no call stack"), "{}", run.text);
}

#[test]
fn memory_errors_carry_the_allocation_and_the_free_stacks() {
    let dir = support::scratch("symbolization_errors");
    let flags = [
        "-Wno-mismatched-new-delete",
        "-Wno-free-nonheap-object",
        "-Wno-use-after-free",
    ];
    let exe = support::build(
        &dir,
        "memory_errors",
        &["tests/cpp/memory_errors.cpp"],
        &flags,
    );
    let run = support::run(&exe, "");
    let mismatch = &run.errors()[0];
    assert_eq!(function_names(&mismatch["alloc_stack"])[0], "main");
    assert_eq!(
        function_names(&mismatch["free_stack"])[..2],
        [
            "(anonymous namespace)::free_array_with_delete(int*)",
            "main"
        ]
    );
    assert!(
        run.stderr()
            .contains("#0 (anonymous namespace)::free_array_with_delete(int*)"),
        "{}",
        run.stderr()
    );
}

#[test]
fn the_frame_pointer_unwinder_gives_the_same_stacks_in_a_debug_build() {
    let dir = support::scratch("symbolization_frame_pointer");
    let exe = support::build(&dir, "engine", &support::ENGINE_SAMPLE, &[]);
    let first_frames = |run: &support::Run| {
        let mut frames: Vec<(String, u64)> = run
            .leaks()
            .iter()
            .map(|l| {
                (
                    l["stack"][0]["function"].as_str().unwrap().to_owned(),
                    l["stack"][0]["line"].as_u64().unwrap(),
                )
            })
            .collect();
        frames.sort();
        frames
    };
    let dwarf = support::run(&exe, "");
    let frame_pointer = support::run(&exe, "unwinder=frame_pointer");
    assert_eq!(first_frames(&frame_pointer), first_frames(&dwarf));
    assert!(
        frame_pointer
            .leaks()
            .iter()
            .all(|l| l["stack"].as_array().unwrap().len() >= 2),
        "{}",
        frame_pointer.text
    );
}

/// Peak resident memory (KiB) of one run of `exe` with `options`, its log in the scratch dir.
fn peak_rss_kib(exe: &std::path::Path, options: &str) -> i64 {
    let log = exe.with_extension("rss.log");
    let (status, _, peak) = support::run_measured(
        std::process::Command::new(exe)
            .current_dir(exe.parent().unwrap())
            .env(
                "K15_MEMORY_OPTIONS",
                format!("log_path={}:{options}", log.display()),
            ),
    );
    assert!(libc::WIFEXITED(status), "status {status:#x}");
    peak
}

/// The least of three runs' peaks: page-cache and fault-around timing make single runs differ
/// by a few pages.
fn least_peak_rss_kib(exe: &std::path::Path, options: &str) -> i64 {
    (0..3).map(|_| peak_rss_kib(exe, options)).min().unwrap()
}

#[test]
fn symbolizing_at_exit_loads_only_what_the_reported_stacks_need() {
    let dir = support::scratch("symbolization_memory");
    let exe = support::build(&dir, "engine", &support::ENGINE_SAMPLE, &["-O2"]);
    // The report is complete: user frames with lines, and libc's frames below main, asked for.
    let run = support::run(&exe, "show_below_main=1");
    let world = "samples/engine/world.cpp";
    let sky = frames(&leak_at(&run, world, "K15_NEW Vec3[64]")["stack"]);
    assert_eq!(sky[0].0, "engine::World::load_sky()");
    assert!(
        sky.iter().any(|f| f.0.starts_with("__libc_start")),
        "{sky:?}"
    );
    // Symbolizing three stacks through the program, libstdc++ and libc once cost 50 MiB of
    // peak RSS (every unit of each module parsed, every DWARF section decompressed), then about
    // 6 MiB (libc's compressed sections decompressed whole, all modules held to the end); now
    // one module at a time, one unit at a time, only the units the stacks fall into
    // decompressed: about 4 MiB over the run without stacks, the depot and rules included.
    let without = peak_rss_kib(&exe, "stack_depth=0");
    let with = peak_rss_kib(&exe, "show_below_main=1");
    println!("peak RSS {with} KiB with stacks, {without} KiB without");
    assert!(
        with - without < 8 * 1024,
        "peak RSS {with} KiB with stacks against {without} KiB without"
    );
}

#[test]
fn the_report_at_exit_fits_in_the_memory_the_heap_gave_up() {
    let dir = support::scratch("symbolization_report_peak");
    let exe = support::build(
        &dir,
        "report_peak",
        &["tests/cpp/report_peak.cpp"],
        &["-O2"],
    );
    let run = support::run(&exe, "show_below_main=1");
    let leak = frames(&leak_at(&run, "tests/cpp/report_peak.cpp", "LEAKED AT THE END")["stack"]);
    assert!(
        leak.iter().any(|f| f.0.starts_with("__libc_start")),
        "the report symbolized libc's frames too: {leak:?}"
    );
    let silent = least_peak_rss_kib(&exe, "report=0");
    let reported = least_peak_rss_kib(&exe, "show_below_main=1");
    println!("peak RSS {reported} KiB with the report, {silent} KiB without");
    assert!(
        reported - silent < 1024,
        "the report raised the peak from {silent} KiB to {reported} KiB"
    );
}
