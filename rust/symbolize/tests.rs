//! Symbolizing this test binary's own return addresses, libc's, and agreement with GNU addr2line.

use std::hint::black_box;
use std::io::Write;
use std::process::{Command, Stdio};

use addr2line::gimli;

use super::*;

/// The return addresses of the calling thread, innermost first (glibc's `backtrace`, which
/// unwinds with the DWARF CFI every Rust binary carries).
#[inline(never)]
fn capture() -> Vec<usize> {
    let mut buffer = [std::ptr::null_mut(); 64];
    // SAFETY: the buffer holds as many entries as the size passed.
    let count = unsafe { libc::backtrace(buffer.as_mut_ptr(), buffer.len() as i32) };
    buffer[..count.max(0) as usize]
        .iter()
        .map(|&ip| ip as usize)
        .collect()
}

#[inline(never)]
fn named_leaf() -> (Vec<usize>, u32) {
    black_box((capture(), line!()))
}

#[inline(always)]
fn inlined_inner() -> (Vec<usize>, u32) {
    (capture(), line!())
}

#[inline(always)]
fn inlined_middle() -> (Vec<usize>, [u32; 2]) {
    let ((stack, inner), middle) = (inlined_inner(), line!());
    (stack, [inner, middle])
}

#[inline(never)]
fn inlined_outer() -> (Vec<usize>, [u32; 3]) {
    let ((stack, [inner, middle]), outer) = (inlined_middle(), line!());
    black_box((stack, [inner, middle, outer]))
}

const THIS_FILE: &str = "rust/symbolize/tests.rs";

fn path_of(name: &str) -> String {
    format!("k15_memory::symbolize::tests::{name}")
}

fn this_exe() -> String {
    std::env::current_exe()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// `main` as `_start` names it and its unwind entry bounds it is where the symbol table
/// (the way of finding it where `_start` does not read) names `main`: the first and last
/// return addresses inside it, not the one past it.
#[test]
fn main_by_the_entry_point_is_main_by_the_symbol_table() {
    let main = crate::stack::main_code().expect("glibc's _start names main");
    let mut symbolizer = Symbolizer::new();
    let exe = symbolizer
        .map
        .modules
        .iter()
        .position(|m| m.is_main)
        .unwrap();
    let (first, last, past) = (main.start + 1, main.end, main.end + 1);
    let named = symbolizer.named_main(exe, vec![first, last, past]);
    assert_eq!(named, [first, last].into_iter().collect());
}

#[test]
fn names_file_and_line_of_a_rust_function() {
    let (stack, line) = named_leaf();
    let mut symbolizer = Symbolizer::new();
    let frames: Vec<Frame> = stack
        .iter()
        .flat_map(|&address| symbolizer.resolve(address).to_vec())
        .collect();
    let leaf = frames
        .iter()
        .find(|frame| frame.function.as_deref() == Some(path_of("named_leaf").as_str()))
        .unwrap_or_else(|| panic!("no named_leaf frame in {frames:#?}"));
    assert!(
        leaf.file.as_deref().unwrap().ends_with(THIS_FILE),
        "{leaf:?}"
    );
    assert_eq!(leaf.line, line, "{leaf:?}");
    assert!(!leaf.inlined);
    assert_eq!(leaf.module, this_exe());
    // `capture` is the frame above it: the stack's order survives symbolization.
    assert_eq!(
        frames[0].function.as_deref(),
        Some(path_of("capture").as_str())
    );
}

#[test]
fn expands_inlined_frames_with_their_own_lines() {
    let (stack, [inner, middle, outer]) = inlined_outer();
    let mut symbolizer = Symbolizer::new();
    let frames = stack
        .iter()
        .map(|&address| symbolizer.resolve(address).to_vec())
        .find(|frames| frames.len() == 3)
        .expect("one address expands to three frames");
    let seen: Vec<_> = frames
        .iter()
        .map(|frame| (frame.function.clone().unwrap(), frame.line, frame.inlined))
        .collect();
    assert_eq!(
        seen,
        [
            (path_of("inlined_inner"), inner, true),
            (path_of("inlined_middle"), middle, true),
            (path_of("inlined_outer"), outer, false),
        ]
    );
    assert!(frames
        .iter()
        .all(|frame| frame.address == frames[0].address));
    assert!(frames
        .iter()
        .all(|frame| frame.file.as_deref().unwrap().ends_with(THIS_FILE)));
}

#[test]
fn names_a_libc_function_without_the_binary_having_debug_info() {
    let address = libc::atoi as *const () as usize;
    let mut symbolizer = Symbolizer::new();
    // +1: resolve treats every address as a return address and looks up the byte before.
    let frames = symbolizer.resolve(address + 1).to_vec();
    let outer = frames.last().unwrap();
    assert!(
        matches!(outer.function.as_deref(), Some("atoi" | "__GI_atoi")),
        "{frames:?}"
    );
    assert!(outer.module.contains("libc.so"), "{outer:?}");
    assert_eq!(
        outer.module_offset,
        address + 1 - (outer.address - outer.module_offset)
    );
    // Debian's libc6-dbg puts its DWARF under /usr/lib/debug/.build-id; without it the name
    // comes from .dynsym and there is no line.
    match &outer.file {
        Some(file) => assert!(file.ends_with("atoi.c"), "{outer:?}"),
        None => println!("no debug file for libc: named from .dynsym ({outer:?})"),
    }
}

#[test]
fn symbolizer_can_move_to_the_reporting_thread() {
    fn assert_send<T: Send>() {}
    assert_send::<Symbolizer>();
}

#[test]
fn never_returns_an_empty_frame() {
    let mut symbolizer = Symbolizer::new();
    let frames = symbolizer.resolve(16);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].module, UNKNOWN_MODULE);
    assert_eq!(frames[0].module_offset, 16);
}

#[test]
fn trims_only_the_top_run_of_own_frames() {
    let (stack, _) = named_leaf();
    let mut symbolizer = Symbolizer::new();
    let all: Vec<Frame> = stack
        .iter()
        .flat_map(|&address| symbolizer.resolve(address).to_vec())
        .collect();
    let trimmed = symbolizer.symbolize_stack(crate::stack::depot::intern(&stack));
    // Everything in this crate (capture, named_leaf, this test) is "the tracker".
    let own = all
        .iter()
        .take_while(|frame| {
            frame
                .function
                .as_deref()
                .unwrap()
                .starts_with("k15_memory::")
        })
        .count();
    assert!(own >= 3, "{all:#?}");
    // Below them, on a thread the test harness started, the tracker's thread start goes too.
    let ours = |frame: &Frame| {
        frame
            .function
            .as_deref()
            .is_some_and(names::is_thread_start_of_ours)
    };
    assert_eq!(
        trimmed.len(),
        all.len() - own - all.iter().filter(|f| ours(f)).count()
    );
    assert!(!trimmed.iter().any(ours), "{trimmed:#?}");
    assert_eq!(trimmed[0].address, all[own].address);

    // A user frame between own frames: the ones below it stay.
    let atoi = libc::atoi as *const () as usize + 1;
    let mixed = symbolizer.symbolize_stack(crate::stack::depot::intern(&[
        stack[0], stack[1], atoi, stack[0],
    ]));
    assert_eq!(mixed.len(), 2, "{mixed:#?}");
    assert_eq!(mixed[0].address, atoi);
    assert_eq!(
        mixed[1].function.as_deref(),
        Some(path_of("capture").as_str())
    );

    // Nothing but own frames: shown whole rather than as an empty stack.
    assert_eq!(
        symbolizer
            .symbolize_stack(crate::stack::depot::intern(&stack[..2]))
            .len(),
        2
    );
}

/// One address as GNU addr2line prints it: (function, file name, line) per frame.
type GnuFrames = Vec<(String, String, u32)>;

/// Runs `addr2line -a -f -i -C -e module` on probes (addresses as stated in the file).
fn gnu_addr2line(module: &str, probes: &[usize]) -> Option<Vec<GnuFrames>> {
    let mut child = Command::new("addr2line")
        .args(["-a", "-f", "-i", "-C", "-e", module])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    let input: String = probes.iter().map(|probe| format!("{probe:#x}\n")).collect();
    // Written from another thread: addr2line answers as it reads, and a full stdout pipe
    // would otherwise block both sides.
    let mut stdin = child.stdin.take()?;
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = String::from_utf8(child.wait_with_output().ok()?.stdout).ok()?;
    writer.join().ok()?.ok()?;
    let mut results: Vec<GnuFrames> = Vec::new();
    let mut lines = output.lines();
    while let Some(line) = lines.next() {
        if line.starts_with("0x") && line[2..].chars().all(|c| c.is_ascii_hexdigit()) {
            results.push(Vec::new());
            continue;
        }
        let location = lines.next()?;
        let (file, number) = location.rsplit_once(':')?;
        // "file:123 (discriminator 2)"
        let number = number.split(' ').next()?.parse().unwrap_or(0);
        results
            .last_mut()?
            .push((line.to_owned(), file.to_owned(), number));
    }
    Some(results)
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[test]
fn agrees_with_gnu_addr2line() {
    let (mut stack, _) = inlined_outer();
    stack.extend(named_leaf().0);
    let mut symbolizer = Symbolizer::new();
    let exe = symbolizer.resolve(stack[0])[0].clone();
    let bias = exe.address - exe.module_offset;
    stack.retain(|&address| symbolizer.resolve(address)[0].module == exe.module);
    let captured = stack.len();
    // Plus addresses spread through this binary's code, most of it std and the crates.
    let text = text_section(&exe.module);
    let step = (text.end - text.start) / 500;
    stack.extend((0..500).map(|i| bias + text.start + i * step + 1));

    let probes: Vec<usize> = stack.iter().map(|&a| a - bias - 1).collect();
    let Some(gnu) = gnu_addr2line(&exe.module, &probes) else {
        println!("GNU addr2line not found: comparison skipped");
        return;
    };
    assert_eq!(gnu.len(), stack.len());
    let mut same_lines = 0;
    let mut same_names = 0;
    let mut differ = Vec::new();
    for (i, (&address, theirs)) in stack.iter().zip(&gnu).enumerate() {
        let ours: Vec<(String, String, u32)> = symbolizer
            .resolve(address)
            .iter()
            .map(|frame| {
                (
                    frame.function.clone().unwrap_or_else(|| "??".to_owned()),
                    frame.file.as_deref().map_or("??", file_name).to_owned(),
                    frame.line,
                )
            })
            .collect();
        let names = |frames: &GnuFrames| -> Vec<String> {
            frames.iter().map(|(name, _, _)| name.clone()).collect()
        };
        let lines = |frames: &GnuFrames| -> Vec<(String, u32)> {
            frames
                .iter()
                .map(|(_, file, line)| (file_name(file).to_owned(), *line))
                .collect()
        };
        if lines(&ours) != lines(theirs) || names(&ours) != names(theirs) {
            differ.push(i);
        }
        if lines(&ours) == lines(theirs) {
            same_lines += 1;
        } else {
            println!("lines differ at {address:#x}:\n  ours {ours:?}\n  gnu  {theirs:?}");
        }
        if names(&ours) == names(theirs) {
            same_names += 1;
        } else {
            println!("names differ at {address:#x}:\n  ours {ours:?}\n  gnu  {theirs:?}");
        }
    }
    println!(
        "agreement with GNU addr2line over {} addresses: lines {same_lines}, names {same_names}",
        stack.len()
    );
    // Real return addresses agree exactly. Sampled ones can land in padding between
    // functions, where GNU names the symbol below and we name none (see `locate`).
    assert!(differ.iter().all(|&i| i >= captured), "{differ:?}");
    assert!(same_lines * 100 >= stack.len() * 95);
    assert!(same_names * 100 >= stack.len() * 90);
}

/// The `.text` section of a module file, as addresses stated in the file.
fn text_section(path: &str) -> std::ops::Range<usize> {
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let text = file.section_by_name(".text").unwrap();
    text.address() as usize..(text.address() + text.size()) as usize
}

/// Runs a tool for the debuglink test; `None` (test skipped) if it is missing or fails.
fn tool(program: &str, args: &[&str]) -> Option<()> {
    let status = Command::new(program).args(args).status().ok()?;
    status.success().then_some(())
}

#[test]
fn follows_gnu_debuglink_of_a_stripped_library() {
    let folder = std::env::temp_dir().join(format!("k15-debuglink-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let source = folder.join("leaf.c");
    std::fs::write(&source, "int k15_leaf(int x) {\n  return x * 3 + 1;\n}\n").unwrap();
    let [source, library, debug] = [
        source,
        folder.join("libleaf.so"),
        folder.join("libleaf.debug"),
    ]
    .map(|path| path.to_string_lossy().into_owned());
    let built = tool(
        "cc",
        &["-g", "-O0", "-shared", "-fPIC", "-o", &library, &source],
    )
    .and_then(|()| tool("objcopy", &["--only-keep-debug", &library, &debug]))
    .and_then(|()| {
        let link = format!("--add-gnu-debuglink={debug}");
        tool("objcopy", &["--strip-debug", &link, &library])
    });
    if built.is_none() {
        println!("cc or objcopy not found: debuglink test skipped");
        return;
    }
    let probe = {
        use object::{Object, ObjectSymbol};
        let data = std::fs::read(&library).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let symbol = file.symbols().find(|s| s.name() == Ok("k15_leaf")).unwrap();
        symbol.address() + 4
    };
    let mut info = resolver::DebugInfo::load(std::path::Path::new(&library)).unwrap();
    let located = info.locate(probe);
    std::fs::remove_dir_all(&folder).unwrap();
    let outer = located.last().unwrap();
    assert_eq!(outer.function.as_deref(), Some("k15_leaf"));
    assert!(outer.file.as_deref().unwrap().ends_with("leaf.c"));
    assert!((1..=3).contains(&outer.line), "line {}", outer.line);
}

/// C++ code for the shared-library test. Keep the line numbers in `cpp_frames_...` in step.
const CPP_SOURCE: &str = r#"#include <cstddef>
#include <cstdlib>
typedef void (*capture_fn)();
static capture_fn g_capture;
extern "C" void k15_set_capture(capture_fn f) { g_capture = f; }
struct Shape {
  static void* operator new(std::size_t size) {
    g_capture();
    return std::malloc(size);
  }
  static void operator delete(void* p) { std::free(p); }
  int radius = 1;
};
namespace game {
__attribute__((always_inline)) inline Shape* build() {
  return new Shape;
}
__attribute__((noinline)) Shape* spawn(int n) {
  Shape* s = build();
  s->radius = n;
  return s;
}
}  // namespace game
extern "C" void* k15_spawn(int n) { return game::spawn(n); }
extern "C" void k15_free(void* p) { delete static_cast<Shape*>(p); }
"#;

static CPP_STACK: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

extern "C" fn record_cpp_stack() {
    *CPP_STACK.lock().unwrap() = capture();
}

#[test]
fn cpp_frames_of_a_shared_library_are_demangled_inlined_and_trimmed() {
    let folder = std::env::temp_dir().join(format!("k15-cpp-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let source = folder.join("shapes.cpp");
    std::fs::write(&source, CPP_SOURCE).unwrap();
    let library = folder.join("libshapes.so").to_string_lossy().into_owned();
    let source = source.to_string_lossy().into_owned();
    let flags = ["-g", "-O0", "-shared", "-fPIC", "-o", &library, &source];
    if tool("g++", &flags).is_none() {
        println!("g++ not found: C++ shared-library test skipped");
        return;
    }
    let path = std::ffi::CString::new(library.clone()).unwrap();
    // SAFETY: dlopen/dlsym with NUL-terminated names; the symbols have the C signatures
    // declared in CPP_SOURCE. The library stays loaded (no dlclose), so its addresses stay
    // valid for the symbolizer below.
    let stack = unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
        assert!(!handle.is_null(), "dlopen {library}");
        let set_capture: extern "C" fn(extern "C" fn()) =
            std::mem::transmute(libc::dlsym(handle, c"k15_set_capture".as_ptr()));
        let spawn: extern "C" fn(i32) -> *mut libc::c_void =
            std::mem::transmute(libc::dlsym(handle, c"k15_spawn".as_ptr()));
        let free: extern "C" fn(*mut libc::c_void) =
            std::mem::transmute(libc::dlsym(handle, c"k15_free".as_ptr()));
        set_capture(record_cpp_stack);
        free(spawn(7));
        std::mem::take(&mut *CPP_STACK.lock().unwrap())
    };

    let mut symbolizer = Symbolizer::new();
    let frames = symbolizer.symbolize_stack(crate::stack::depot::intern(&stack));
    // Only now: debug info is read from the file on first use, not at dlopen.
    std::fs::remove_dir_all(&folder).unwrap();
    let seen: Vec<(&str, u32, bool)> = frames
        .iter()
        .take(4)
        .map(|frame| {
            (
                frame.function.as_deref().unwrap_or("??"),
                frame.line,
                frame.inlined,
            )
        })
        .collect();
    // Trimmed: capture, record_cpp_stack (this crate) and Shape::operator new(unsigned long).
    assert_eq!(
        seen,
        [
            ("game::build()", 16, true),
            ("game::spawn(int)", 19, false),
            ("k15_spawn", 24, false),
            (
                path_of("cpp_frames_of_a_shared_library_are_demangled_inlined_and_trimmed")
                    .as_str(),
                seen[3].1,
                seen[3].2 // whether rustc inlined the test body into its harness closure varies
            ),
        ],
        "{frames:#?}"
    );
    assert!(frames[..3].iter().all(|frame| frame.module == library));
    assert!(frames[..3]
        .iter()
        .all(|frame| frame.file.as_deref().unwrap().ends_with("shapes.cpp")));
    let untrimmed: Vec<Frame> = stack
        .iter()
        .flat_map(|&address| symbolizer.resolve(address).to_vec())
        .collect();
    assert!(untrimmed
        .iter()
        .any(|frame| frame.function.as_deref() == Some("Shape::operator new(unsigned long)")));
}

/// `(function, file, line)` of each location, to compare two ways of finding them.
fn described(locations: &[resolver::Location]) -> Vec<(Option<String>, Option<String>, u32)> {
    locations
        .iter()
        .map(|l| (l.function.clone(), l.file.clone(), l.line))
        .collect()
}

/// Looking up a known set of addresses in one batch (only their units decompressed and read,
/// unit by unit) finds exactly what loading everything finds, address by address.
fn assert_batch_agrees(module: &str, text: std::ops::Range<usize>) {
    let step = (text.end - text.start) / 400;
    let probes: Vec<u64> = (0..400).map(|i| (text.start + i * step) as u64).collect();
    let path = std::path::Path::new(module);
    let mut whole = resolver::DebugInfo::load(path).unwrap();
    let batch = resolver::DebugInfo::load_for(path, &probes)
        .unwrap()
        .locate_all(&probes);
    let mut with_lines = 0;
    for (&probe, found) in probes.iter().zip(&batch) {
        let expected = whole.locate(probe);
        assert_eq!(
            described(found),
            described(&expected),
            "{module} at {probe:#x}"
        );
        with_lines += usize::from(found.iter().any(|l| l.line > 0));
    }
    println!(
        "{module}: {with_lines} of {} addresses with lines",
        probes.len()
    );
}

#[test]
fn batch_lookup_agrees_with_loading_everything_in_libc() {
    let address = libc::atoi as *const () as usize;
    let mut symbolizer = Symbolizer::new();
    let libc = symbolizer.resolve(address + 1)[0].module.clone();
    // libc's debug file (libc6-dbg) has compressed sections: only the probes' units are
    // decompressed, with their abbreviations and line programs.
    assert_batch_agrees(&libc, text_section(&libc));
}

#[test]
fn batch_lookup_agrees_with_loading_everything_in_compressed_dwarf() {
    // This binary's DWARF, compressed with zlib as `-gz` or `objcopy` do: rustc's units refer
    // to each other's entries, so those are decompressed whole.
    let exe = this_exe();
    let copy = std::env::temp_dir().join(format!("k15_symbolize_gz_{}", std::process::id()));
    let copy = copy.to_string_lossy().into_owned();
    if tool(
        "objcopy",
        &[
            "--compress-debug-sections=zlib",
            exe.as_str(),
            copy.as_str(),
        ],
    )
    .is_none()
    {
        println!("objcopy not found: test skipped");
        return;
    }
    assert_batch_agrees(&copy, text_section(&copy));
    let _ = std::fs::remove_file(&copy);
}

/// C++ with several levels of inlining into functions of their own sections (each its own
/// line sequence), for the lean per-unit lookup to match addr2line's context on.
const INLINED_CPP: &str = r#"
#include <cstdio>
#include <string>
#include <vector>
namespace shapes {
struct Grid {
  std::vector<std::string> cells;
  __attribute__((always_inline)) inline void put(int i) {
    cells.push_back(std::to_string(i * 7));
  }
  __attribute__((always_inline)) inline void fill(int n) {
    for (int i = 0; i < n; ++i) put(i);
  }
};
}  // namespace shapes
namespace {
__attribute__((noinline)) size_t spread(int n) {
  shapes::Grid grid;
  grid.fill(n);
  return grid.cells.size();
}
}  // namespace
template <typename T> __attribute__((noinline)) T twice(T value) { return value + value; }
// Code whose entries lie below a type or a function in some compilers' output: an out-of-line
// member, a local class's member and a lambda, none of them inlined, each with an inlined call
// (a function the lean path missed would show no inlined frame).
__attribute__((always_inline)) inline int scaled(int v) { return std::printf("%d\n", v) * v; }
struct Counter {
  int total = 0;
  __attribute__((noinline)) void add(int n);
  __attribute__((noinline)) int doubled() const { return scaled(total) * 2; }
};
void Counter::add(int n) { total += scaled(n); }
__attribute__((noinline)) int local_work(int n) {
  struct Local {
    __attribute__((noinline)) static int triple(int v) { return scaled(v) + 1; }
  };
  auto square = [n](int v) __attribute__((noinline)) { return scaled(v) + n; };
  return Local::triple(n) + square(n);
}
int main(int argc, char**) {
  Counter counter;
  counter.add(argc);
  std::printf("%zu %d %g %d %d\n", spread(argc * 40), twice(argc), twice(argc * 1.5),
              local_work(argc), counter.doubled());
  return 0;
}
"#;

#[test]
fn lean_unit_lookup_agrees_with_addr2lines_context_at_every_address() {
    lean_agrees_at_every_address("g++");
}

#[test]
fn lean_unit_lookup_agrees_with_addr2lines_context_at_every_address_with_clang() {
    lean_agrees_at_every_address("clang++-14");
}

/// [`INLINED_CPP`] built by `compiler`: the lean path (which jumps over the entries below
/// types and functions) finds at every address of its code what addr2line's context finds.
fn lean_agrees_at_every_address(compiler: &str) {
    let folder = std::env::temp_dir().join(format!("k15-lean-{compiler}-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let source = folder.join("inlined.cpp");
    std::fs::write(&source, INLINED_CPP).unwrap();
    let exe = folder.join("inlined").to_string_lossy().into_owned();
    let source = source.to_string_lossy().into_owned();
    let flags = ["-O2", "-g", "-ffunction-sections", "-Wall", "-Wextra"];
    if tool(
        compiler,
        &[&flags[..], &[source.as_str(), "-o", exe.as_str()]].concat(),
    )
    .is_none()
    {
        println!("{compiler} not found: test skipped");
        return;
    }
    let text = text_section(&exe);
    // Every byte: sequence starts and ends, and each boundary of an inlined range.
    let probes: Vec<u64> = (text.start as u64..text.end as u64).collect();
    let path = std::path::Path::new(&exe);
    let batch = resolver::DebugInfo::load_for(path, &probes)
        .unwrap()
        .locate_all(&probes);
    let mut whole = resolver::DebugInfo::load(path).unwrap();
    let (mut inlined, mut lines) = (0, std::collections::HashSet::new());
    for (&probe, found) in probes.iter().zip(&batch) {
        assert_eq!(
            described(found),
            described(&whole.locate(probe)),
            "at {probe:#x}"
        );
        inlined += usize::from(found.len() > 1);
        lines.extend(found.iter().map(|l| (l.file.clone(), l.line)));
    }
    let names: Vec<String> = batch
        .iter()
        .flatten()
        .filter_map(|l| l.function.clone())
        .collect();
    assert!(
        inlined > 100,
        "only {inlined} addresses with inlined frames"
    );
    assert!(
        names.iter().any(|n| n == "shapes::Grid::put(int)"),
        "{names:?}"
    );
    assert!(names
        .iter()
        .any(|n| n.starts_with("(anonymous namespace)::spread")));
    assert!(names.iter().any(|n| n == "double twice<double>(double)"));
    // Each of them found by the lean walk: `scaled` inlined into it.
    for own in [
        "Counter::add(int)",
        "Counter::doubled() const",
        "local_work(int)::Local::triple(int)",
    ] {
        let found = batch.iter().any(|frames| {
            frames.len() > 1
                && frames[0].function.as_deref() == Some("scaled(int)")
                && frames[1].function.as_deref() == Some(own)
        });
        assert!(found, "{own} with scaled(int) inlined not in {names:?}");
    }
    assert!(
        names.iter().any(
            |n| n.starts_with("local_work(int)::{lambda(int)#1}::operator()")
                || n.starts_with("local_work(int)::$_0::operator()")
        ),
        "no lambda in {names:?}"
    );
    assert!(lines.len() > 20);
    // Alone in its batch, an address of a function whose entry lies below another function's
    // (the local class's member, the lambda) or of one beside them is found the same way: the
    // walk that skips the entries below functions holding no probe misses the first kind.
    let mut alone = 0;
    for (&probe, found) in probes.iter().zip(&batch) {
        let outer = found
            .last()
            .and_then(|l| l.function.as_deref())
            .unwrap_or("");
        if ["Local::triple", "lambda", "$_0", "Counter::add"]
            .iter()
            .any(|part| outer.contains(part))
        {
            let single = resolver::DebugInfo::load_for(path, &[probe])
                .unwrap()
                .locate_all(&[probe]);
            assert_eq!(described(&single[0]), described(found), "{probe:#x} alone");
            alone += 1;
        }
    }
    assert!(alone > 10, "only {alone} addresses looked up alone");
    let _ = std::fs::remove_dir_all(&folder);
}

/// The one-pass symbol-table lookup names every address as `object`'s symbol map does: at each
/// symbol's start, just before it, inside it and just past its end, in this test binary and in
/// libc (whose `.dynsym` alone is in the file).
#[test]
fn symbol_table_pass_agrees_with_objects_symbol_map() {
    use object::{Object, ObjectSymbol};
    let libc = {
        let mut symbolizer = Symbolizer::new();
        symbolizer.resolve(libc::atoi as *const () as usize + 1)[0]
            .module
            .clone()
    };
    for path in [this_exe(), libc] {
        let data = std::fs::read(&path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let mut probes: Vec<u64> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.address() != 0)
            .flat_map(|s| {
                let (start, size) = (s.address(), s.size());
                [start - 1, start, start + size / 2, start + size]
            })
            .collect();
        probes.sort_unstable();
        probes.dedup();
        let found = symtab::containing(&file, &probes, &|| {});
        let map = file.symbol_map();
        let mut named = 0;
        for (&probe, name) in probes.iter().zip(&found) {
            let expected = map.containing(probe).map(|s| s.name());
            assert_eq!(*name, expected, "{path} at {probe:#x}");
            named += usize::from(name.is_some());
        }
        println!("{path}: {named} of {} addresses named", probes.len());
        assert!(named * 2 > probes.len(), "{path}");
    }
}

/// Every line program of a file (uncompressed `.debug_line` and `.debug_info`); `None` when
/// gimli cannot read a unit header or its line program's header (the tests damage them).
fn line_programs(
    data: &'static [u8],
) -> Option<Vec<gimli::IncompleteLineProgram<resolver::Slice>>> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(data).ok()?;
    let section = |id: gimli::SectionId| -> Result<resolver::Slice, ()> {
        let bytes = file
            .section_by_name(id.name())
            .and_then(|s| s.data().ok())
            .unwrap_or(&[]);
        Ok(gimli::EndianSlice::new(bytes, gimli::RunTimeEndian::Little))
    };
    let dwarf = gimli::Dwarf::load(section).ok()?;
    let mut units = dwarf.units();
    let mut programs = Vec::new();
    while let Some(header) = units.next().ok()? {
        if let Some(program) = dwarf.unit(header).ok()?.line_program {
            programs.push(program);
        }
    }
    Some(programs)
}

/// The rows gimli's `LineRows` yields for `program`, and whether it read to the end.
fn gimlis_rows(
    program: &gimli::IncompleteLineProgram<resolver::Slice>,
) -> (Vec<line_program::LineRow>, bool) {
    let mut rows = Vec::new();
    let mut state = program.clone().rows();
    loop {
        match state.next_row() {
            Ok(Some((_, row))) => rows.push(line_program::LineRow::of(row)),
            Ok(None) => return (rows, true),
            Err(_) => return (rows, false),
        }
    }
}

/// The rows of the line-program interpreter for `program`, and how it ended.
fn interpreted_rows(
    program: &gimli::IncompleteLineProgram<resolver::Slice>,
) -> (Vec<line_program::LineRow>, Result<(), line_program::Run>) {
    let mut rows = Vec::new();
    let ended = line_program::for_each_row(program.header(), |row| rows.push(row));
    (rows, ended)
}

/// Builds `INLINED_CPP` with `compiler` and `flags` into `folder`: the program's bytes, or
/// `None` when the compiler is missing.
fn built_program(
    folder: &std::path::Path,
    compiler: &str,
    flags: &[&str],
) -> Option<&'static [u8]> {
    let source = folder.join("inlined.cpp");
    std::fs::write(&source, INLINED_CPP).unwrap();
    let exe = folder.join(format!("inlined-{compiler}{}", flags.concat()));
    let (source, exe_path) = (source.to_string_lossy(), exe.to_string_lossy());
    tool(
        compiler,
        &[flags, &[source.as_ref(), "-o", exe_path.as_ref()]].concat(),
    )?;
    Some(Box::leak(std::fs::read(&exe).unwrap().into_boxed_slice()))
}

/// The line-program interpreter yields gimli's rows, row for row, over every unit of C++ programs
/// (g++ with DWARF 5 and DWARF 4, clang++) and of this Rust test binary (rustc's units and std's).
#[test]
fn line_program_rows_agree_with_gimlis() {
    let folder = std::env::temp_dir().join(format!("k15-lines-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let mut files: Vec<(String, &'static [u8])> = Vec::new();
    for (compiler, flags) in [
        ("g++", &["-O2", "-g"][..]),
        ("g++", &["-O2", "-gdwarf-4"][..]),
        ("g++", &["-O0", "-g"][..]),
        ("clang++-14", &["-O2", "-g"][..]),
    ] {
        match built_program(&folder, compiler, flags) {
            Some(data) => files.push((format!("{compiler} {flags:?}"), data)),
            None => println!("{compiler} not found: its programs are skipped"),
        }
    }
    let this = Box::leak(std::fs::read(this_exe()).unwrap().into_boxed_slice());
    files.push(("this test binary".into(), this));
    assert!(files.len() >= 4, "g++ builds the test programs");
    for (name, data) in files {
        let (mut programs, mut rows) = (0, 0);
        for program in line_programs(data).expect("gimli reads the units") {
            let (expected, complete) = gimlis_rows(&program);
            let (found, ended) = interpreted_rows(&program);
            assert!(complete, "{name}: gimli reads every program");
            assert_eq!(ended, Ok(()), "{name}");
            assert_eq!(found, expected, "{name}");
            programs += 1;
            rows += found.len();
        }
        println!("{name}: {programs} line programs, {rows} rows agree");
        assert!(
            programs > 0 && rows > 100,
            "{name}: {programs} programs, {rows} rows"
        );
    }
    let _ = std::fs::remove_dir_all(&folder);
}

/// A damaged line program never panics the interpreter: cut short or with bytes changed, it
/// gives gimli's rows up to where gimli stops, and says so where gimli fails.
#[test]
fn a_damaged_line_program_gives_gimlis_rows_or_an_error() {
    use object::{Object, ObjectSection};
    let folder = std::env::temp_dir().join(format!("k15-lines-bad-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let Some(data) = built_program(&folder, "g++", &["-O2", "-g"]) else {
        panic!("g++ builds the test program");
    };
    let file = object::File::parse(data).unwrap();
    let line = file.section_by_name(".debug_line").unwrap();
    let (line_at, line_len) = line.file_range().unwrap();
    let (line_at, line_len) = (line_at as usize, line_len as usize);
    let mut rng = crate::engine::test_support::Rng::new(0x2545_f491_4f6c_dd1d);
    let mut random = move || rng.next();
    let (mut failed, mut tried) = (0, 0);
    for round in 0..300 {
        let mut damaged = data.to_vec();
        let section = &mut damaged[line_at..line_at + line_len];
        if round % 3 == 0 {
            // Cut short: the rest of the section zeroed (a program reads up to its length).
            let cut = (random() as usize) % section.len();
            section[cut..].fill(0);
        } else {
            for _ in 0..1 + round % 4 {
                let at = (random() as usize) % section.len();
                section[at] = random() as u8;
            }
        }
        let damaged: &'static [u8] = Box::leak(damaged.into_boxed_slice());
        let Some(programs) = line_programs(damaged) else {
            continue; // the damage broke a header: gimli refused it before any program ran
        };
        for program in programs {
            let (expected, complete) = gimlis_rows(&program);
            let (found, ended) = interpreted_rows(&program);
            tried += 1;
            match ended {
                Ok(()) => {
                    assert!(complete, "gimli failed where the interpreter did not");
                    assert_eq!(found, expected);
                }
                Err(line_program::Run::Malformed) => {
                    assert!(!complete, "the interpreter failed where gimli did not");
                    assert_eq!(found, expected);
                    failed += 1;
                }
                Err(line_program::Run::Unsupported) => {}
            }
        }
    }
    println!("{tried} damaged programs run, {failed} refused as gimli refuses them");
    assert!(tried > 200 && failed > 10, "{tried} run, {failed} refused");
    let _ = std::fs::remove_dir_all(&folder);
}
