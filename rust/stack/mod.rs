//! Call-stack capture for every allocation, and the depot that stores each distinct stack once.
//!
//! Hot-path contract of [`capture`] (it runs inside every `operator new`/`delete` and
//! `GlobalAlloc` call): after [`warm_up`], no global lock, no syscall, no heap allocation,
//! no formatting, and no crash on any stack contents. Slow paths (first capture of a thread,
//! a return address in a library loaded after the last module scan, more simultaneous
//! captures than unwinder caches so far) are `#[cold]` and may lock, call the loader and
//! allocate through the Rust global allocator (see [`warm_up`]). A capture on a stack the
//! thread does not own (a fiber's) asks the kernel which of its pages can be read: a syscall
//! a page.
//!
//! Default unwinding is DWARF CFI from `.eh_frame` (the `framehop` crate, one rule cache per
//! slot of a small static pool), so stacks stay complete through code without frame
//! pointers (Debian's libstdc++, libc, libBullet). [`UnwindMode::FramePointer`] is an opt-in
//! cheaper walk that loses frames in such code.

pub mod capture;
pub mod depot;
pub mod history;
mod last_walk;
mod modules;
pub(crate) mod rules;

#[cfg(test)]
mod tests;

pub use crate::options::{UnwindMode, MAX_DEPTH};
use core::sync::atomic::{AtomicU8, Ordering};

/// A deduplicated call stack; see [`frames`]. `StackId(0)` means "no stack".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct StackId(pub u32);

/// Where unwinding starts: a return address and the stack and frame pointers of the frame
/// that return address belongs to (the caller of the function being left).
#[derive(Clone, Copy, Debug)]
pub struct StartFrame {
    /// Return address into the caller: the first address of the captured stack.
    pub pc: usize,
    /// The caller's stack pointer right after that return (the callee's CFA).
    pub sp: usize,
    /// The caller's frame pointer (rbp) as it will be after the return.
    pub fp: usize,
}

impl StartFrame {
    /// The caller of a function compiled with frame pointers, from that function's frame
    /// address (`__builtin_frame_address(0)` in C++, rbp in Rust).
    ///
    /// # Safety
    /// `frame_address` must be the frame address of a live frame of the current thread that
    /// follows the frame-pointer convention (`[fp]` = saved rbp, `[fp+8]` = return address).
    #[inline(always)]
    pub unsafe fn caller_of(frame_address: usize) -> StartFrame {
        let fp = frame_address as *const usize;
        // SAFETY: the caller guarantees `fp` is a live frame-pointer frame of this thread, so
        // both words are mapped, aligned and hold the saved rbp and the return address.
        let (saved_fp, ret) = unsafe { (fp.read(), fp.add(1).read()) };
        StartFrame {
            pc: ret,
            sp: frame_address + 16,
            fp: saved_fp,
        }
    }

    /// The caller of the function this is inlined into, for Rust entry points such as
    /// `GlobalAlloc::alloc`. That function must keep a frame pointer (this crate is built
    /// with `-C force-frame-pointers=yes`, see `.cargo/config.toml`).
    ///
    /// Unlike [`StartFrame::caller_of`] this is safe: the two words are read only if rbp
    /// lies inside the current thread's stack; otherwise the result has `pc == 0`, which
    /// [`capture`] turns into `StackId(0)`.
    #[inline(always)]
    pub fn here() -> StartFrame {
        let fp: usize;
        // SAFETY: copying rbp into a register touches neither memory nor flags.
        unsafe {
            core::arch::asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack, preserves_flags));
        }
        capture::caller_of_checked(fp)
    }
}

static MODE: AtomicU8 = AtomicU8::new(0);

/// Selects the unwinder for all later captures (process-wide).
pub fn set_unwind_mode(mode: UnwindMode) {
    MODE.store(mode as u8, Ordering::Relaxed);
}

/// The unwinder currently selected by [`set_unwind_mode`].
pub fn unwind_mode() -> UnwindMode {
    if MODE.load(Ordering::Relaxed) == UnwindMode::FramePointer as u8 {
        UnwindMode::FramePointer
    } else {
        UnwindMode::Dwarf
    }
}

/// Captures up to `depth` return addresses (clamped to [`MAX_DEPTH`]) starting at `start`
/// and interns them. `depth == 0`, a nested capture on the same thread, or a stack that
/// cannot be read safely give `StackId(0)`.
#[inline]
pub fn capture(start: StartFrame, depth: usize) -> StackId {
    let depth = depth.min(MAX_DEPTH);
    if depth == 0 {
        return StackId(0);
    }
    let mut buf = [core::mem::MaybeUninit::<usize>::uninit(); MAX_DEPTH];
    capture::capture_interned(start, &mut buf[..depth])
}

/// Captures up to `out.len()` return addresses (at most [`MAX_DEPTH`]) starting at `start`
/// into `out`, without interning them: how many were written. The stack of a new block goes
/// through here into its shard's ring (`tracker::pending_stacks`), and is interned with
/// [`intern_frames`] only if the block outlives its place there.
#[inline]
pub fn capture_frames(start: StartFrame, out: &mut [core::mem::MaybeUninit<usize>]) -> usize {
    let depth = out.len().min(MAX_DEPTH);
    capture::unwind_into(start, &mut out[..depth])
}

/// The id of `frames` (innermost first, at most [`MAX_DEPTH`]), stored in the depot if new.
pub fn intern_frames(frames: &[usize]) -> StackId {
    capture::intern_frames(frames)
}

/// Depot nodes the calling thread has added so far (wrapping): how new its stacks are;
/// `None` inside a capture (a signal handler).
pub fn nodes_added() -> Option<u32> {
    capture::nodes_added()
}

/// The return addresses of a stack, innermost first; empty for `StackId(0)` or an unknown id.
pub fn frames(id: StackId) -> depot::Frames {
    depot::frames(id)
}

/// The code of the program's `main`: the function its entry point hands to
/// `__libc_start_main`, read from the entry's first instructions (glibc's `_start`), and its
/// extent by the unwind entry that starts there. Without a symbol table: a pass over a large
/// program's is milliseconds. `None` where the entry does not read as glibc's `_start` or no
/// unwind entry starts at what it names.
pub fn main_code() -> Option<core::ops::Range<usize>> {
    // SAFETY: getauxval reads the process's auxiliary vector; it has no preconditions.
    let entry = unsafe { libc::getauxval(libc::AT_ENTRY) } as usize;
    let snapshot = modules::current_or_scan()?;
    let code = snapshot.module_of(entry)?;
    let len = (code.end - entry).min(START_BYTES_READ);
    // SAFETY: `entry..entry + len` lies in the executable segment of a loaded module (the
    // program, which is never unloaded).
    let start = unsafe { core::slice::from_raw_parts(entry as *const u8, len) };
    let main = main_passed_by_start(entry, start).filter(|main| code.contains(main))?;
    let extent = snapshot
        .sections_of(main)?
        .function_starting_at(main as u64)?;
    Some(extent.start as usize..extent.end as usize)
}

/// How much of `_start` [`main_code`] reads: glibc's loads `main` within its first 24 bytes.
const START_BYTES_READ: usize = 48;

/// The address `_start`'s code (`start`, at `entry`) loads into `rdi` (the first argument of
/// `__libc_start_main`: `main`), by glibc's x86-64 `start.S`: `lea main(%rip), %rdi` in a
/// position-independent program, `mov $main, %rdi` otherwise. The first such instruction
/// before the first call counts (a `main` loaded through the GOT is not read: `None`).
fn main_passed_by_start(entry: usize, start: &[u8]) -> Option<usize> {
    let operand = |at: usize| -> Option<i32> {
        Some(i32::from_le_bytes(start.get(at..at + 4)?.try_into().ok()?))
    };
    for at in 0..start.len() {
        match start[at..] {
            // lea disp32(%rip), %rdi: relative to the next instruction.
            [0x48, 0x8d, 0x3d, ..] => {
                let next = entry.checked_add(at + 7)?;
                return next.checked_add_signed(operand(at + 3)? as isize);
            }
            // mov $imm32, %rdi (sign-extended).
            [0x48, 0xc7, 0xc7, ..] => return usize::try_from(operand(at + 3)?).ok(),
            // call (direct or indirect): past the loads of its arguments.
            [0xe8, ..] | [0xff, 0x15, ..] => return None,
            _ => {}
        }
    }
    None
}

/// Does the setup now: maps the depot, scans the loaded modules, creates unwinder caches,
/// reads this thread's stack bounds and makes one capture.
///
/// Call once at tracker init **with the tracker's reentrancy guard set**: `framehop` builds
/// its module list and caches with the Rust global allocator, which may be the tracker.
/// Safe to call again (later calls are cheap no-ops apart from the test capture).
pub fn warm_up() {
    depot::init();
    modules::current_or_scan();
    capture::warm_up_caches();
    let _ = capture(StartFrame::here(), MAX_DEPTH);
}

/// Where the calling thread's capture state lies: its last walk keeps copies of stack words,
/// which a leak scan must not take for pointers the program holds.
pub fn tracker_thread_state() -> core::ops::Range<usize> {
    capture::thread_state_range()
}

/// The calling thread's stack from `sp` (an address in the current frame) to its top, if its
/// bounds are known: its own, or the one the program said it runs on ([`running_on_stack`]).
pub fn stack_above(sp: usize) -> Option<core::ops::Range<usize>> {
    let (own, named) = capture::this_thread_stack_bounds();
    [own, Some(named)]
        .into_iter()
        .flatten()
        .find(|&(lo, hi)| (lo..hi).contains(&sp))
        .map(|(_, hi)| sp..hi)
}

pub use capture::running_on_stack;

pub(crate) use capture::{is_signal_return, lock_caches_for_fork};
pub(crate) use modules::lock_for_fork as lock_modules_for_fork;

/// In a forked child, after the threads that were growing a rule table are gone.
pub(crate) fn note_forked_child() {
    rules::RULES.after_fork_in_child();
}

/// After a `dlopen` or `dlclose`: the unwinder's view of the modules and the history of modules
/// are brought up to date (a library mapped where an unloaded one was must not be walked with
/// the old one's tables, nor symbolized with its debug info).
pub fn modules_changed() {
    history::note_module_set_changed();
    depot::new_generation();
    let _ = modules::refresh();
}
