//! The real-code benchmark: two real programs, each built once at `-O2 -g` from Debian's source
//! package and linked plain, under the tracker and under LeakSanitizer; CPU time (user + system,
//! which other processes on a shared machine disturb far less than wall time) and peak RSS of
//! each, ratios to plain in one run. The suites ([`yaml_cpp`], [`bullet`]):
//!
//! - yaml-cpp's own test suite (980 gtest tests over a recursive-descent parser, node graphs and
//!   emitters; deep template stacks, many small allocations);
//! - Bullet physics (`benches/programs/bullet_scenes.cpp` over the library built from its Debian
//!   source: levels of rigid bodies, ragdolls, convex hulls, a triangle-mesh terrain with rays,
//!   soft bodies, Featherstone chains and spawned projectiles, loaded, stepped and unloaded;
//!   float-heavy stepping between bursts of allocation at each level's load and unload).
//!
//! Every variant is linked in the same four layouts of the program's code (see
//! [`relink_in_layouts`]), and each round's ratios compare variants in one layout.
//! `cargo bench --bench real_code` runs both; `K15_BENCH_SUITE=yaml-cpp` or `=bullet` one (needs
//! `deb-src` access, `dpkg-dev`, `cmake`, `libgtest-dev`, `libgmock-dev`; the sources and builds
//! are kept under `target/` between runs).

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Rounds by default (ten in each layout); `K15_BENCH_ROUNDS` sets another number.
const RUNS: usize = 40;

/// A real program to measure, built: how to link it again and how to run it.
struct Suite {
    /// Debian's source package it comes from.
    package: &'static str,
    /// What it runs, for the table's title.
    what: &'static str,
    /// Where its build's link line runs, and where the programs linked again go.
    dir: PathBuf,
    /// The build's own link line, which names its output `-o {program}`.
    link_line: String,
    program: &'static str,
    /// The program's hottest function, which [`relink_in_layouts`] places.
    hot_symbol: &'static str,
    args: &'static [&'static str],
}

fn run_ok(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Downloads and unpacks Debian's source package `package` (bookworm) with a private apt state
/// under `work`: the machine's own apt configuration (which may have no `deb-src` lines) is left
/// untouched.
fn debian_source(work: &Path, package: &str) -> PathBuf {
    let src = work.join("source");
    if src.join("CMakeLists.txt").exists() {
        return src;
    }
    let apt = work.join("apt");
    std::fs::create_dir_all(apt.join("lists/partial")).unwrap();
    std::fs::write(
        apt.join("sources.list"),
        "deb-src http://deb.debian.org/debian bookworm main\n",
    )
    .unwrap();
    let apt_get = |args: &[&str]| {
        let mut cmd = Command::new("apt-get");
        cmd.current_dir(work)
            .arg("-q")
            .arg(format!(
                "-oDir::Etc::SourceList={}",
                apt.join("sources.list").display()
            ))
            .arg("-oDir::Etc::SourceParts=/dev/null")
            .arg(format!(
                "-oDir::State::Lists={}",
                apt.join("lists").display()
            ))
            .args(args);
        cmd
    };
    run_ok(&mut apt_get(&["update"]), "apt-get update (deb-src)");
    run_ok(
        &mut apt_get(&["source", "--download-only", package]),
        "apt-get source",
    );
    let dsc = std::fs::read_dir(work)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "dsc"))
        .expect("apt-get source left a .dsc");
    let _ = std::fs::remove_dir_all(&src);
    run_ok(
        Command::new("dpkg-source")
            .current_dir(work)
            .arg("-x")
            .arg(&dsc)
            .arg(&src),
        "dpkg-source -x",
    );
    src
}

/// Configures the CMake project in `src` in `build` with `options`, at `-O2 -g` (Debian's own
/// optimization, without the hardening that would differ between variants), and makes `targets`.
fn cmake_build(src: &Path, build: &Path, options: &[&str], targets: &[&str]) {
    std::fs::create_dir_all(build).unwrap();
    run_ok(
        Command::new("cmake")
            .current_dir(build)
            .arg(src)
            .args(["-DCMAKE_BUILD_TYPE=None", "-DCMAKE_CXX_FLAGS=-O2 -g"])
            .args(options),
        "cmake",
    );
    run_ok(
        Command::new("make")
            .current_dir(build)
            .arg("-j2")
            .args(targets),
        &format!("make {}", targets.join(" ")),
    );
}

/// yaml-cpp's library and its test program ([`cmake_build`]).
fn yaml_cpp(work: &Path) -> Suite {
    let src = debian_source(work, "yaml-cpp");
    let build = work.join("build");
    let tests = build.join("test");
    if !tests.join("yaml-cpp-tests").exists() {
        cmake_build(
            &src,
            &build,
            &[
                "-DYAML_CPP_BUILD_TESTS=ON",
                "-DYAML_CPP_BUILD_TOOLS=OFF",
                "-DINSTALL_GTEST=OFF",
            ],
            &["yaml-cpp-tests"],
        );
    }
    let link_line = std::fs::read_to_string(tests.join("CMakeFiles/yaml-cpp-tests.dir/link.txt"))
        .expect("cmake's link line");
    Suite {
        package: "yaml-cpp",
        what: "yaml-cpp's test suite (980 tests)",
        dir: tests,
        link_line: link_line.trim().to_owned(),
        program: "yaml-cpp-tests",
        // A third of plain's time: the regular expressions' matcher.
        hot_symbol: "_ZNK4YAML5RegEx14MatchUncheckedINS_16StringCharSourceEEEiRKT_",
        args: &["--gtest_brief=1"],
    }
}

/// Bullet's libraries (collision, rigid and soft body dynamics, Featherstone) built as static
/// archives at `-O2 -g` from Debian's source, which leaves out upstream's `examples/` (its
/// BenchmarkDemo among them): the program driving them is `benches/programs/bullet_scenes.cpp`,
/// compiled against those headers and linked with those archives.
fn bullet(work: &Path) -> Suite {
    let src = debian_source(work, "bullet");
    let build = work.join("build");
    let archives = [
        "src/BulletSoftBody/libBulletSoftBody.a",
        "src/BulletDynamics/libBulletDynamics.a",
        "src/BulletCollision/libBulletCollision.a",
        "src/LinearMath/libLinearMath.a",
    ];
    if !archives.iter().all(|a| build.join(a).exists()) {
        cmake_build(
            &src,
            &build,
            &[
                "-DBUILD_SHARED_LIBS=OFF",
                "-DBUILD_EXTRAS=OFF",
                "-DBUILD_UNIT_TESTS=OFF",
                "-DBUILD_CPU_DEMOS=OFF",
                "-DBUILD_OPENGL3_DEMOS=OFF",
                "-DBUILD_BULLET2_DEMOS=OFF",
                "-DBUILD_BULLET3=OFF",
                "-DBUILD_PYBULLET=OFF",
            ],
            &[
                "BulletSoftBody",
                "BulletDynamics",
                "BulletCollision",
                "LinearMath",
            ],
        );
    }
    let program = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/programs/bullet_scenes.cpp");
    // Compiled on every run (a second): the source is this repository's.
    run_ok(
        Command::new("g++")
            .current_dir(&build)
            .args(["-std=c++17", "-O2", "-g", "-isystem"])
            .arg(src.join("src"))
            .arg("-c")
            .arg(&program)
            .args(["-o", "bullet_scenes.o"]),
        "compiling bullet_scenes.cpp",
    );
    Suite {
        package: "bullet",
        what: "Bullet physics scenes (7 levels, 2 rounds)",
        dir: build,
        link_line: format!("g++ -O2 -g bullet_scenes.o -o bullet_scenes {}", archives.join(" ")),
        program: "bullet_scenes",
        // The constraint solver's inner loop (a static function): a tenth of plain's
        // instructions, the most of any function.
        hot_symbol: "_ZL51gResolveSingleConstraintRowGeneric_scalar_referenceR12btSolverBodyS0_RK18btSolverConstraint",
        args: &["2"],
    }
}

/// Links the suite's program again as `name` with `extra` appended to its build's own link line
/// (which runs in the suite's directory), e.g. the tracker's archive after every object, and
/// `pad` (an object of nothing but [`pad_object`]'s bytes) in front of every object.
fn relink(suite: &Suite, name: &str, extra: &[&Path], pad: Option<&Path>) -> PathBuf {
    let mut line = suite
        .link_line
        .replace(&format!("-o {}", suite.program), &format!("-o {name}"));
    if let Some(pad) = pad {
        // After the compiler's name: the first input file.
        line = line.replacen(' ', &format!(" {} ", pad.display()), 1);
    }
    for e in extra {
        line.push(' ');
        line.push_str(&e.display().to_string());
    }
    run_ok(
        Command::new("sh")
            .current_dir(&suite.dir)
            .args(["-c", &line]),
        &format!("linking {name}"),
    );
    suite.dir.join(name)
}

/// Layouts of the program's code each variant is linked in: the hot function at plain's own
/// address, then 16, 32 and 48 bytes further, modulo [`LAYOUT_PERIOD`].
const LAYOUTS: u64 = 4;
const LAYOUT_STEP: u64 = 16;
const LAYOUT_PERIOD: u64 = 4096;

/// Where `symbol` lies in `exe` (`nm`).
fn address_of(exe: &Path, symbol: &str) -> u64 {
    let out = Command::new("nm")
        .arg(exe)
        .output()
        .expect("nm runs (binutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            let address = words.next()?;
            (words.nth(1)? == symbol).then(|| u64::from_str_radix(address, 16).ok())?
        })
        .unwrap_or_else(|| panic!("{symbol} not in {}", exe.display()))
}

/// An object whose code section (`.text.unlikely`, which the linker places before all other
/// code) is `bytes` long: linked first, it moves the program's code by that much.
fn pad_object(work: &Path, bytes: u64) -> PathBuf {
    let object = work.join(format!("pad{bytes}.o"));
    if !object.exists() {
        let source = work.join(format!("pad{bytes}.s"));
        std::fs::write(
            &source,
            format!(
                ".section .text.unlikely,\"ax\",@progbits\n.skip {bytes}\n\
                 .section .note.GNU-stack,\"\",@progbits\n"
            ),
        )
        .unwrap();
        run_ok(
            Command::new("as").arg(&source).arg("-o").arg(&object),
            "as (the padding object)",
        );
    }
    object
}

/// The suite's program linked as `name` with `extra` ([`relink`]) once per layout: its hot
/// function at `targets[j]` modulo [`LAYOUT_PERIOD`] in the `j`th.
///
/// The code a library links in before the program's (its cold functions, in `.text.unlikely`)
/// moves the program's own code: the tracker's moved the hot loop of yaml-cpp's suite by 144 bytes,
/// and plain glibc ran 9% faster with its code 48 bytes further on (paired rounds, one session). Each
/// round compares the variants in one layout, so a ratio measures what the variant adds, not where
/// the linker happened to put the program's loops, and the rounds go through the layouts in turn.
fn relink_in_layouts(
    suite: &Suite,
    work: &Path,
    name: &str,
    extra: &[&Path],
    targets: &[u64],
) -> Vec<PathBuf> {
    let natural = address_of(&relink(suite, name, extra, None), suite.hot_symbol);
    targets
        .iter()
        .enumerate()
        .map(|(j, &target)| {
            let layout_name = format!("{name}-layout{j}");
            let mut pad = target.wrapping_sub(natural) % LAYOUT_PERIOD;
            // A section aligned more strictly than the pad may take part of it up: move on by
            // what is still missing.
            for _ in 0..4 {
                let exe = relink(suite, &layout_name, extra, Some(&pad_object(work, pad)));
                let off = target.wrapping_sub(address_of(&exe, suite.hot_symbol)) % LAYOUT_PERIOD;
                if off == 0 {
                    return exe;
                }
                pad = (pad + off) % LAYOUT_PERIOD;
            }
            panic!("{layout_name}: the hot function cannot be placed at {target:#x}");
        })
        .collect()
}

struct Variant {
    name: &'static str,
    /// The program in each layout.
    exes: Vec<PathBuf>,
    env: Vec<(&'static str, String)>,
}

/// CPU seconds (user + system) and peak RSS (KiB) of one run in layout `layout`; panics if the
/// program fails.
fn run_once(suite: &Suite, v: &Variant, layout: usize, dir: &Path) -> (f64, i64) {
    let (status, secs, rss) = support::run_measured(
        Command::new(&v.exes[layout])
            .args(suite.args)
            .current_dir(dir)
            .envs(v.env.iter().map(|(k, val)| (*k, val.as_str()))),
    );
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{} failed (status {status:#x})",
        v.name
    );
    (secs, rss)
}

/// Links `suite` plain, under the tracker and under LeakSanitizer in every layout, measures the
/// variants in `rounds` interleaved rounds and prints the table.
fn measure(suite: &Suite, work: &Path, rounds: usize) {
    let lib = support::static_lib();
    let plain_at = address_of(&relink(suite, suite.program, &[], None), suite.hot_symbol);
    let targets: Vec<u64> = (0..LAYOUTS).map(|j| plain_at + j * LAYOUT_STEP).collect();
    let in_layouts = |variant: &str, extra: &[&Path]| {
        let name = format!("{}-{variant}", suite.program);
        relink_in_layouts(suite, work, &name, extra, &targets)
    };
    let plain = in_layouts("plain", &[]);
    let tracked = in_layouts("k15", &[lib]);
    let lsan = in_layouts("lsan", &[Path::new("-fsanitize=leak")]);

    let dir = support::scratch(&format!("bench_real_code_{}", suite.package));
    let k15 = |name, exes: &Vec<PathBuf>, options: &str| Variant {
        name,
        exes: exes.clone(),
        env: vec![("K15_MEMORY_OPTIONS", options.to_owned())],
    };
    let variants = [
        Variant {
            name: "plain glibc (baseline)",
            exes: plain,
            env: vec![],
        },
        k15("k15, stack_depth=0", &tracked, "stack_depth=0"),
        k15("k15, default (DWARF stacks, report)", &tracked, ""),
        k15(
            "k15, default, show_below_main=1",
            &tracked,
            "show_below_main=1",
        ),
        k15(
            "k15, stacks (frame pointers)",
            &tracked,
            "unwinder=frame_pointer",
        ),
        k15("k15, stacks (DWARF), report=0", &tracked, "report=0"),
        Variant {
            name: "LeakSanitizer (g++ -fsanitize=leak)",
            exes: lsan,
            env: vec![],
        },
    ];

    // Rounds of one run per variant, so that a slow spell of a shared machine falls on every
    // variant alike. A run of yaml-cpp's suite varies by a third on a shared VM (plain: 0.17 to
    // 0.29 s), so the figure to read is the median of the per-round ratios to plain, over many
    // rounds, with its interquartile range; best and median times are printed beside it.
    let mut runs: Vec<Vec<(f64, i64)>> = vec![Vec::with_capacity(rounds); variants.len()];
    for round in 0..rounds {
        let layout = round % LAYOUTS as usize;
        for (v, taken) in variants.iter().zip(&mut runs) {
            taken.push(run_once(suite, v, layout, &dir));
        }
    }
    println!(
        "\n{}, built -O2 -g: {rounds} interleaved rounds, each in one of {LAYOUTS} code layouts \
         in turn: CPU time (best, median), the median and quartiles of each round's ratio to \
         plain in the same layout, and peak RSS (least):",
        suite.what
    );
    println!(
        "  {:<42} {:>7} {:>7} {:>8} {:>15} {:>9} {:>8}",
        "variant", "best s", "median", "vs plain", "quartiles", "peak MiB", "vs plain"
    );
    let sorted = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs
    };
    let quantile = |xs: &[f64], q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    let plain_by_layout: Vec<String> = (0..LAYOUTS as usize)
        .map(|layout| {
            let secs = sorted(
                runs[0]
                    .iter()
                    .skip(layout)
                    .step_by(LAYOUTS as usize)
                    .map(|r| r.0)
                    .collect(),
            );
            if secs.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.3}", quantile(&secs, 0.5))
            }
        })
        .collect();
    let base_rss = runs[0].iter().map(|r| r.1).min().unwrap_or(0);
    for (v, taken) in variants.iter().zip(&runs) {
        let secs = sorted(taken.iter().map(|r| r.0).collect());
        let ratios = sorted(taken.iter().zip(&runs[0]).map(|(r, b)| r.0 / b.0).collect());
        let rss = taken.iter().map(|r| r.1).min().unwrap_or(0);
        println!(
            "  {:<42} {:>7.3} {:>7.3} {:>7.2}x {:>15} {:>9.1} {:>7.2}x",
            v.name,
            secs[0],
            quantile(&secs, 0.5),
            quantile(&ratios, 0.5),
            format!(
                "{:.2}-{:.2}x",
                quantile(&ratios, 0.25),
                quantile(&ratios, 0.75)
            ),
            rss as f64 / 1024.0,
            rss as f64 / base_rss as f64
        );
    }
    println!(
        "  plain's median CPU s in each layout (the hot loop {LAYOUT_STEP} bytes further each): {}",
        plain_by_layout.join(", ")
    );
}

/// Builds a suite in the folder given.
type SuiteBuilder = fn(&Path) -> Suite;
/// The suites, by the names `K15_BENCH_SUITE` picks them by.
const SUITES: [(&str, SuiteBuilder); 2] = [("yaml-cpp", yaml_cpp), ("bullet", bullet)];

fn main() {
    let rounds = std::env::var("K15_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|&r| r > 0)
        .unwrap_or(RUNS);
    let only = std::env::var("K15_BENCH_SUITE").ok();
    assert!(
        only.as_deref()
            .is_none_or(|o| SUITES.iter().any(|(name, _)| *name == o)),
        "K15_BENCH_SUITE: yaml-cpp or bullet"
    );
    for (name, build) in SUITES {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        // yaml-cpp's folder keeps its first name: benches/scaling.py reads its build there.
        let folder = if name == "yaml-cpp" {
            "real_code".to_owned()
        } else {
            format!("real_code_{name}")
        };
        let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join(folder);
        std::fs::create_dir_all(&work).unwrap();
        let suite = build(&work);
        measure(&suite, &work, rounds);
    }
}
