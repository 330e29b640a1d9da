//! Unwinding into a fixed buffer: DWARF CFI through a pool of rule caches, or the opt-in rbp walk.
//!
//! Per-thread state is one `const`-initialised, `Drop`-free thread-local (stack bounds, a
//! cache-slot hint, a reentrancy flag): C++ `thread_local` destructors run `delete` after Rust
//! TLS destructors would have run, so nothing here may need one.
//!
//! Unwinder caches (a framehop rule cache plus gimli's fixed-size CFI evaluation context, tens of KiB
//! each, and the [`Memos`] of the slot's last walk, about 10 KiB) live in a static pool of [`POOL`] slots, each behind a try-lock. A thread starts at its own
//! slot (by a per-thread hint) and takes the first free one; it never waits. Rules are keyed
//! by address, so threads running the same code share warm caches, and the number of caches
//! follows the number of *simultaneous* captures, not the number of threads ever created
//! (a per-thread cache would need a destructor to be given back at thread exit). A cache is
//! created only when every existing one is busy (cold path); if the pool is exhausted the
//! capture falls back to the frame-pointer walk.

use core::cell::Cell;
use core::mem::MaybeUninit;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, MustNotAllocateDuringUnwind, Unwinder};

use super::memo::{Memo, Memos};
use super::modules::{self, Snapshot};
use super::{depot, StackId, StartFrame, UnwindMode};

/// Number of unwinder-cache slots; more simultaneous captures than this use the rbp walk.
pub const POOL: usize = 64;

type Cache = CacheX86_64<MustNotAllocateDuringUnwind>;

/// What a slot's holder uses exclusively: the rule cache and the memo of the slot's last walk.
struct SlotState {
    cache: Cache,
    memos: Memos,
}

#[repr(align(64))] // one slot per cache line: the try-locks of different threads don't share
struct Slot {
    busy: AtomicBool,
    cache: AtomicPtr<SlotState>,
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
    /// Set by [`set_thread_memo`]`(false)`: walks neither use nor update the memos.
    memo_off: Cell<bool>,
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
        }
    };
}

#[cfg(test)]
thread_local! {
    /// Frames this thread's walks took over from a memo instead of unwinding (tests only).
    pub(super) static REUSED: Cell<usize> = const { Cell::new(0) };
}

/// Counts frames taken from a memo, so tests can tell that the memo path really ran.
#[inline(always)]
fn note_reused(_frames: usize) {
    #[cfg(test)]
    REUSED.with(|r| r.set(r.get() + _frames));
}

/// Reads the calling thread's stack range once (slow path: `pthread_getattr_np` parses
/// `/proc/self/maps` with `malloc` for the main thread).
#[cold]
#[inline(never)]
fn init_thread(t: &ThreadState) {
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
                    let memo = !t.memo_off.get();
                    unwind_checked(start, start.sp, hi, t.hint.get(), memo, intern, out)
                }
                _ => (0, StackId(0)),
            };
            t.busy.set(false);
            r
        })
        .unwrap_or((0, StackId(0)))
}

/// The depot id of `out[..n]`.
fn intern_frames(out: &[MaybeUninit<usize>], n: usize) -> StackId {
    // SAFETY: the walk initialised exactly the first `n` elements.
    depot::intern(unsafe { core::slice::from_raw_parts(out.as_ptr().cast::<usize>(), n) })
}

fn unwind_checked(
    start: StartFrame,
    lo: usize,
    hi: usize,
    hint: usize,
    memo: bool,
    intern: bool,
    out: &mut [MaybeUninit<usize>],
) -> (usize, StackId) {
    if out.is_empty() {
        return (0, StackId(0));
    }
    let dwarf = match super::unwind_mode() {
        UnwindMode::FramePointer => None,
        UnwindMode::Dwarf => modules::current_or_scan().and_then(|s| Some((s, acquire(hint)?))),
    };
    let (n, remembered) = match dwarf {
        None => (fp_walk(start, lo, hi, out), None),
        Some((snap, slot)) => {
            // SAFETY: the slot's try-lock is held, so this thread has exclusive use of its
            // state, which was fully built before READY published it and is never freed.
            let state = unsafe { &mut *SLOTS[slot].cache.load(Ordering::Acquire) };
            let r = if memo {
                let n = dwarf_walk(
                    start,
                    lo,
                    hi,
                    snap,
                    &mut state.cache,
                    Some(&mut state.memos),
                    out,
                );
                let front = state.memos.pair().0;
                // Interning here, with the slot held, lets the id be remembered with the memo.
                let id = if !intern || !front.describes(n) {
                    None
                } else if front.id != 0 {
                    // The walk verified the memo without changing it: same frames, same id.
                    Some(StackId(front.id))
                } else {
                    let id = intern_frames(out, n);
                    front.id = id.0;
                    Some(id)
                };
                (n, id)
            } else {
                (
                    dwarf_walk(start, lo, hi, snap, &mut state.cache, None, out),
                    None,
                )
            };
            SLOTS[slot].busy.store(false, Ordering::Release);
            r
        }
    };
    let id = match remembered {
        Some(id) => id,
        None if intern => intern_frames(out, n),
        None => StackId(0),
    };
    (n, id)
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
    let cache = Box::into_raw(Box::new(SlotState {
        cache: Cache::new_in(),
        memos: Memos::EMPTY,
    }));
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

/// The DWARF walk. With `memos`, it reuses the part of the slot's previous walk that provably
/// repeats (see memo.rs) and leaves a memo of this walk in front.
fn dwarf_walk(
    start: StartFrame,
    lo: usize,
    hi: usize,
    mut snap: &'static Snapshot,
    cache: &mut Cache,
    mut memos: Option<&mut Memos>,
    out: &mut [MaybeUninit<usize>],
) -> usize {
    let read = |a: u64| read_word(a, lo, hi);
    let snap_id = |s: &'static Snapshot| ptr::from_ref(s) as usize;
    let depth = out.len();
    let mut regs = UnwindRegsX86_64::new(start.pc as u64, start.sp as u64, start.fp as u64);
    let mut pc = start.pc;
    let mut n = 0;
    // Consecutive frames are mostly in the same module: check its range before searching.
    let mut known = 0..0;
    // `new`: the memo this walk writes; `old`: the previous walk, to splice from.
    let mut new: Option<&mut Memo> = None;
    let mut old: Option<&Memo> = None;
    // The frame at `regs` was already emitted; go straight to its step.
    let mut emitted = false;
    let mut j = 0; // memo frames below `j` lie below the current sp: they can't match any more
    if let Some(m) = memos.as_deref_mut() {
        let (front, back) = m.pair();
        back.reset(snap_id(snap));
        if front.frame_is(0, snap_id(snap), start.pc, start.sp, start.fp) {
            // Same start as the last walk: the usual case at a hot allocation site.
            let g = front.repeating(0, depth, &read);
            note_reused(g);
            let ended = g == front.len() && g < depth && front.end_holds(&read);
            emit(out, 0, front.pcs(0, g));
            if g == front.len() && (g == depth || ended) {
                return g; // all of it repeats: the memo stays as it is, id included
            }
            back.append_from(front, 0, g, ended);
            n = g;
            j = g;
            if n == depth || ended {
                m.swap();
                return n;
            }
            let (p, s, f) = front.frame(g - 1);
            regs = UnwindRegsX86_64::new(p as u64, s as u64, f as u64);
            pc = p;
            emitted = true;
        }
        new = Some(back);
        old = Some(front);
    }
    loop {
        if !emitted {
            if !known.contains(&pc) {
                known = match snap.module_of(pc) {
                    Some(r) => r,
                    // Not in any known module: maybe a library loaded since the scan (slow path).
                    None => match modules::refresh().and_then(|s| Some((s, s.module_of(pc)?))) {
                        Some((s, r)) => {
                            if !ptr::eq(s, snap) {
                                // Frames so far were checked against the old module list.
                                if let Some(m) = new.as_deref_mut() {
                                    m.invalidate();
                                }
                                old = None;
                            }
                            snap = s;
                            r
                        }
                        None => break, // JIT code or garbage: stop rather than guess
                    },
                };
            }
            let (sp, fp) = (regs.sp() as usize, regs.bp() as usize);
            let matched = old.and_then(|o| {
                j = o.seek(j, sp);
                o.frame_is(j, snap_id(snap), pc, sp, fp).then_some(o)
            });
            if let Some(o) = matched {
                // This frame was unwound last time too: take over the frames that repeat.
                let g = o.repeating(j, depth - n, &read);
                note_reused(g);
                let ended = j + g == o.len() && n + g < depth && o.end_holds(&read);
                emit(out, n, o.pcs(j, g));
                if let Some(m) = new.as_deref_mut() {
                    m.append_from(o, j, g, ended);
                }
                n += g;
                if n == depth || ended {
                    break;
                }
                // A step failed to verify (a saved register changed, say); later frames may
                // match again once the walk is past the difference.
                j += g;
                let (p, s, f) = o.frame(j - 1);
                regs = UnwindRegsX86_64::new(p as u64, s as u64, f as u64);
                pc = p;
            } else {
                if let Some(m) = new.as_deref_mut() {
                    m.push_frame(pc, sp, fp);
                }
                out[n].write(pc);
                n += 1;
                if n == depth {
                    break;
                }
            }
        }
        emitted = false;
        let prev_sp = regs.sp();
        let stepped = FrameAddress::from_return_address(pc as u64).and_then(|addr| {
            let mut logged = |a: u64| {
                let r = read(a);
                if let Some(m) = new.as_deref_mut() {
                    m.log(a, r);
                }
                r
            };
            snap.unwinder
                .unwind_frame(addr, &mut regs, cache, &mut logged)
                .ok()
                .flatten()
        });
        match stepped {
            // The stack grows down: a caller's sp must be above its callee's, or we would loop.
            Some(ra) if ra != 0 && regs.sp() > prev_sp => pc = ra as usize,
            _ => {
                if let Some(m) = new.as_deref_mut() {
                    m.push_end();
                }
                break;
            }
        }
    }
    if let Some(m) = memos {
        m.swap();
    }
    n
}

/// Writes `pcs` to `out[at..]`.
#[inline]
fn emit(out: &mut [MaybeUninit<usize>], at: usize, pcs: &[usize]) {
    for (o, &p) in out[at..at + pcs.len()].iter_mut().zip(pcs) {
        o.write(p);
    }
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
