//! Stack-capture cost: ns per capture of 10 and 30 frames, warm, on 1 and 2 threads, for the
//! DWARF unwinder (with and without the depot), the frame-pointer walk and `_Unwind_Backtrace`.
//! Prints numbers; asserts only that the warm DWARF path makes no heap allocation.
//!
//! Run: `nice -n 10 cargo bench --bench stack_capture`

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::c_void;
use std::hint::black_box;
use std::mem::MaybeUninit;
use std::time::Instant;

use k15_memory::stack::{self, capture, StartFrame, UnwindMode, MAX_DEPTH};

/// Counts this thread's allocations, to prove the warm capture path allocates nothing.
struct Counting;
thread_local! { static ALLOCS: Cell<u64> = const { Cell::new(0) }; }
// SAFETY: forwards to System; the counter is a Drop-free const thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;

const ITERS: u32 = 200_000;

#[derive(Clone, Copy, PartialEq)]
enum Method {
    DwarfDepot,
    Dwarf,
    FramePointer,
    UnwindBacktrace,
}

/// One timed loop at the bottom of the recursion; returns (ns per capture, frames, allocs).
#[inline(never)]
fn measure(method: Method, depth: usize) -> (f64, usize, u64) {
    let mut buf = [MaybeUninit::<usize>::uninit(); MAX_DEPTH];
    let mut last = 0;
    // The depot methods give the stack's id (its frames are read once, after the timed loop:
    // reading them walks the depot's tree, which only reports do).
    let mut once = || match method {
        Method::DwarfDepot => stack::capture(StartFrame::here(), depth).0 as usize,
        Method::Dwarf | Method::FramePointer => {
            capture::unwind_into(StartFrame::here(), &mut buf[..depth])
        }
        Method::UnwindBacktrace => {
            let mut n = 0;
            // SAFETY: nothing else unwinds on this thread meanwhile.
            unsafe {
                backtrace::trace_unsynchronized(|f| {
                    black_box(f.ip());
                    n += 1;
                    n < depth
                })
            };
            n
        }
    };
    for _ in 0..1000 {
        last = once(); // warm caches and the depot entry
    }
    let allocs_before = ALLOCS.with(Cell::get);
    let t = Instant::now();
    for _ in 0..ITERS {
        last = black_box(once());
    }
    let ns = t.elapsed().as_nanos() as f64 / f64::from(ITERS);
    let frames = match method {
        Method::DwarfDepot => stack::frames(stack::StackId(last as u32)).len(),
        _ => last,
    };
    (ns, frames, ALLOCS.with(Cell::get) - allocs_before)
}

#[inline(never)]
fn recurse(levels: usize, method: Method, depth: usize) -> (f64, usize, u64) {
    if levels == 0 {
        return measure(method, depth);
    }
    let r = recurse(black_box(levels - 1), method, depth);
    black_box(r)
}

extern "C" fn compare(a: *const c_void, b: *const c_void) -> i32 {
    let mut buf = [MaybeUninit::<usize>::uninit(); MAX_DEPTH];
    let n = capture::unwind_into(StartFrame::here(), &mut buf);
    THROUGH_QSORT.with(|c| c.set(c.get().max(n)));
    // SAFETY: qsort passes pointers to the i32 elements.
    unsafe { (*a.cast::<i32>()).cmp(&*b.cast::<i32>()) as i32 }
}
thread_local! { static THROUGH_QSORT: Cell<usize> = const { Cell::new(0) }; }

/// Frames captured from a comparator called by libc's qsort (no frame pointers), 30 levels
/// of Rust recursion below it.
#[inline(never)]
fn frames_through_qsort(levels: usize) -> usize {
    if levels > 0 {
        return black_box(frames_through_qsort(black_box(levels - 1)));
    }
    THROUGH_QSORT.with(|c| c.set(0));
    let mut v: Vec<i32> = (0..16).rev().collect();
    // SAFETY: valid array, length, element size and comparator.
    unsafe { libc::qsort(v.as_mut_ptr().cast(), v.len(), 4, Some(compare)) };
    black_box(&v);
    THROUGH_QSORT.with(Cell::get)
}

fn name(m: Method) -> &'static str {
    match m {
        Method::DwarfDepot => "dwarf + depot",
        Method::Dwarf => "dwarf unwind only",
        Method::FramePointer => "frame-pointer walk",
        Method::UnwindBacktrace => "_Unwind_Backtrace",
    }
}

fn main() {
    stack::warm_up();
    println!("ns per capture (frames captured), warm, {ITERS} iterations per cell");
    println!(
        "{:<30} {:>16} {:>16} {:>16} {:>16}",
        "method", "10 deep, 1 thr", "30 deep, 1 thr", "10 deep, 2 thr", "30 deep, 2 thr"
    );
    for method in [
        Method::DwarfDepot,
        Method::Dwarf,
        Method::FramePointer,
        Method::UnwindBacktrace,
    ] {
        stack::set_unwind_mode(if method == Method::FramePointer {
            UnwindMode::FramePointer
        } else {
            UnwindMode::Dwarf
        });
        let mut cells = Vec::new();
        for threads in [1, 2] {
            for depth in [10, 30] {
                let results: Vec<(f64, usize, u64)> = std::thread::scope(|s| {
                    let hs: Vec<_> = (0..threads)
                        .map(|_| s.spawn(move || recurse(40, method, depth)))
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).collect()
                });
                let ns = results.iter().map(|r| r.0).sum::<f64>() / results.len() as f64;
                let allocs: u64 = results.iter().map(|r| r.2).sum();
                if method != Method::UnwindBacktrace {
                    assert_eq!(allocs, 0, "{} allocated on the warm path", name(method));
                }
                cells.push((threads, depth, format!("{ns:.1} ({})", results[0].1)));
            }
        }
        cells.sort_by_key(|c| (c.0, c.1));
        let row: Vec<String> = cells.into_iter().map(|c| format!("{:>16}", c.2)).collect();
        println!("{:<30} {}", name(method), row.join(" "));
    }
    stack::set_unwind_mode(UnwindMode::Dwarf);
    let dwarf = frames_through_qsort(30);
    stack::set_unwind_mode(UnwindMode::FramePointer);
    let fp = frames_through_qsort(30);
    stack::set_unwind_mode(UnwindMode::Dwarf);
    println!("frames from a qsort comparator, 30 Rust levels below qsort (max {MAX_DEPTH}): dwarf {dwarf}, frame-pointer {fp}");
    println!("nodes in the depot tree: {}", stack::depot::len());
}
