//! Unwinding into a fixed buffer: DWARF CFI through a pool of rule caches, or the opt-in rbp walk.
//!
//! Per-thread state is one `const`-initialised, `Drop`-free thread-local (stack bounds, a
//! cache-slot hint, a reentrancy flag, and the 4 KiB [`Memo`] of the thread's last walk, so
//! that a capture repeating it takes no slot at all): C++ `thread_local` destructors run
//! `delete` after Rust TLS destructors would have run, so nothing here may need one.
//!
//! Unwinder caches (a framehop rule cache plus gimli's fixed-size CFI evaluation context, tens of KiB each)
//! live in a static pool of [`POOL`] slots, each behind a try-lock. A thread starts at its own
//! slot (by a per-thread hint) and takes the first free one; it never waits. Rules are keyed
//! by address, so threads running the same code share warm caches, and the number of caches
//! follows the number of *simultaneous* captures, not the number of threads ever created
//! (a per-thread cache would need a destructor to be given back at thread exit). A cache is
//! created only when every existing one is busy (cold path); if the pool is exhausted the
//! capture falls back to the frame-pointer walk.

use core::cell::{Cell, UnsafeCell};
use core::mem::MaybeUninit;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, MustNotAllocateDuringUnwind, Unwinder};

use super::depot::Interned;
use super::memo::{Memo, Splice};
use super::modules::{self, Snapshot};
use super::rules::{CfiContext, Rule};
use super::{StackId, StartFrame, UnwindMode};

/// Number of unwinder-cache slots; more simultaneous captures than this use the rbp walk.
pub const POOL: usize = 64;

/// What one walk needs to itself: framehop's rule cache (for the steps the rule table leaves
/// to framehop) and gimli's context (to compile rules on a miss).
struct Cache {
    framehop: CacheX86_64<MustNotAllocateDuringUnwind>,
    cfi: CfiContext,
}

impl Cache {
    /// Cold path: allocates through the Rust global allocator.
    fn new() -> Self {
        Cache {
            framehop: CacheX86_64::new_in(),
            cfi: CfiContext::new(),
        }
    }
}

#[repr(align(64))] // one slot per cache line: the try-locks of different threads don't share
struct Slot {
    busy: AtomicBool,
    cache: AtomicPtr<Cache>,
}

static SLOTS: [Slot; POOL] = [const {
    Slot {
        busy: AtomicBool::new(false),
        cache: AtomicPtr::new(ptr::null_mut()),
    }
}; POOL];
/// Slots `0..READY` hold a cache; they are filled in order under `GROW`.
static READY: AtomicUsize = AtomicUsize::new(0);
static GROW: Mutex<()> = Mutex::new(());
static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

const BOUNDS_UNKNOWN: u8 = 0;
const BOUNDS_OK: u8 = 1;
const BOUNDS_FAILED: u8 = 2;

struct ThreadState {
    /// The thread's stack is `[lo, hi)`; valid when `bounds == BOUNDS_OK`.
    lo: Cell<usize>,
    hi: Cell<usize>,
    bounds: Cell<u8>,
    /// Preferred cache slot.
    hint: Cell<usize>,
    /// Set while this thread is inside `unwind_into`: a nested capture (an allocation made by a
    /// slow path, a signal handler) returns an empty stack instead of deadlocking on a rescan.
    busy: Cell<bool>,
    /// Set by [`set_thread_memo`]`(false)`: walks neither use nor update the memo.
    memo_off: Cell<bool>,
    /// The thread's last DWARF walk; only touched while `busy` is set.
    memo: UnsafeCell<Memo>,
    /// The thread's last interned stack; only touched while `busy` is set.
    interned: UnsafeCell<Interned>,
}

thread_local! {
    // const-initialised and Drop-free: usable in C++ thread_local destructors at thread exit.
    static THREAD: ThreadState = const {
        ThreadState {
            lo: Cell::new(0),
            hi: Cell::new(0),
            bounds: Cell::new(BOUNDS_UNKNOWN),
            hint: Cell::new(0),
            busy: Cell::new(false),
            memo_off: Cell::new(false),
            memo: UnsafeCell::new(Memo::EMPTY),
            interned: UnsafeCell::new(Interned::EMPTY),
        }
    };
}

/// The address range of the calling thread's [`ThreadState`].
pub(super) fn thread_state_range() -> core::ops::Range<usize> {
    THREAD.with(|t| {
        let start = t as *const ThreadState as usize;
        start..start + core::mem::size_of::<ThreadState>()
    })
}

#[cfg(test)]
thread_local! {
    /// Frames this thread's walks took over from a memo instead of unwinding (tests only).
    pub(super) static REUSED: Cell<usize> = const { Cell::new(0) };
    /// Steps this thread's DWARF walks asked the unwinder for (tests only).
    pub(super) static STEPPED: Cell<usize> = const { Cell::new(0) };
}

/// A DWARF walk by framehop alone, with a brand-new rule cache, no rule table and no memo
/// (tests only): framehop's cache is not quite transparent (a failed DWARF evaluation caches
/// the frame-pointer rule for that address), so this is the reference that depends on nothing
/// but the stack, and it shares no code with the compiled rules it referees.
#[cfg(test)]
pub(super) fn unwind_uncached(start: StartFrame, out: &mut [MaybeUninit<usize>]) -> usize {
    let hi = THREAD.with(|t| stack_bounds(t).map_or(0, |b| b.1));
    let snap = modules::current_or_scan().expect("modules");
    let mut cache = Box::new(Cache::new());
    dwarf_walk(
        start,
        start.sp,
        hi,
        snap,
        &mut cache,
        None,
        Steps::FramehopOnly,
        out,
    )
}

/// Counts frames taken from a memo, so tests can tell that the memo path really ran.
#[inline(always)]
fn note_reused(_frames: usize) {
    #[cfg(test)]
    REUSED.with(|r| r.set(r.get() + _frames));
}

/// Counts steps the unwinder made, so tests can tell that the memo spared them.
#[inline(always)]
fn note_stepped() {
    #[cfg(test)]
    STEPPED.with(|r| r.set(r.get() + 1));
}

extern "C" {
    /// Whether the calling thread is inside `pthread_getattr_np` (`cpp/malloc.cpp`), which
    /// holds the thread's own lock: asking it again would wait forever.
    fn k15_memory_thread_in_pthread_getattr() -> bool;
}

/// Reads the calling thread's stack range once (slow path: `pthread_getattr_np` parses
/// `/proc/self/maps` with `malloc` for the main thread). Not from inside `pthread_getattr_np`
/// (an allocation it makes): the range stays unknown until the next capture.
#[cold]
#[inline(never)]
fn init_thread(t: &ThreadState) {
    // SAFETY: reads a thread-local flag.
    if unsafe { k15_memory_thread_in_pthread_getattr() } {
        return;
    }
    let mut attr = MaybeUninit::<libc::pthread_attr_t>::zeroed();
    let mut addr: *mut libc::c_void = ptr::null_mut();
    let mut size: libc::size_t = 0;
    // SAFETY: standard pthread attribute protocol on the current thread; the attr is destroyed
    // only after a successful getattr.
    let ok = unsafe {
        libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()) == 0 && {
            let got = libc::pthread_attr_getstack(attr.as_ptr(), &mut addr, &mut size) == 0;
            libc::pthread_attr_destroy(attr.as_mut_ptr());
            got
        }
    };
    if ok && !addr.is_null() && size != 0 {
        t.lo.set(addr as usize);
        t.hi.set(addr as usize + size);
        t.bounds.set(BOUNDS_OK);
    } else {
        t.bounds.set(BOUNDS_FAILED);
    }
    t.hint.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
}

/// The current thread's stack range, or `None` if it cannot be known.
#[inline]
fn stack_bounds(t: &ThreadState) -> Option<(usize, usize)> {
    if t.bounds.get() == BOUNDS_UNKNOWN {
        init_thread(t);
    }
    (t.bounds.get() == BOUNDS_OK).then(|| (t.lo.get(), t.hi.get()))
}

/// The calling thread's stack bounds (lowest, highest address), if they could be read.
pub(super) fn this_thread_stack_bounds() -> Option<(usize, usize)> {
    THREAD.try_with(stack_bounds).ok().flatten()
}

/// [`StartFrame::caller_of`] with both reads checked against the current thread's stack.
#[inline]
pub(super) fn caller_of_checked(fp: usize) -> StartFrame {
    let bounds = THREAD.try_with(stack_bounds).ok().flatten();
    match bounds {
        Some((lo, hi)) if fp.is_multiple_of(8) && fp >= lo && fp + 16 <= hi => {
            // SAFETY: `fp` is aligned and `[fp, fp+16)` is inside this thread's stack.
            unsafe { StartFrame::caller_of(fp) }
        }
        _ => StartFrame {
            pc: 0,
            sp: 0,
            fp: 0,
        },
    }
}

/// Unwinds from `start` into `out` (at most `out.len()` frames, `out[0] = start.pc`) and
/// returns how many were written. 0 when the stack cannot be read safely or on reentry.
pub fn unwind_into(start: StartFrame, out: &mut [MaybeUninit<usize>]) -> usize {
    walk(start, out, false).0
}

/// Unwinds like [`unwind_into`] and interns the frames; a walk that provably repeats the
/// previous one of its cache slot returns the remembered id without unwinding or hashing.
pub(super) fn capture_interned(start: StartFrame, out: &mut [MaybeUninit<usize>]) -> StackId {
    walk(start, out, true).1
}

/// Whether captures on the calling thread may reuse earlier walks (default: yes). Results are
/// the same either way; turning it off is for measuring and for testing that claim.
pub fn set_thread_memo(enabled: bool) {
    let _ = THREAD.try_with(|t| t.memo_off.set(!enabled));
}

/// Convenience over [`unwind_into`] for callers holding an initialised buffer.
pub fn unwind_into_slice(start: StartFrame, out: &mut [usize]) -> usize {
    // SAFETY: `MaybeUninit<usize>` has the layout of `usize`; `unwind_into` only writes
    // initialised values, so `out` stays fully initialised.
    let out = unsafe { &mut *(ptr::from_mut(out) as *mut [MaybeUninit<usize>]) };
    unwind_into(start, out)
}

/// The frames written and, if `intern`, their depot id.
fn walk(start: StartFrame, out: &mut [MaybeUninit<usize>], intern: bool) -> (usize, StackId) {
    THREAD
        .try_with(|t| {
            if t.busy.replace(true) {
                return (0, StackId(0));
            }
            let r = match stack_bounds(t) {
                // Caller frames all lie above the start sp, so reads below it are refused too.
                Some((lo, hi)) if start.pc != 0 && start.sp >= lo && start.sp < hi => {
                    // SAFETY: `busy` is set, so nothing else on this thread (a nested capture
                    // returns above) uses the memo until it is cleared below.
                    let memo = (!t.memo_off.get()).then(|| unsafe { &mut *t.memo.get() });
                    // SAFETY: as for the memo: `busy` keeps every other use of it out.
                    let interned = intern.then(|| unsafe { &mut *t.interned.get() });
                    unwind_checked(start, start.sp, hi, t.hint.get(), memo, interned, out)
                }
                _ => (0, StackId(0)),
            };
            t.busy.set(false);
            r
        })
        .unwrap_or((0, StackId(0)))
}

/// The depot id of `out[..n]`, interning only what differs from the thread's last stack.
fn intern_frames(interned: &mut Interned, out: &[MaybeUninit<usize>], n: usize) -> StackId {
    // SAFETY: the walk initialised exactly the first `n` elements.
    interned.intern(unsafe { core::slice::from_raw_parts(out.as_ptr().cast::<usize>(), n) })
}

fn unwind_checked(
    start: StartFrame,
    lo: usize,
    hi: usize,
    hint: usize,
    mut memo: Option<&mut Memo>,
    interned: Option<&mut Interned>,
    out: &mut [MaybeUninit<usize>],
) -> (usize, StackId) {
    if out.is_empty() {
        return (0, StackId(0));
    }
    let snap = match super::unwind_mode() {
        UnwindMode::FramePointer => None,
        UnwindMode::Dwarf => modules::current_or_scan(),
    };
    let n = match snap {
        None => {
            memo = None;
            fp_walk(start, lo, hi, out)
        }
        Some(snap) => {
            let read = |a: u64| read_word(a, lo, hi);
            // A walk that repeats the last one in full needs no unwinder cache: no slot to take.
            let again = memo
                .as_deref_mut()
                .and_then(|m| Splice::new(m, snap_id(snap)).repeat_all(start, &read, out));
            match (again, again.is_none().then(|| acquire(hint)).flatten()) {
                (Some(n), _) => {
                    note_reused(n);
                    n
                }
                (None, Some(slot)) => {
                    // SAFETY: the slot's try-lock is held, so this thread has exclusive use of
                    // its cache, which was fully built before READY published it and is never
                    // freed.
                    let cache = unsafe { &mut *SLOTS[slot].cache.load(Ordering::Acquire) };
                    let n = dwarf_walk(
                        start,
                        lo,
                        hi,
                        snap,
                        cache,
                        memo.as_deref_mut(),
                        Steps::Rules,
                        out,
                    );
                    SLOTS[slot].busy.store(false, Ordering::Release);
                    n
                }
                (None, None) => {
                    memo = None;
                    fp_walk(start, lo, hi, out)
                }
            }
        }
    };
    let Some(interned) = interned else {
        return (n, StackId(0));
    };
    let id = match memo {
        // The walk ended with the memo's frames (verified or unwound): same id.
        Some(m) if m.describes(n) && m.id != 0 => StackId(m.id),
        Some(m) if m.describes(n) => {
            let id = intern_frames(interned, out, n);
            m.id = id.0;
            id
        }
        _ => intern_frames(interned, out, n),
    };
    (n, id)
}

/// Snapshots are never freed, so their addresses name them.
fn snap_id(s: &'static Snapshot) -> usize {
    ptr::from_ref(s) as usize
}

/// Takes a free cache slot, starting at the thread's hint; creates a cache if all are busy.
#[inline]
fn acquire(hint: usize) -> Option<usize> {
    loop {
        let ready = READY.load(Ordering::Acquire);
        for k in 0..ready {
            let i = (hint + k) % ready;
            if SLOTS[i]
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Some(i);
            }
        }
        if !grow(ready) {
            return None;
        }
    }
}

/// Cold path: adds one cache to the pool if it still has `seen` caches. False when full.
#[cold]
#[inline(never)]
fn grow(seen: usize) -> bool {
    let _guard = GROW.lock().unwrap_or_else(|e| e.into_inner());
    let ready = READY.load(Ordering::Acquire);
    if ready != seen {
        return true; // another thread grew it meanwhile: retry
    }
    if ready == POOL {
        return false;
    }
    // Allocated through the Rust global allocator (framehop boxes its tables); never freed.
    let cache = Box::into_raw(Box::new(Cache::new()));
    SLOTS[ready].cache.store(cache, Ordering::Release);
    READY.store(ready + 1, Ordering::Release);
    true
}

/// Pre-creates enough caches for every CPU to capture at once (at most [`POOL`]).
pub(super) fn warm_up_caches() {
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let want = (cpus.max(1) as usize).min(POOL);
    while READY.load(Ordering::Acquire) < want {
        if !grow(READY.load(Ordering::Acquire)) {
            break;
        }
    }
}

/// Reads one aligned word of the current thread's stack inside `[lo, hi)`, or fails.
#[inline(always)]
fn read_word(addr: u64, lo: usize, hi: usize) -> Result<u64, ()> {
    let a = addr as usize;
    if a.is_multiple_of(8) && a >= lo && a < hi && hi - a >= 8 {
        // SAFETY: `[a, a+8)` is aligned and inside this thread's mapped stack, above the start
        // sp, so it is readable (contents are whatever is there; unwinding only interprets it).
        Ok(unsafe { ptr::read_volatile(a as *const u64) })
    } else {
        Err(())
    }
}

/// Which unwinder makes the steps of a DWARF walk.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Steps {
    /// The snapshot's compiled rules; framehop for what they leave to it. The capture path.
    Rules,
    /// framehop for every step: the referee of the tests.
    #[cfg(test)]
    FramehopOnly,
}

/// One step from the frame at `pc` (registers in `regs`), updating `regs` to the caller's;
/// the caller's return address, or `None` where the walk ends.
#[inline]
fn step(
    snap: &Snapshot,
    steps: Steps,
    pc: usize,
    regs: &mut UnwindRegsX86_64,
    cache: &mut Cache,
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Option<u64> {
    if steps == Steps::Rules {
        let rule = snap.rules.get(pc, || snap.sections_of(pc), &mut cache.cfi);
        if rule != Rule::FRAMEHOP_STEP {
            let (ra, sp, bp) = rule.step(regs.sp(), regs.bp(), read)?;
            regs.set_ip(ra);
            regs.set_sp(sp);
            regs.set_bp(bp);
            return Some(ra);
        }
    }
    let addr = FrameAddress::from_return_address(pc as u64)?;
    snap.unwinder
        .unwind_frame(addr, regs, &mut cache.framehop, read)
        .ok()
        .flatten()
}

/// The DWARF walk. With `memo`, it takes over the frames of the slot's previous walk that
/// provably repeat (see memo.rs) and leaves a memo of this walk.
#[allow(clippy::too_many_arguments)] // the walk's whole state, passed down once
fn dwarf_walk(
    start: StartFrame,
    lo: usize,
    hi: usize,
    mut snap: &'static Snapshot,
    cache: &mut Cache,
    memo: Option<&mut Memo>,
    steps: Steps,
    out: &mut [MaybeUninit<usize>],
) -> usize {
    let read = |a: u64| read_word(a, lo, hi);
    let depth = out.len();
    let mut regs = UnwindRegsX86_64::new(start.pc as u64, start.sp as u64, start.fp as u64);
    let mut pc = start.pc;
    let mut n = 0;
    let mut ended = false;
    let mut splice = memo.map(|m| Splice::new(m, snap_id(snap)));
    // Consecutive frames are mostly in the same module: check its range before searching.
    let mut known = 0..0;
    loop {
        if !known.contains(&pc) {
            known = match snap.module_of(pc) {
                Some(r) => r,
                // Not in any known module: maybe a library loaded since the scan (slow path).
                None => match modules::refresh().and_then(|s| Some((s, s.module_of(pc)?))) {
                    Some((s, r)) => {
                        if let Some(sp) = splice.as_mut().filter(|_| !ptr::eq(s, snap)) {
                            sp.invalidate();
                        }
                        snap = s;
                        r
                    }
                    None => break, // JIT code or garbage: stop rather than guess
                },
            };
        }
        let here = (pc, regs.sp() as usize, regs.bp() as usize);
        match splice
            .as_mut()
            .and_then(|s| s.take_over(n, here, depth, &read, out))
        {
            Some((g, end)) => {
                // The last walk had this frame: its frames that provably repeat are in `out`.
                note_reused(g);
                n += g;
                if n == depth || end {
                    ended = end;
                    break;
                }
                // A step failed to verify (a saved register changed, say): step afresh from
                // the last frame that repeated; later frames may match again.
                // Other registers framehop keeps are never read by its x86-64 steps.
                let (p, s, f) = splice.as_ref().map_or(here, |s| s.frame(n - 1));
                regs.set_ip(p as u64);
                regs.set_sp(s as u64);
                regs.set_bp(f as u64);
                pc = p;
            }
            None => {
                if let Some(s) = splice.as_mut() {
                    s.push_frame(n, here.0, here.1, here.2);
                }
                out[n].write(pc);
                n += 1;
                if n == depth {
                    break;
                }
            }
        }
        if let Some(s) = splice.as_mut() {
            s.begin_step(n - 1);
        }
        let prev_sp = regs.sp();
        note_stepped();
        let mut logged = |a: u64| {
            let r = read(a);
            if let Some(s) = splice.as_mut() {
                s.log(n - 1, a, r);
            }
            r
        };
        let stepped = step(snap, steps, pc, &mut regs, cache, &mut logged);
        match stepped {
            // The stack grows down: a caller's sp must be above its callee's, or we would loop.
            Some(ra) if ra != 0 && regs.sp() > prev_sp => {
                if let Some(s) = splice.as_mut() {
                    s.end_step(n - 1, (ra as usize, regs.sp() as usize, regs.bp() as usize));
                }
                pc = ra as usize;
            }
            _ => {
                ended = true;
                break;
            }
        }
    }
    if let Some(s) = splice {
        s.finish(n, ended);
    }
    n
}

/// The opt-in walk along saved rbp values; loses frames in code without frame pointers.
pub(super) fn fp_walk(
    start: StartFrame,
    lo: usize,
    hi: usize,
    out: &mut [MaybeUninit<usize>],
) -> usize {
    out[0].write(start.pc);
    let mut n = 1;
    let mut fp = start.fp;
    let mut floor = lo;
    while n < out.len() {
        // Each saved frame must be inside the stack and above the previous one.
        if fp < floor {
            break;
        }
        let (Ok(next), Ok(ra)) = (
            read_word(fp as u64, lo, hi),
            read_word(fp as u64 + 8, lo, hi),
        ) else {
            break;
        };
        if ra == 0 {
            break;
        }
        out[n].write(ra as usize);
        n += 1;
        floor = fp + 16;
        fp = next as usize;
    }
    n
}
