//! Tests of stack capture (against `backtrace` as referee) and of the depot.

use core::ffi::c_void;
use core::hint::black_box;
use std::ffi::{CStr, CString};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use super::*;

/// Every name (inlined ones included) the debug info gives for a return address.
fn names(addr: usize) -> String {
    let mut out = String::new();
    backtrace::resolve((addr - 1) as *mut c_void, |sym| {
        if let Some(n) = sym.name() {
            out.push_str(&format!("{n:#} | "));
        }
    });
    out
}

/// The file name of the module holding `addr`, from `dladdr`.
fn module_of(addr: usize) -> String {
    let mut info = core::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only writes `info`; a zeroed Dl_info is valid to read on failure.
    let info = unsafe {
        libc::dladdr(addr as *const c_void, info.as_mut_ptr());
        info.assume_init()
    };
    if info.dli_fname.is_null() {
        return String::new();
    }
    // SAFETY: a non-null dli_fname is a NUL-terminated string owned by the loader.
    unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned()
}

fn position(frames: &[usize], name: &str) -> Option<usize> {
    frames.iter().position(|&a| names(a).contains(name))
}

#[inline(never)]
fn level_c(depth: usize) -> StackId {
    black_box(capture(StartFrame::here(), black_box(depth)))
}

#[inline(never)]
fn level_b(depth: usize) -> StackId {
    black_box(level_c(depth))
}

#[inline(never)]
fn level_a(depth: usize) -> StackId {
    black_box(level_b(depth))
}

#[test]
fn nested_rust_frames_in_order() {
    let id = level_a(32);
    let f = frames(id);
    assert!(f.len() >= 4, "{f:x?}");
    assert!(names(f[0]).contains("level_b"), "{}", names(f[0]));
    assert!(names(f[1]).contains("level_a"), "{}", names(f[1]));
    assert!(
        names(f[2]).contains("nested_rust_frames_in_order"),
        "{}",
        names(f[2])
    );
}

#[inline(never)]
pub(super) fn referee_inner(ours: &mut Vec<usize>, theirs: &mut Vec<usize>) {
    let mut buf = [0usize; MAX_DEPTH];
    let n = capture::unwind_into_slice(StartFrame::here(), &mut buf);
    ours.extend_from_slice(&buf[..n]);
    // SAFETY: no other unwinder runs on this thread; the closure does not allocate-panic.
    unsafe {
        backtrace::trace_unsynchronized(|f| {
            theirs.push(f.ip() as usize);
            true
        })
    };
    black_box(());
}

#[inline(never)]
pub(super) fn referee_outer(ours: &mut Vec<usize>, theirs: &mut Vec<usize>) {
    referee_inner(ours, theirs);
    black_box(());
}

#[test]
fn matches_unwind_backtrace() {
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    referee_outer(&mut ours, &mut theirs);
    let start = theirs
        .iter()
        .position(|&a| a == ours[0])
        .expect("first frame in referee");
    let theirs = &theirs[start..];
    assert!(ours.len() >= 3);
    // Both walks end at the thread's root; compare everything both have.
    let common = ours.len().min(theirs.len());
    assert_eq!(&ours[..common], &theirs[..common]);
    assert!(
        ours.len() + 1 >= theirs.len(),
        "ours {} theirs {}",
        ours.len(),
        theirs.len()
    );
}

#[test]
fn depth_is_honoured_and_clamped() {
    assert_eq!(level_a(0), StackId(0));
    assert_eq!(frames(level_a(1)).len(), 1);
    assert_eq!(frames(level_a(2)).len(), 2);
    assert!(frames(level_a(1000)).len() <= MAX_DEPTH);
    assert_eq!(frames(StackId(0)), &[] as &[usize]);
}

#[test]
fn same_site_same_id_and_different_sites_differ() {
    let ids: Vec<StackId> = (0..1000).map(|_| level_a(32)).collect();
    assert!(ids.iter().all(|&i| i == ids[0] && i != StackId(0)));
    let other = level_b(32);
    assert_ne!(other, ids[0]);
}

/// The stack captured by [`on_fiber`], and the fiber's stack: `(lowest, size)`.
static FIBER_CAPTURE: AtomicU32 = AtomicU32::new(0);
static FIBER_STACK: OnceLock<(usize, usize)> = OnceLock::new();
static NAME_THE_FIBER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_fiber() {
    let (lowest, size) = *FIBER_STACK.get().unwrap();
    if NAME_THE_FIBER.load(Ordering::SeqCst) {
        running_on_stack(lowest, size);
    }
    // `StartFrame::here` from Rust on a stack that is not the thread's: its two words are
    // read through the kernel's answer, or from the named stack.
    FIBER_CAPTURE.store(level_a(32).0, Ordering::SeqCst);
    running_on_stack(0, 0);
}

/// Runs [`on_fiber`] on a fiber (`makecontext`) over a stack of its own, and returns its
/// capture's frames.
fn capture_on_a_fiber(named: bool) -> depot::Frames {
    const SIZE: usize = 256 * 1024;
    let (lowest, _) = *FIBER_STACK.get_or_init(|| (crate::sys::map_pages(SIZE) as usize, SIZE));
    NAME_THE_FIBER.store(named, Ordering::SeqCst);
    FIBER_CAPTURE.store(0, Ordering::SeqCst);
    let mut back = core::mem::MaybeUninit::<libc::ucontext_t>::zeroed();
    let mut fiber = core::mem::MaybeUninit::<libc::ucontext_t>::zeroed();
    // SAFETY: the ucontext protocol on two contexts of this frame: the fiber gets a mapped
    // stack nothing else uses and comes back here through `uc_link` when `on_fiber` returns.
    unsafe {
        assert_eq!(libc::getcontext(fiber.as_mut_ptr()), 0);
        let f = &mut *fiber.as_mut_ptr();
        f.uc_stack.ss_sp = lowest as *mut c_void;
        f.uc_stack.ss_size = SIZE;
        f.uc_link = back.as_mut_ptr();
        libc::makecontext(f, on_fiber, 0);
        assert_eq!(libc::swapcontext(back.as_mut_ptr(), f), 0);
    }
    frames(StackId(FIBER_CAPTURE.load(Ordering::SeqCst)))
}

#[test]
fn a_capture_on_a_fiber_has_the_fibers_frames_named_or_not() {
    for named in [false, true] {
        let f = capture_on_a_fiber(named);
        let at = |name| position(&f, name).unwrap_or_else(|| panic!("no {name} in {f:x?}"));
        // `level_c` captures from its caller on.
        assert!(
            at("level_b") < at("level_a") && at("level_a") < at("on_fiber"),
            "named {named}: {f:x?}"
        );
    }
}

#[test]
fn garbage_start_frames_give_empty_or_safe_stacks() {
    let bad = [
        StartFrame {
            pc: 0,
            sp: 0,
            fp: 0,
        },
        StartFrame {
            pc: 0x1234,
            sp: 8,
            fp: 16,
        },
        StartFrame {
            pc: level_a as *const () as usize + 4,
            sp: usize::MAX - 7,
            fp: 0,
        },
        StartFrame {
            pc: level_a as *const () as usize + 4,
            sp: 0x1000,
            fp: 0xdead_beef,
        },
    ];
    // An sp outside the thread's stack is walked as a foreign one (a fiber's): nothing there
    // can be read, so the stack is the start pc alone, if that lies in a module.
    for s in bad {
        let frames = frames(capture(s, 32));
        assert!(
            frames.is_empty() || frames == &[s.pc],
            "{s:x?}: {frames:x?}"
        );
    }
    // A valid sp but a wild fp: the walk must stay inside the stack and end.
    let mut here = StartFrame::here();
    here.fp = 0xdead_bee8;
    let _ = capture(here, 32);
}

static CALLBACK_ID: AtomicU32 = AtomicU32::new(0);

extern "C" fn capture_callback() {
    CALLBACK_ID.store(capture(StartFrame::here(), 32).0, Ordering::SeqCst);
}

extern "C" fn qsort_compare(a: *const c_void, b: *const c_void) -> i32 {
    // SAFETY: qsort passes pointers into the i32 array being sorted.
    let (a, b) = unsafe { (*a.cast::<i32>(), *b.cast::<i32>()) };
    let mut buf = [0usize; MAX_DEPTH];
    let n = capture::unwind_into_slice(StartFrame::here(), &mut buf);
    QSORT_FRAMES
        .lock()
        .unwrap()
        .get_or_insert_with(|| buf[..n].to_vec());
    a.cmp(&b) as i32
}

static QSORT_FRAMES: Mutex<Option<Vec<usize>>> = Mutex::new(None);

#[inline(never)]
fn call_qsort() {
    let mut v: Vec<i32> = (0..64).rev().collect();
    // SAFETY: a valid i32 array, its length and element size, and a matching comparator.
    unsafe { libc::qsort(v.as_mut_ptr().cast(), v.len(), 4, Some(qsort_compare)) };
    black_box(&v);
}

#[test]
fn unwinds_through_libc_qsort() {
    call_qsort();
    let f = QSORT_FRAMES.lock().unwrap().take().unwrap();
    let libc_frames = f
        .iter()
        .filter(|&&a| module_of(a).contains("libc.so"))
        .count();
    assert!(libc_frames >= 1, "no libc frame in {f:x?}");
    let caller = position(&f, "call_qsort").expect("call_qsort beyond qsort");
    assert!(
        names(f[caller + 1]).contains("unwinds_through_libc_qsort"),
        "{}",
        names(f[caller + 1])
    );
}

type Callback = extern "C" fn();
type FrameCallback = extern "C" fn(usize);

/// What k15's C++ operator new does: start at the caller of a frame-pointer function.
extern "C" fn capture_caller_of(frame_address: usize) {
    // SAFETY: the shim passes `__builtin_frame_address(0)` of its live frame-pointer frame.
    let start = unsafe { StartFrame::caller_of(frame_address) };
    CALLBACK_ID.store(capture(start, 32).0, Ordering::SeqCst);
}

struct Shim {
    sort: extern "C" fn(*mut i32, i32, Callback),
    ostream_write: extern "C" fn(FrameCallback),
    std_thread: extern "C" fn(Callback),
    rbp_loop: extern "C" fn(FrameCallback, i32, i32),
}

/// Builds `rust/stack/testdata/<name>.cpp` without frame pointers into a shared library and
/// dlopens it (after the first module scan, so this also tests the rescan). None, with a
/// message, when g++ (or a header) is missing.
fn build_and_open(name: &str, extra: &[&str]) -> Option<*mut c_void> {
    warm_up();
    let src = format!(
        "{}/rust/stack/testdata/{name}.cpp",
        env!("CARGO_MANIFEST_DIR")
    );
    // Built beside the crate's other build outputs (not left in /tmp on every run), under a name
    // of this process's and then renamed over the last one: a run beside this one keeps the file
    // it mapped.
    let so = Path::new(env!("OUT_DIR")).join(format!("k15_{name}.so"));
    let building = so.with_extension(format!("{}.so", std::process::id()));
    let built = std::process::Command::new("g++")
        .args([
            "-std=c++17",
            "-O2",
            "-fomit-frame-pointer",
            "-shared",
            "-fPIC",
            "-o",
        ])
        .arg(&building)
        .arg(&src)
        .args(extra)
        .status();
    if !built.is_ok_and(|s| s.success()) {
        eprintln!("skipping: g++ could not build {src}");
        return None;
    }
    std::fs::rename(&building, &so).expect("a rename in OUT_DIR");
    let path = CString::new(so.to_str()?).ok()?;
    // SAFETY: loading a library we just built; its initialisers are the C++ runtime's.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "dlopen {so:?} failed");
    Some(h)
}

fn symbol(h: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: `h` is a live dlopen handle and `name` a C string.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    assert!(!p.is_null(), "{name:?}");
    p
}

fn shim() -> Option<&'static Shim> {
    static SHIM: OnceLock<Option<Shim>> = OnceLock::new();
    SHIM.get_or_init(|| {
        let h = build_and_open("unwind_shim", &[])?;
        // SAFETY: the shim's functions have exactly these C signatures.
        unsafe {
            Some(Shim {
                sort: core::mem::transmute::<*mut c_void, extern "C" fn(*mut i32, i32, Callback)>(
                    symbol(h, c"k15_shim_sort"),
                ),
                ostream_write: core::mem::transmute::<*mut c_void, extern "C" fn(FrameCallback)>(
                    symbol(h, c"k15_shim_ostream_write"),
                ),
                std_thread: core::mem::transmute::<*mut c_void, extern "C" fn(Callback)>(symbol(
                    h,
                    c"k15_shim_std_thread",
                )),
                rbp_loop: core::mem::transmute::<
                    *mut c_void,
                    extern "C" fn(FrameCallback, i32, i32),
                >(symbol(h, c"k15_shim_rbp_loop")),
            })
        }
    })
    .as_ref()
}

static SHIM_LOCK: Mutex<()> = Mutex::new(());

#[inline(never)]
fn call_shim_sort(s: &Shim) {
    let mut v: Vec<i32> = (0..100).rev().collect();
    (s.sort)(v.as_mut_ptr(), v.len() as i32, capture_callback);
    black_box(&v);
}

#[test]
fn unwinds_through_cpp_without_frame_pointers() {
    let Some(s) = shim() else { return };
    let _g = SHIM_LOCK.lock().unwrap();
    call_shim_sort(s);
    let f = frames(StackId(CALLBACK_ID.load(Ordering::SeqCst)));
    assert!(module_of(f[0]).contains("k15_unwind_shim"), "{f:x?}");
    let caller = position(&f, "call_shim_sort").expect("call_shim_sort beyond std::sort");
    assert!(names(f[caller + 1]).contains("unwinds_through_cpp_without_frame_pointers"));
}

#[inline(never)]
fn call_shim_ostream_write(s: &Shim) {
    (s.ostream_write)(capture_caller_of);
    black_box(());
}

#[test]
fn unwinds_from_libstdcxx_like_operator_new() {
    let Some(s) = shim() else { return };
    let _g = SHIM_LOCK.lock().unwrap();
    call_shim_ostream_write(s);
    let f = frames(StackId(CALLBACK_ID.load(Ordering::SeqCst)));
    let mods: Vec<String> = f.iter().map(|&a| module_of(a)).collect();
    // The capture starts in std::ostream::write, inside libstdc++.so (no frame pointers) ...
    assert!(mods[0].contains("libstdc++"), "{mods:?}");
    // ... and still reaches the shim function and its Rust caller beyond it.
    assert!(mods[1].contains("k15_unwind_shim"), "{mods:?}");
    let caller = position(&f, "call_shim_ostream_write").expect("caller beyond libstdc++");
    assert_eq!(caller, 2, "{mods:?}");
    assert!(names(f[3]).contains("unwinds_from_libstdcxx_like_operator_new"));
}

#[test]
fn std_thread_stacks_reach_libstdcxx_entry() {
    let Some(s) = shim() else { return };
    let _g = SHIM_LOCK.lock().unwrap();
    (s.std_thread)(capture_callback);
    let f = frames(StackId(CALLBACK_ID.load(Ordering::SeqCst)));
    let mods: Vec<String> = f.iter().map(|&a| module_of(a)).collect();
    assert!(mods.iter().any(|m| m.contains("libstdc++")), "{mods:?}");
    assert!(mods.last().unwrap().contains("libc.so"), "{mods:?}");
}

#[inline(never)]
fn call_deep_cfi(call: extern "C" fn(Callback)) {
    call(capture_here_and_referee);
    black_box(());
}

#[test]
fn unwinds_through_cfi_the_rule_compiler_cannot_hold() {
    let Some(h) = build_and_open("deep_cfi", &[]) else {
        return;
    };
    // SAFETY: the shim's function has exactly this C signature.
    let call = unsafe {
        core::mem::transmute::<*mut c_void, extern "C" fn(Callback)>(symbol(
            h,
            c"k15_deep_cfi_call",
        ))
    };
    RBP_CAPTURES.with(|c| c.borrow_mut().clear());
    call_deep_cfi(call);
    let captures = RBP_CAPTURES.with(|c| c.borrow().clone());
    assert!(
        captures.len() == 1 && captures[0].1,
        "the compiled rules gave another stack than the referee: {captures:?}"
    );
    let f = frames(RBP_STACK.with(core::cell::Cell::get));
    let caller = position(&f, "call_deep_cfi").expect("call_deep_cfi beyond the deep CFI");
    assert!(module_of(f[caller - 1]).contains("k15_deep_cfi"), "{f:x?}");
}

thread_local! {
    /// Per capture from `record_against_referee`: frames, and whether they equal those of a
    /// walk that depends on nothing but the stack.
    static RBP_CAPTURES: std::cell::RefCell<Vec<(usize, bool)>> =
        const { std::cell::RefCell::new(Vec::new()) };
    /// The interned stack of the last of those captures.
    static RBP_STACK: core::cell::Cell<StackId> = const { core::cell::Cell::new(StackId(0)) };
}

/// Captures like k15's operator new, with the compiled rules, and checks the frames against a
/// walk with a fresh unwinder cache and no rule table.
extern "C" fn capture_and_referee(frame_address: usize) {
    // SAFETY: the shim passes `__builtin_frame_address(0)` of its live frame-pointer frame.
    record_against_referee(unsafe { StartFrame::caller_of(frame_address) });
}

/// [`capture_and_referee`] from the callback's own frame.
extern "C" fn capture_here_and_referee() {
    record_against_referee(StartFrame::here());
}

fn record_against_referee(start: StartFrame) {
    let mut ours = [0usize; 32];
    let n = capture::unwind_into_slice(start, &mut ours);
    let mut clean = [core::mem::MaybeUninit::uninit(); 32];
    let m = capture::unwind_uncached(start, &mut clean);
    // SAFETY: `unwind_uncached` initialised the first `m` elements.
    let clean = unsafe { core::slice::from_raw_parts(clean.as_ptr().cast::<usize>(), m) };
    RBP_CAPTURES.with(|c| c.borrow_mut().push((n, ours[..n] == *clean)));
    RBP_STACK.with(|id| id.set(capture(start, 32)));
}

/// The call chains below `k15_shim_rbp_loop` (see the shim).
#[derive(Clone, Copy)]
enum RbpPaths {
    Straight = 0,
    Changing = 1,
    ThroughSaver = 2,
}

#[inline(never)]
fn call_shim_rbp_loop(s: &Shim, captures: i32, paths: RbpPaths) {
    (s.rbp_loop)(capture_and_referee, captures, paths as i32);
    black_box(());
}

/// 300 captures below the shim's rbp loop (every one sees another rbp up to the loop's frame,
/// or another saved copy of it); each must equal the referee's walk.
fn every_walk_agrees_with_the_referee(s: &Shim, paths: RbpPaths) {
    RBP_CAPTURES.with(|c| c.borrow_mut().clear());
    let repeated = capture::REPEATED.with(std::cell::Cell::get);
    call_shim_rbp_loop(s, 300, paths);
    let repeated = capture::REPEATED.with(std::cell::Cell::get) - repeated;
    let captures = RBP_CAPTURES.with(|c| c.borrow().clone());
    assert_eq!(captures.len(), 300);
    assert!(
        captures.iter().all(|&(_, same)| same),
        "the compiled rules or the last walk gave another stack than the referee"
    );
    // Each capture walks twice from the same start; the rbp values that differ between
    // captures are restored by steps whose callers never use them, so the last walk answers
    // nearly every walk after the first.
    assert!(
        repeated > 500,
        "the last walk answered {repeated} of 600 walks"
    );
}

#[test]
fn walks_agree_with_the_referee_when_rbp_changes_between_captures() {
    let Some(s) = shim() else { return };
    let _g = SHIM_LOCK.lock().unwrap();
    every_walk_agrees_with_the_referee(s, RbpPaths::Straight);
    // A frame that restores rbp from a saved copy that changes every time.
    every_walk_agrees_with_the_referee(s, RbpPaths::ThroughSaver);
    // And the stack is the real one: through the shim's frames to this test.
    RBP_CAPTURES.with(|c| c.borrow_mut().clear());
    (s.rbp_loop)(capture_and_referee, 1, 0);
    let id = RBP_STACK.with(|id| id.get());
    let f = frames(id);
    let mods: Vec<String> = f.iter().map(|&a| module_of(a)).collect();
    assert!(mods[0].contains("k15_unwind_shim"), "{mods:?}");
    assert!(mods[1].contains("k15_unwind_shim"), "{mods:?}");
    assert!(
        names(f[2]).contains("walks_agree_with_the_referee_when_rbp_changes"),
        "{}",
        names(f[2])
    );
}

#[test]
fn walks_agree_with_the_referee_when_rbp_and_the_path_change_between_captures() {
    let Some(s) = shim() else { return };
    let _g = SHIM_LOCK.lock().unwrap();
    RBP_CAPTURES.with(|c| c.borrow_mut().clear());
    call_shim_rbp_loop(s, 600, RbpPaths::Changing);
    let captures = RBP_CAPTURES.with(|c| c.borrow().clone());
    assert_eq!(captures.len(), 600);
    let wrong = captures.iter().filter(|&&(_, same)| !same).count();
    assert_eq!(
        wrong, 0,
        "the compiled rules gave another stack than the referee"
    );
    // Three chains of two depths, one after the other, so each walk differs from the last one
    // in its first frames and in their rbp.
    let depths: std::collections::BTreeSet<usize> = captures.iter().map(|c| c.0).collect();
    assert_eq!(depths.len(), 2, "{depths:?}");
}

struct CaptureOnDrop;
impl Drop for CaptureOnDrop {
    fn drop(&mut self) {
        let id = level_a(32);
        CALLBACK_ID_TLS.store(id.0, Ordering::SeqCst);
    }
}
static CALLBACK_ID_TLS: AtomicU32 = AtomicU32::new(0);

#[test]
fn captures_in_threads_and_thread_local_destructors() {
    thread_local! { static D: CaptureOnDrop = const { CaptureOnDrop }; }
    let id = std::thread::spawn(|| {
        D.with(|_| {});
        level_a(32)
    })
    .join()
    .unwrap();
    assert!(names(frames(id)[0]).contains("level_b"));
    let at_exit = frames(StackId(CALLBACK_ID_TLS.load(Ordering::SeqCst)));
    assert!(!at_exit.is_empty());
    assert!(names(at_exit[0]).contains("level_b"));
}

#[test]
fn depot_dedups_synthetic_stacks() {
    let a = depot::intern(&[1, 2, 3]);
    let b = depot::intern(&[1, 2, 3]);
    let c = depot::intern(&[1, 2, 4]);
    let d = depot::intern(&[1, 2]);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_ne!(a, d);
    assert_eq!(frames(a), &[1, 2, 3]);
    assert_eq!(frames(d), &[1, 2]);
    assert_eq!(depot::intern(&[]), StackId(0));
}

#[test]
fn depot_concurrent_interning_is_consistent() {
    let stacks: Vec<Vec<usize>> = (0..2000usize)
        .map(|i| {
            (0..(i % 30 + 1))
                .map(|j| 0x7000_0000 + i * 64 + j)
                .collect()
        })
        .collect();
    let results: Vec<Vec<StackId>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let stacks = &stacks;
                s.spawn(move || {
                    // As a capturing thread interns: ids claimed in batches of its own.
                    let mut interned = Box::new(depot::Interned::EMPTY);
                    let mut ids = vec![StackId(0); stacks.len()];
                    for k in 0..stacks.len() {
                        // Different orders per thread so that inserts race.
                        let i = if t % 2 == 0 { k } else { stacks.len() - 1 - k };
                        ids[i] = interned.intern(&stacks[i]);
                    }
                    ids
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ids in &results[1..] {
        assert_eq!(ids, &results[0]);
    }
    let unique: std::collections::HashSet<_> = results[0].iter().collect();
    assert_eq!(unique.len(), stacks.len());
    for (i, id) in results[0].iter().enumerate() {
        assert_eq!(frames(*id), &stacks[i][..]);
    }
}

#[test]
fn nodes_added_after_a_watermark_lie_above_it() {
    let mut interned = Box::new(depot::Interned::EMPTY);
    let before = interned.intern(&[0x6100, 0x6200]);
    let mark = depot::watermark();
    // The thread still holds ids it claimed with the first stack's nodes: they lie below the
    // mark, and a stack captured after it must not get one.
    let after = interned.intern(&[0x6101, 0x6200]);
    assert!(
        before.0 < mark && after.0 >= mark,
        "{before:?} {mark} {after:?}"
    );
    assert_eq!(frames(after), &[0x6101, 0x6200]);
}

#[test]
fn a_stack_below_a_parent_with_a_higher_id_is_whole() {
    // Thread `a` claims its ids first (four nodes: claims of 1, 2 and 4 ids, three left), `b`
    // later: a child `a` adds below `b`'s node gets the lower id (unless a watermark read
    // elsewhere made `a` claim again; then try again).
    let mut seen = false;
    for attempt in 0..20usize {
        let mut a = Box::new(depot::Interned::EMPTY);
        let mut b = Box::new(depot::Interned::EMPTY);
        let base = 0x7100_0000 + attempt * 0x100;
        a.intern(&[base + 4, base + 5, base + 6, base + 7]);
        let parent = b.intern(&[base + 1, base + 2]);
        let child = a.intern(&[base + 3, base + 1, base + 2]);
        assert_eq!(frames(child), &[base + 3, base + 1, base + 2]);
        assert_eq!(frames(parent), &[base + 1, base + 2]);
        seen |= child.0 < parent.0;
    }
    assert!(seen, "no child got an id below its parent's");
}

/// Counts the calling thread's heap allocations (the test binary's global allocator).
struct CountingAlloc;
std::thread_local! { static ALLOCS: core::cell::Cell<u64> = const { core::cell::Cell::new(0) }; }
// SAFETY: forwards every call to System; the counter is a const, Drop-free thread-local.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as this function's.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        // SAFETY: same contract as this function's.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
}
#[global_allocator]
static COUNTING: CountingAlloc = CountingAlloc;

#[test]
fn warm_capture_does_not_allocate() {
    warm_up();
    let mut ids = [StackId(0); 1001];
    let mut before = 0;
    for (i, id) in ids.iter_mut().enumerate() {
        *id = level_a(32);
        black_box(level_b(32));
        if i == 1 {
            // This thread's first capture read its stack bounds (the slow path); an optimised
            // build may peel the first iteration, so warm both call sites.
            before = ALLOCS.with(core::cell::Cell::get);
        }
    }
    assert_eq!(ALLOCS.with(core::cell::Cell::get), before);
    assert!(ids[2..].iter().all(|&id| id == ids[2] && id != StackId(0)));
}

static BULLET_IDS: Mutex<Vec<StackId>> = Mutex::new(Vec::new());

extern "C" fn bullet_hook(frame_address: usize) {
    // SAFETY: the shim's hook passes its own live frame-pointer frame.
    let start = unsafe { StartFrame::caller_of(frame_address) };
    let id = capture(start, 32);
    BULLET_IDS.lock().unwrap().push(id);
}

#[inline(never)]
fn call_bullet_world(world: extern "C" fn(FrameCallback)) {
    world(bullet_hook);
    black_box(());
}

#[test]
fn unwinds_through_libbullet_dynamics() {
    if !std::path::Path::new("/usr/include/bullet/btBulletDynamicsCommon.h").exists() {
        eprintln!("skipping: Bullet headers (libbullet-dev) not installed");
        return;
    }
    let libs = [
        "-I/usr/include/bullet",
        "-lBulletDynamics",
        "-lBulletCollision",
        "-lLinearMath",
    ];
    let Some(h) = build_and_open("bullet_shim", &libs) else {
        return;
    };
    // SAFETY: k15_shim_bullet_world has this C signature.
    let world = unsafe {
        core::mem::transmute::<*mut c_void, extern "C" fn(FrameCallback)>(symbol(
            h,
            c"k15_shim_bullet_world",
        ))
    };
    call_bullet_world(world);
    let ids = BULLET_IDS.lock().unwrap().clone();
    let through_dynamics = ids.iter().filter(|&&id| {
        let f = frames(id);
        let dynamics = f
            .iter()
            .position(|&a| module_of(a).contains("libBulletDynamics"));
        let caller = position(&f, "call_bullet_world");
        dynamics.is_some() && caller > dynamics
    });
    assert!(
        through_dynamics.count() >= 1,
        "{} stacks, none through libBulletDynamics",
        ids.len()
    );
}

static BEFORE_MAIN_ID: AtomicU32 = AtomicU32::new(0);

/// Runs from `.init_array`, before `main` and before any `warm_up`: as a shared library's
/// static constructor calling `new` would.
extern "C" fn capture_before_main() {
    BEFORE_MAIN_ID.store(level_a(32).0, Ordering::SeqCst);
}

#[used]
#[link_section = ".init_array"]
static CAPTURE_BEFORE_MAIN: extern "C" fn() = capture_before_main;

#[test]
fn captures_before_main_without_warm_up() {
    let f = frames(StackId(BEFORE_MAIN_ID.load(Ordering::SeqCst)));
    assert!(f.len() >= 3, "{f:x?}");
    assert!(names(f[0]).contains("level_b"));
    assert!(names(f[2]).contains("capture_before_main"));
}

/// Captures from `start` (interned, as `new` does, and raw) and checks both against the referee.
fn check_agrees_with_referee(start: StartFrame, depth: usize) -> StackId {
    let interned = capture::capture_interned(
        start,
        &mut [core::mem::MaybeUninit::uninit(); MAX_DEPTH][..depth],
    );
    let mut raw = [0usize; MAX_DEPTH];
    let n_raw = capture::unwind_into_slice(start, &mut raw[..depth]);
    // The referee: framehop alone, with a fresh cache and no compiled rules. It depends on
    // nothing but the stack, so it referees the rule tables, which every walk above went
    // through (framehop's own cache is not quite transparent: see `unwind_uncached`).
    let mut clean = [core::mem::MaybeUninit::uninit(); MAX_DEPTH];
    let n = capture::unwind_uncached(start, &mut clean[..depth]);
    // SAFETY: `unwind_uncached` initialised the first `n` elements.
    let clean = unsafe { core::slice::from_raw_parts(clean.as_ptr().cast::<usize>(), n) };
    assert_eq!(&raw[..n_raw], clean, "the rules gave a different stack");
    assert_eq!(frames(interned), clean, "the depot gave a different stack");
    assert_eq!(
        interned,
        depot::intern(clean),
        "incremental interning gave another id"
    );
    interned
}

thread_local! {
    static PATH_STARTS: std::cell::RefCell<Vec<(usize, usize, usize)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Captures with the start frame in `path_mid`: identical for both paths below, so only the
/// return address into `path_a`/`path_b` (one stack word) tells them apart.
#[inline(never)]
fn path_leaf(depth: usize) -> StackId {
    let start = StartFrame::here();
    PATH_STARTS.with(|s| s.borrow_mut().push((start.pc, start.sp, start.fp)));
    black_box(check_agrees_with_referee(start, depth))
}

#[inline(never)]
fn path_mid(depth: usize) -> StackId {
    black_box(path_leaf(black_box(depth)))
}

#[inline(never)]
fn path_a(depth: usize) -> StackId {
    black_box(path_mid(black_box(depth)))
}

#[inline(never)]
fn path_b(depth: usize) -> StackId {
    // A different constant keeps the two paths from being merged into one function.
    black_box(path_mid(black_box(depth) + black_box(0)))
}

#[test]
fn consecutive_walks_differing_in_one_outer_return_address_differ() {
    let repeated = capture::REPEATED.with(std::cell::Cell::get);
    PATH_STARTS.with(|s| s.borrow_mut().clear());
    let mut ids = [StackId(0); 2];
    for i in 0..200 {
        let b = black_box(i % 3 == 1);
        let id = if b { path_b(16) } else { path_a(16) };
        if ids[b as usize] == StackId(0) {
            ids[b as usize] = id;
        }
        assert_eq!(ids[b as usize], id, "a path's stack changed between calls");
    }
    assert_ne!(ids[0], ids[1]);
    assert!(
        names(frames(ids[0])[1]).contains("path_a"),
        "{}",
        names(frames(ids[0])[1])
    );
    assert!(
        names(frames(ids[1])[1]).contains("path_b"),
        "{}",
        names(frames(ids[1])[1])
    );
    // The case worth testing: equal start registers, so only the one stack word tells the
    // paths apart (and the thread's last stack shares every frame but that one).
    PATH_STARTS.with(|s| {
        let s = s.borrow();
        assert!(
            s.iter().all(|&x| x == s[0]),
            "start frames differ: {:x?}",
            &s[..3]
        );
    });
    // The last walk was in play (each check walks twice from one start), so it is the recorded
    // read of that one word that told the paths apart.
    assert!(capture::REPEATED.with(std::cell::Cell::get) - repeated >= 200);
}

/// One of two frame-pointer-less-looking paths per level, chosen by the bits of `path`.
#[inline(never)]
fn random_a(path: u64, levels: u32, depth: usize) -> StackId {
    black_box(random_path(black_box(path >> 1), levels - 1, depth))
}

#[inline(never)]
fn random_b(path: u64, levels: u32, depth: usize) -> StackId {
    black_box(random_path(
        black_box(path >> 1) + black_box(0),
        levels - 1,
        depth,
    ))
}

#[inline(never)]
fn random_path(path: u64, levels: u32, depth: usize) -> StackId {
    if levels == 0 {
        black_box(check_agrees_with_referee(StartFrame::here(), depth))
    } else if path & 1 == 0 {
        black_box(random_a(path, levels, depth))
    } else {
        black_box(random_b(path, levels, depth))
    }
}

/// Captures along `count` random paths of `random_path`, each checked against the referee.
fn random_paths(seed: u64, count: usize) {
    let mut rng = seed;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for i in 0..count {
        let r = next();
        // Mostly the same number of levels (equal stack depth, only return addresses differ),
        // sometimes more or fewer (the last stack then shares its outer part at another depth).
        let levels = if i % 2 == 0 {
            4 + (r >> 40) as u32 % 5
        } else {
            6
        };
        let depth = if i % 5 == 0 {
            1 + (r >> 48) as usize % MAX_DEPTH
        } else {
            32
        };
        black_box(random_path(r & 0x3f, levels, depth));
    }
}

#[test]
fn walks_agree_with_the_referee_on_random_paths() {
    let inside = capture::TAKEN_OVER_INSIDE.with(std::cell::Cell::get);
    random_paths(0x2545_f491_4f6c_dd1d, 3000);
    // Paths of other depths share their outer frames with the walk before them: most walks
    // take those over from a frame above their start (and the referee agreed with each).
    let inside = capture::TAKEN_OVER_INSIDE.with(std::cell::Cell::get) - inside;
    assert!(
        inside > 1500,
        "{inside} of 6000 walks took over outer frames"
    );
}

#[test]
fn threads_compiling_rules_at_once_agree_with_the_referee() {
    // Started together, the threads meet the same return addresses first at the same time,
    // so that they compile the same FDEs and publish the same rules concurrently.
    let start = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let start = &start;
            s.spawn(move || {
                start.wait();
                random_paths(0x9e37_79b9_7f4a_7c15 ^ t, 500);
            });
        }
    });
}

#[test]
fn depot_tree_shares_outer_frames() {
    let outer = depot::intern(&[0x5100, 0x5200, 0x5300]);
    let inner = depot::intern(&[0x5000, 0x5100, 0x5200, 0x5300]);
    // The longer stack is one node below the shorter: its outer frames are not stored again.
    let mut interned = Box::new(depot::Interned::EMPTY);
    assert_eq!(interned.child(outer, 0x5000), inner);
    assert_eq!(frames(inner), &[0x5000, 0x5100, 0x5200, 0x5300]);
    assert_eq!(frames(outer), &[0x5100, 0x5200, 0x5300]);
    assert_ne!(depot::intern(&[0x5001, 0x5100, 0x5200, 0x5300]), inner);
}

#[test]
fn incremental_interning_matches_fresh_interning() {
    // Stacks that share outer parts of every length with the one before, and some that don't.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut interned = depot::Interned::EMPTY;
    let mut stack: Vec<usize> = vec![0x6000];
    for _ in 0..3000 {
        let keep = (next() as usize) % (stack.len() + 1);
        let mut new: Vec<usize> = (0..(next() as usize) % 6)
            .map(|_| 0x6000 + (next() as usize % 8) * 16)
            .collect();
        new.extend_from_slice(&stack[stack.len() - keep..]);
        new.truncate(MAX_DEPTH);
        stack = if new.is_empty() { vec![0x6010] } else { new };
        let id = interned.intern(&stack);
        assert_eq!(id, depot::intern(&stack), "stack {stack:x?}");
        assert_eq!(frames(id), &stack[..]);
    }
}

#[test]
fn compiled_rules_step_like_their_cfi() {
    use super::rules::Rule;
    let stack: std::collections::HashMap<u64, u64> =
        [(0x1008, 0xaaaa), (0x1000, 0xbbbb), (0x2008, 0xcccc)].into();
    let mut reads = Vec::new();
    let mut read = |a: u64| {
        reads.push(a);
        stack.get(&a).copied().ok_or(())
    };
    // After `push rbp`: CFA = rsp + 16, return address at CFA - 8, saved rbp at CFA - 16.
    let pushed = Rule::new(false, 16, -8, Some(-16)).unwrap();
    assert_eq!(
        pushed.step(0x1000, 7, &mut read),
        Some((0xaaaa, 0x1010, 0xbbbb))
    );
    // Inside a frame-pointer frame: CFA = rbp + 16, rbp restored from CFA - 16.
    let framed = Rule::new(true, 16, -8, Some(-16)).unwrap();
    assert_eq!(
        framed.step(0x500, 0x1000, &mut read),
        Some((0xaaaa, 0x1010, 0xbbbb))
    );
    // A leaf that saved nothing: rbp passes through unchanged.
    let leaf = Rule::new(false, 0x2010 - 0x1ff0, -8, None).unwrap();
    assert_eq!(leaf.step(0x1ff0, 42, &mut read), Some((0xcccc, 0x2010, 42)));
    assert_eq!(
        leaf.step(0x3000, 42, &mut read),
        None,
        "unreadable return address"
    );
    assert_eq!(Rule::FRAMEHOP_STEP.step(0x1000, 0, &mut read), None);
    assert_eq!(Rule::END_OF_STACK.step(0x1000, 0, &mut read), None);
    // Offsets a rule cannot hold are left to framehop.
    assert_eq!(Rule::new(false, 1 << 40, -8, None), None);
    assert_eq!(Rule::new(false, 16, -12, None), None);
    assert_eq!(reads[..2], [0x1008, 0x1000]);
}

#[test]
fn a_threads_outermost_frame_ends_the_walk_by_its_compiled_rule() {
    // glibc's `clone3` leaves the return address undefined in its CFI, where the new thread
    // starts: the walk's last step is a compiled rule that says so, not framehop's slow step.
    std::thread::spawn(|| {
        let f = frames(capture(StartFrame::here(), MAX_DEPTH));
        let last = *f.last().unwrap();
        assert!(f.len() < MAX_DEPTH, "{f:x?}");
        assert_eq!(
            super::rules::RULES.cached(last),
            Some(super::rules::Rule::END_OF_STACK),
            "{}",
            names(last)
        );
    })
    .join()
    .unwrap();
}

#[test]
fn each_unwinder_gives_its_cache_slot_back() {
    // A frame-pointer walk needs no unwinder cache: taking a slot for it would keep the slot
    // busy for good, and every later capture would grow the pool until it is full.
    for _ in 0..2 * capture::POOL {
        let (dwarf, fp) = capture::unwind_both_ways(StartFrame::here(), 16);
        assert!(dwarf > 1 && fp >= 1, "{dwarf} {fp}");
    }
}

#[test]
fn depot_racing_threads_store_each_stack_once() {
    const THREADS: usize = 8;
    for round in 0..40usize {
        let base = 0x6100_0000 + round * 0x1_0000;
        // Under two shared outer frames, middle frame `m` has m + 1 leaves: fan-outs below, at
        // and past what a node's own list holds, and eight middles (the outer node's list
        // overflows too). The middle stacks themselves are interned as well.
        let mut stacks: Vec<Vec<usize>> = Vec::new();
        for middle in 0..8 {
            let outer = [base + 0x100 + middle, base + 2, base + 1];
            stacks.push(outer.to_vec());
            for leaf in 0..=middle {
                stacks.push([&[base + 0x1000 + leaf][..], &outer].concat());
            }
        }
        let barrier = std::sync::Barrier::new(THREADS);
        let results: Vec<Vec<StackId>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (stacks, barrier) = (&stacks, &barrier);
                    s.spawn(move || {
                        let mut ids = vec![StackId(0); stacks.len()];
                        barrier.wait();
                        // Each thread its own order, so that every insert has rivals.
                        for k in 0..stacks.len() {
                            let k = if t % 2 == 0 { k } else { stacks.len() - 1 - k };
                            let i = (k + t * 5) % stacks.len();
                            ids[i] = depot::intern(&stacks[i]);
                        }
                        ids
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for ids in &results[1..] {
            assert_eq!(ids, &results[0], "threads got different ids for a stack");
        }
        let unique: std::collections::HashSet<_> = results[0].iter().collect();
        assert_eq!(unique.len(), stacks.len(), "two stacks share an id");
        for (stack, id) in stacks.iter().zip(&results[0]) {
            assert_ne!(*id, StackId(0));
            assert_eq!(frames(*id), &stack[..]);
            assert_eq!(depot::intern(stack), *id, "the id of a stack changed");
        }
    }
}

/// glibc's x86-64 `_start` as the toolchains here write it (`objdump -d`), up to its call.
const START_PIE: [u8; 33] = [
    0x31, 0xed, 0x49, 0x89, 0xd1, 0x5e, 0x48, 0x89, 0xe2, 0x48, 0x83, 0xe4, 0xf0, 0x50, 0x54, 0x45,
    0x31, 0xc0, 0x31, 0xc9, // xor %ebp,%ebp ... xor %ecx,%ecx
    0x48, 0x8d, 0x3d, 0xd5, 0x9b, 0xff, 0xff, // lea -0x642b(%rip),%rdi
    0xff, 0x15, 0x97, 0x01, 0x6f, 0x00, // call *__libc_start_main@GOTPCREL(%rip)
];

#[test]
fn main_is_read_from_each_form_of_start_that_loads_it() {
    // Position-independent: relative to the instruction after the `lea` (at 20 + 7).
    assert_eq!(
        main_passed_by_start(0x165030, &START_PIE),
        Some(0x165030 + 27 - 0x642b)
    );
    // With CET's `endbr64` in front, as distributions build it.
    let with_endbr: Vec<u8> = [0xf3, 0x0f, 0x1e, 0xfa]
        .iter()
        .chain(&START_PIE)
        .copied()
        .collect();
    assert_eq!(
        main_passed_by_start(0x10000, &with_endbr),
        Some(0x10000 + 31 - 0x642b)
    );
    // Fixed address (`-no-pie`, static): `mov $0x401106,%rdi`.
    let mut fixed = START_PIE;
    fixed[20..27].copy_from_slice(&[0x48, 0xc7, 0xc7, 0x06, 0x11, 0x40, 0x00]);
    assert_eq!(main_passed_by_start(0x401020, &fixed), Some(0x401106));
    // Through the GOT (`mov main@GOTPCREL(%rip),%rdi`, not relaxed by the linker): not read.
    let mut through_got = START_PIE;
    through_got[21] = 0x8b;
    assert_eq!(main_passed_by_start(0x1000, &through_got), None);
    // Nothing loaded before the first call, or code cut short: none.
    assert_eq!(main_passed_by_start(0x1000, &START_PIE[27..]), None);
    assert_eq!(main_passed_by_start(0x1000, &START_PIE[..24]), None);
    assert_eq!(main_passed_by_start(0x1000, &[]), None);
}
