//! Unwinding into a fixed buffer: DWARF CFI through a pool of rule caches, or the opt-in rbp walk.
//!
//! Per-thread state is one `const`-initialised, `Drop`-free thread-local (stack bounds, a
//! cache-slot hint, a reentrancy flag, and the thread's last interned stack): C++
//! `thread_local` destructors run `delete` after Rust TLS destructors would have run, so
//! nothing here may need one.
//!
//! A step is one look in the thread's memo of rules, or on a miss one probe of the compiled
//! rules ([`super::rules`]), and one or two reads of the stack; only a return address met for
//! the first time, one outside the modules known so far, or a rule the table leaves to framehop
//! takes the slow path. Before each step the walk looks for its frame in the thread's last walk
//! ([`super::last_walk`]): once it reaches one (same pc and sp), it takes over the last walk's
//! outer frames if the words their steps read read the same again, a load and a compare per
//! frame where a step is a probe and a chain of dependent loads.
//!
//! A walk that starts outside the thread's stack (a fiber's, a signal handler's alternate one)
//! reads only pages the kernel says can be read ([`ForeignStack`]), and a return into
//! `rt_sigreturn` steps to the registers the signal interrupted.
//!
//! Unwinder caches (a framehop rule cache plus gimli's fixed-size CFI evaluation context, tens of KiB each)
//! live in a static pool of [`POOL`] slots, each behind a try-lock. Only slow steps need one: a
//! walk takes its slot at its first slow step (most walks have none, and taking a slot is a
//! locked compare-and-swap, which waits for every store the allocation made before it). A thread starts at its own
//! slot (by a per-thread hint) and takes the first free one; it never waits. Rules are keyed
//! by address, so threads running the same code share warm caches, and the number of caches
//! follows the number of *simultaneous* captures, not the number of threads ever created
//! (a per-thread cache would need a destructor to be given back at thread exit). A cache is
//! created only when every existing one is busy (cold path); if the pool is exhausted the
//! walk ends at its first slow step.

use core::cell::{Cell, UnsafeCell};
use core::mem::MaybeUninit;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, MustNotAllocateDuringUnwind, Unwinder};

use super::depot::{self, Interned};
use super::last_walk::LastWalk;
use super::modules::{self, Snapshot};
use super::rules::{CfiContext, Rule, RULES};
use super::{StackId, StartFrame, UnwindMode};
use crate::sys;

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
            cfi: CfiContext::new_in(),
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
    /// Preferred cache slot: the one the thread took last, so that threads settle on slots of
    /// their own and a capture's one compare-and-swap finds its slot free (a slot another
    /// thread holds costs a failed one and the cache line's trip between cores).
    hint: Cell<usize>,
    /// Set while this thread is inside `unwind_into`: a nested capture (an allocation made by a
    /// slow path, a signal handler) returns an empty stack instead of deadlocking on a rescan.
    busy: Cell<bool>,
    /// The thread's last interned stack; only touched while `busy` is set.
    interned: UnsafeCell<Interned>,
    /// The thread's last DWARF walk; only touched while `busy` is set.
    last: UnsafeCell<LastWalk>,
    /// The stack the program said the thread runs on now ([`running_on_stack`]): `[lo, hi)`,
    /// empty for none; and the top of the named stack its last walk on one ran on (the last
    /// walk's frames are forgotten when the next named walk runs on another).
    named: Cell<(usize, usize)>,
    last_top: Cell<usize>,
    /// During a walk of a stack the thread is not known to own ([`ForeignStack`]): the run of
    /// pages `[lo, hi)` from the walk's start up that the kernel said this thread can read.
    foreign_pages: Cell<(usize, usize)>,
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
            interned: UnsafeCell::new(Interned::EMPTY),
            last: UnsafeCell::new(LastWalk::EMPTY),
            named: Cell::new((0, 0)),
            last_top: Cell::new(0),
            foreign_pages: Cell::new((0, 0)),
        }
    };
}

/// The address range of the calling thread's [`ThreadState`].
pub(super) fn thread_state_range() -> core::ops::Range<usize> {
    THREAD.with(crate::sys::bytes_of)
}

/// A DWARF walk by framehop alone, with a brand-new rule cache and no rule table (tests only): framehop's cache is not quite transparent (a failed DWARF evaluation caches
/// the frame-pointer rule for that address), so this is the reference that depends on nothing
/// but the stack, and it shares no code with the compiled rules it referees.
#[cfg(test)]
pub(super) fn unwind_uncached(start: StartFrame, out: &mut [MaybeUninit<usize>]) -> usize {
    let hi = THREAD.with(|t| stack_bounds(t).map_or(0, |b| b.1));
    let snap = modules::current_or_scan().expect("modules");
    let mut cache = Box::new(Cache::new());
    let stack = Stack::new(start.sp, hi);
    dwarf_walk(
        start,
        stack,
        snap,
        &mut *cache,
        Steps::FramehopOnly,
        None,
        out,
    )
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

/// The calling thread's stack bounds (lowest, highest address), if they could be read, and the
/// stack the program said it runs on now ([`running_on_stack`]; empty for none).
pub(super) fn this_thread_stack_bounds() -> (Option<(usize, usize)>, (usize, usize)) {
    THREAD
        .try_with(|t| (stack_bounds(t), t.named.get()))
        .unwrap_or((None, (0, 0)))
}

/// [`StartFrame::caller_of`] with both reads checked against the current thread's stack, or
/// asked of the kernel on a stack the thread is not known to own.
#[inline]
pub(super) fn caller_of_checked(fp: usize) -> StartFrame {
    let bounds = THREAD.try_with(stack_bounds).ok().flatten();
    match bounds {
        Some((lo, hi)) if fp.is_multiple_of(8) && fp >= lo && fp + 16 <= hi => {
            // SAFETY: `fp` is aligned and `[fp, fp+16)` is inside this thread's stack.
            unsafe { StartFrame::caller_of(fp) }
        }
        _ => caller_of_foreign(fp),
    }
}

/// [`caller_of_checked`] on a fiber's or a signal handler's stack (slow path).
#[cold]
#[inline(never)]
fn caller_of_foreign(fp: usize) -> StartFrame {
    let named = THREAD.try_with(|t| t.named.get()).unwrap_or((0, 0));
    if fp.is_multiple_of(8) && fp >= named.0 && fp.saturating_add(16) <= named.1 {
        // SAFETY: `fp` is aligned and `[fp, fp+16)` is inside the stack the program said the
        // thread runs on.
        return unsafe { StartFrame::caller_of(fp) };
    }
    let stack = ForeignStack::from(fp);
    match (stack.read(fp as u64), stack.read(fp as u64 + 8)) {
        (Ok(saved_fp), Ok(ret)) => StartFrame {
            pc: ret as usize,
            sp: fp + 16,
            fp: saved_fp as usize,
        },
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
    match walk(start, out, false).0 {
        0 => walk_foreign(start, out, false).0,
        n => n,
    }
}

/// Unwinds like [`unwind_into`] and interns the frames (only those in front of the outer part
/// shared with the thread's previous stack are looked up in the depot).
#[inline]
pub(super) fn capture_interned(start: StartFrame, out: &mut [MaybeUninit<usize>]) -> StackId {
    match walk(start, out, true) {
        (0, _) => walk_foreign(start, out, true).1,
        (_, id) => id,
    }
}

/// Interns `frames` through the calling thread's last interned stack (the lookups of the outer
/// frames it repeats are skipped); through the depot alone in a signal handler that interrupted
/// a capture, or once the thread's state is gone.
pub(super) fn intern_frames(frames: &[usize]) -> StackId {
    THREAD
        .try_with(|t| {
            if t.busy.replace(true) {
                return depot::intern(frames);
            }
            // SAFETY: `busy` is set, so nothing else on this thread uses its interned stack
            // until it is cleared below.
            let id = unsafe { &mut *t.interned.get() }.intern(frames);
            t.busy.set(false);
            id
        })
        .unwrap_or_else(|_| depot::intern(frames))
}

/// Nodes the calling thread has added to the depot so far (wrapping); `None` inside a capture
/// (a signal handler) or once the thread's state is gone.
pub(super) fn nodes_added() -> Option<u32> {
    THREAD
        .try_with(|t| {
            // SAFETY: outside a capture (`busy` clear) nothing on this thread holds its interned
            // stack, and other threads never touch it.
            (!t.busy.get()).then(|| unsafe { &*t.interned.get() }.nodes_added())
        })
        .ok()
        .flatten()
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
                    // returns above) uses the last stack until it is cleared below.
                    let interned = intern.then(|| unsafe { &mut *t.interned.get() });
                    // SAFETY: as for the last stack.
                    let last = unsafe { &mut *t.last.get() };
                    last.forget_outcome();
                    let n = unwind_checked(start, Stack::new(start.sp, hi), &t.hint, last, out);
                    // `LastWalk::finish` written out: a call to it keeps `walk` from being
                    // inlined into the allocation path (yaml-cpp: +8 M instructions).
                    match interned {
                        Some(interned) => (n, last.intern(interned, out, n)),
                        None => {
                            last.write_taken_over(out);
                            (n, StackId(0))
                        }
                    }
                }
                _ => (0, StackId(0)),
            };
            t.busy.set(false);
            r
        })
        .unwrap_or((0, StackId(0)))
}

/// [`walk`] again where it found no frame because `start` lies outside the thread's stack: on a
/// fiber's, or a signal handler's alternate stack (slow path). On the stack the program named
/// ([`running_on_stack`]) the walk is the thread's own kind, bounded by it; on any other, no
/// take-over (the last walk's frames may lie on a stack since unmapped) and every page asked
/// for.
#[cold]
#[inline(never)]
fn walk_foreign(
    start: StartFrame,
    out: &mut [MaybeUninit<usize>],
    intern: bool,
) -> (usize, StackId) {
    THREAD
        .try_with(|t| {
            let own = stack_bounds(t).is_some_and(|(lo, hi)| (lo..hi).contains(&start.sp));
            if own || start.pc == 0 || t.busy.replace(true) {
                return (0, StackId(0));
            }
            // SAFETY: `busy` is set, so nothing else on this thread uses its interned stack or
            // its last walk until it is cleared below.
            let (interned, last) = unsafe { (&mut *t.interned.get(), &mut *t.last.get()) };
            let (lo, hi) = t.named.get();
            let r = if (lo..hi).contains(&start.sp) {
                if t.last_top.replace(hi) != hi {
                    last.forget_frames();
                }
                last.forget_outcome();
                let stack = NamedStack(Stack::new(start.sp, hi));
                let n = unwind_as(super::unwind_mode(), start, stack, &t.hint, Some(last), out);
                (n, last.finish(intern.then_some(interned), out, n))
            } else {
                let stack = ForeignStack::from(start.sp);
                let n = unwind_as(super::unwind_mode(), start, stack, &t.hint, None, out);
                // SAFETY: the walk initialised `out[..n]`.
                let frames =
                    unsafe { core::slice::from_raw_parts(out.as_ptr().cast::<usize>(), n) };
                let id = if intern {
                    interned.intern(frames)
                } else {
                    StackId(0)
                };
                (n, id)
            };
            t.busy.set(false);
            r
        })
        .unwrap_or((0, StackId(0)))
}

/// The program says the calling thread now runs on `[lowest, lowest + size)` (a fiber's stack
/// of its job system), or, with `size == 0`, on its own: captures there are walked as on the
/// thread's own stack, bounded by it, instead of asking the kernel page by page.
///
/// The range must be the mapped stack the thread runs on (the walk reads anywhere in it above
/// the capture's frame), as ASan's `__sanitizer_finish_switch_fiber` expects.
pub fn running_on_stack(lowest: usize, size: usize) {
    let named = match lowest.checked_add(size) {
        Some(top) if size != 0 => (lowest, top),
        _ => (0, 0),
    };
    let _ = THREAD.try_with(|t| t.named.set(named));
}

/// The frames of one walk from `start`: DWARF through a cache slot, or the rbp walk when
/// frame pointers were asked for, the modules cannot be read or every slot is busy.
fn unwind_checked(
    start: StartFrame,
    stack: Stack,
    hint: &Cell<usize>,
    last: &mut LastWalk,
    out: &mut [MaybeUninit<usize>],
) -> usize {
    unwind_as(super::unwind_mode(), start, stack, hint, Some(last), out)
}

/// [`unwind_checked`] with the unwinder `mode`. A cache slot is taken only for a DWARF walk,
/// and given back right after it.
fn unwind_as(
    mode: UnwindMode,
    start: StartFrame,
    stack: impl StackWords,
    hint: &Cell<usize>,
    last: Option<&mut LastWalk>,
    out: &mut [MaybeUninit<usize>],
) -> usize {
    if out.is_empty() {
        return 0;
    }
    let snap = match mode {
        UnwindMode::FramePointer => None,
        UnwindMode::Dwarf => modules::current_or_scan(),
    };
    match snap {
        Some(snap) => {
            let mut pool = PoolCache { hint, held: None };
            dwarf_walk(start, stack, snap, &mut pool, Steps::Rules, last, out)
        }
        None => fp_walk(start, stack, out),
    }
}

/// Where a walk's slow steps find an unwinder cache.
trait CacheSource {
    /// The cache, or `None` when there is none to be had.
    fn cache(&mut self) -> Option<&mut Cache>;
}

/// A slot of the pool, taken at the walk's first slow step and given back when the walk ends.
struct PoolCache<'a> {
    /// The thread's preferred slot, then the one it took: threads settle on slots of their own.
    hint: &'a Cell<usize>,
    held: Option<usize>,
}

impl CacheSource for PoolCache<'_> {
    fn cache(&mut self) -> Option<&mut Cache> {
        let slot = match self.held {
            Some(slot) => slot,
            None => {
                let slot = acquire(self.hint.get())?;
                self.hint.set(slot);
                self.held = Some(slot);
                slot
            }
        };
        // SAFETY: the slot's try-lock is held, so this thread has exclusive use of its cache,
        // which was fully built before READY published it and is never freed.
        Some(unsafe { &mut *SLOTS[slot].cache.load(Ordering::Acquire) })
    }
}

impl Drop for PoolCache<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.held {
            release(slot);
        }
    }
}

/// The referee's own cache (tests only).
#[cfg(test)]
impl CacheSource for Cache {
    fn cache(&mut self) -> Option<&mut Cache> {
        Some(self)
    }
}

#[cfg(test)]
thread_local! {
    /// Cache slots the calling thread holds (tests only): none once a walk is over.
    pub(super) static SLOTS_HELD: Cell<usize> = const { Cell::new(0) };
    /// Walks of the calling thread that took over the rest of its last walk (tests only).
    pub(super) static REPEATED: Cell<usize> = const { Cell::new(0) };
    /// Of those, the walks that took it over from a frame above their start (tests only).
    pub(super) static TAKEN_OVER_INSIDE: Cell<usize> = const { Cell::new(0) };
}

/// Both unwinders from `start` through [`unwind_as`], each checked to give its cache slot back
/// (tests only): the frame counts, DWARF first.
#[cfg(test)]
pub(super) fn unwind_both_ways(start: StartFrame, depth: usize) -> (usize, usize) {
    let hi = THREAD.with(|t| stack_bounds(t).map_or(0, |b| b.1));
    let stack = Stack::new(start.sp, hi);
    let mut out = [MaybeUninit::uninit(); super::MAX_DEPTH];
    let mut walk = |mode| {
        let n = unwind_as(mode, start, stack, &Cell::new(0), None, &mut out[..depth]);
        assert_eq!(SLOTS_HELD.with(Cell::get), 0, "{mode:?} kept a cache slot");
        n
    };
    (walk(UnwindMode::Dwarf), walk(UnwindMode::FramePointer))
}

fn release(slot: usize) {
    #[cfg(test)]
    SLOTS_HELD.with(|h| h.set(h.get() - 1));
    SLOTS[slot].busy.store(false, Ordering::Release);
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
                #[cfg(test)]
                SLOTS_HELD.with(|h| h.set(h.get() + 1));
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

/// Held by `fork` (see `tracker::fork`), last of its locks: a thread adding a cache needs
/// none of the others (its allocation is the tracker's own), and one holding any of them may
/// be capturing a stack.
pub(crate) fn lock_caches_for_fork() -> std::sync::MutexGuard<'static, ()> {
    GROW.lock().unwrap_or_else(|e| e.into_inner())
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

/// How a walk reads the stack: [`Stack`] on the thread's own, [`ForeignStack`] elsewhere.
pub(super) trait StackWords: Copy {
    /// One aligned word the walk may read, or `Err`.
    fn read(self, addr: u64) -> Result<u64, ()>;
    /// The walk goes on from `sp`, on the stack a signal frame's interrupted code ran on.
    fn restart_at(self, sp: u64);
    /// What the thread's last walk may check again of this stack (its own stack only).
    fn own(self) -> Stack;
    /// The rule a step by `rule` takes on this stack.
    #[inline(always)]
    fn rule(self, rule: Rule) -> Rule {
        rule
    }
}

/// The part of the current thread's stack a walk may read: `[lo, hi)`, from the start frame's
/// sp (caller frames all lie above it) to the top.
#[derive(Clone, Copy)]
pub(super) struct Stack {
    lo: usize,
    /// `hi - lo - 8`: an aligned word at `a` is inside when `a - lo <= last` (one compare).
    last: usize,
}

impl Stack {
    fn new(lo: usize, hi: usize) -> Stack {
        Stack {
            lo,
            last: (hi - lo).saturating_sub(8),
        }
    }

    /// Whether every aligned word from `low` up that an earlier walk of this thread read lies
    /// inside the range (so [`Stack::read_again`] may read it).
    #[inline(always)]
    pub(super) fn holds_from(self, low: u64) -> bool {
        low as usize >= self.lo && self.last != 0
    }

    /// A word an earlier walk of this thread read successfully, at or above a `low` that
    /// [`Stack::holds_from`] accepted: aligned and inside the range, so no check is left.
    ///
    /// # Safety
    /// As said: `addr` was read by [`StackWords::read`] of a walk of this thread (same stack
    /// top), and `holds_from(low)` holds for some `low <= addr`.
    #[inline(always)]
    pub(super) unsafe fn read_again(self, addr: u64) -> u64 {
        // SAFETY: aligned and below the top (it read before, on this thread's stack), and at or
        // above this walk's start sp: mapped and readable, as for `read`.
        unsafe { ptr::read_volatile(addr as *const u64) }
    }
}

impl StackWords for Stack {
    /// A word inside the range, or `Err` (also for an empty range).
    #[inline(always)]
    fn read(self, addr: u64) -> Result<u64, ()> {
        let a = addr as usize;
        if a.is_multiple_of(8) && a.wrapping_sub(self.lo) <= self.last && self.last != 0 {
            // SAFETY: `[a, a+8)` is aligned and inside this thread's mapped stack, above the
            // start sp, so it is readable (contents are whatever is there; unwinding only
            // interprets them).
            Ok(unsafe { ptr::read_volatile(a as *const u64) })
        } else {
            Err(())
        }
    }

    /// Interrupted code on another stack is out of the range: the walk ends there.
    fn restart_at(self, _sp: u64) {}

    fn own(self) -> Stack {
        self
    }
}

/// The stack the program said the thread runs on ([`running_on_stack`]): read as the thread's
/// own, within its bounds, but a walk ends at code no FDE covers, which is the fiber's entry
/// trampoline (`__start_context`, `boost.context`'s): its frame-pointer guess would read the
/// rbp the trampoline was left with and make every walk's take-over hang on that register.
#[derive(Clone, Copy)]
struct NamedStack(Stack);

impl StackWords for NamedStack {
    #[inline(always)]
    fn read(self, addr: u64) -> Result<u64, ()> {
        self.0.read(addr)
    }

    fn restart_at(self, _sp: u64) {}

    fn own(self) -> Stack {
        self.0
    }

    #[inline(always)]
    fn rule(self, rule: Rule) -> Rule {
        match rule {
            Rule::FRAME_POINTER => Rule::END_OF_STACK,
            rule => rule,
        }
    }
}

/// A stack the thread is not known to own: a fiber's (`swapcontext`, `boost.context`, an
/// engine's job system) or a signal handler's alternate one. Its bounds are nowhere to be had
/// (the program mapped it), so a walk reads only the run of pages from its start up that the
/// kernel says can be read, asked a page at a time as it climbs (one syscall each; a walk of a
/// fiber usually asks once or twice). The run starts afresh with each walk: a page
/// read during an earlier one may have been unmapped since. A word below the run, or beyond a
/// page that cannot be read, is not read: a walk that would jump there (a stale frame pointer
/// into another stack) ends instead.
#[derive(Clone, Copy)]
pub(super) struct ForeignStack;

/// How far above the pages read so far a walk of a foreign stack may read: a frame of up to
/// 256 KiB (a step further is garbage, or a stack switch the walk cannot follow).
const FOREIGN_REACH: usize = 64 * sys::PAGE_SIZE;

impl ForeignStack {
    /// The walk from `sp`.
    fn from(sp: usize) -> ForeignStack {
        ForeignStack.restart_at(sp as u64);
        ForeignStack
    }
}

impl StackWords for ForeignStack {
    fn read(self, addr: u64) -> Result<u64, ()> {
        let a = addr as usize;
        if !a.is_multiple_of(8) {
            return Err(());
        }
        let page = a & !(sys::PAGE_SIZE - 1);
        let readable = THREAD.try_with(|t| {
            let (lo, mut hi) = t.foreign_pages.get();
            if a < lo || page >= hi + FOREIGN_REACH {
                return false;
            }
            while hi <= page {
                if !sys::page_is_mapped(hi) {
                    return false;
                }
                hi += sys::PAGE_SIZE;
                t.foreign_pages.set((lo, hi));
            }
            true
        });
        if readable == Ok(true) {
            // SAFETY: `[a, a+8)` is aligned, so it lies in one page, which the kernel said this
            // process can read during this walk (the program unmapping the stack it runs on
            // meanwhile would be its own crash).
            Ok(unsafe { ptr::read_volatile(a as *const u64) })
        } else {
            Err(())
        }
    }

    /// Reads leave the run of pages so far for a run from `sp` up.
    fn restart_at(self, sp: u64) {
        let page = sp as usize & !(sys::PAGE_SIZE - 1);
        let _ = THREAD.try_with(|t| t.foreign_pages.set((page, page)));
    }

    /// None: the last walk never meets a foreign walk's frames.
    fn own(self) -> Stack {
        Stack { lo: 0, last: 0 }
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

/// A frame's registers, as far as a step reads them.
#[derive(Clone, Copy)]
struct Regs {
    pc: usize,
    sp: u64,
    bp: u64,
}

/// What a [`slow_step`] found.
enum SlowStep {
    /// The frame's pc lies in no known module: the frame is not recorded and the walk ends.
    NoModule,
    /// The caller (`None`: the walk ends).
    Caller(Option<Regs>),
    /// The code a signal interrupted, which may have run on another stack, below this frame.
    Interrupted(Option<Regs>),
}

/// The slow step from `regs` (its pc not in the rule table yet, or a rule left to framehop):
/// checks that the pc lies in a known module (rescanning for one loaded since the snapshot,
/// which then replaces `snap`), compiles its rule and steps. The walk ends where it gives no
/// caller (also when no unwinder cache can be had).
#[cold]
#[inline(never)]
fn slow_step(
    snap: &mut &'static Snapshot,
    steps: Steps,
    regs: Regs,
    caches: &mut impl CacheSource,
    stack: impl StackWords,
) -> SlowStep {
    let code = match snap.module_of(regs.pc) {
        Some(code) => code,
        // Not in any known module: maybe a library loaded since the scan.
        None => match modules::refresh().and_then(|s| Some((s, s.module_of(regs.pc)?))) {
            Some((s, code)) => {
                *snap = s;
                code
            }
            None => return SlowStep::NoModule, // JIT code or garbage: stop rather than guess
        },
    };
    if returns_from_signal(regs.pc, code) {
        return SlowStep::Interrupted(interrupted_by_signal(regs, stack));
    }
    let Some(cache) = caches.cache() else {
        return SlowStep::Caller(None);
    };
    let mut read = |a: u64| stack.read(a);
    if steps == Steps::Rules {
        let s = *snap;
        let rule = stack.rule(RULES.get(regs.pc, || s.sections_of(regs.pc), &mut cache.cfi));
        if rule != Rule::FRAMEHOP_STEP {
            return SlowStep::Caller(caller_by_rule(rule, regs, &mut read));
        }
    }
    let mut fh = UnwindRegsX86_64::new(regs.pc as u64, regs.sp, regs.bp);
    let caller = FrameAddress::from_return_address(regs.pc as u64)
        .and_then(|addr| {
            snap.unwinder
                .unwind_frame(addr, &mut fh, &mut cache.framehop, &mut read)
                .ok()
                .flatten()
        })
        .map(|ra| Regs {
            pc: ra as usize,
            sp: fh.sp(),
            bp: fh.bp(),
        });
    SlowStep::Caller(caller)
}

/// `rt_sigreturn`'s code, `mov $15, %rax; syscall`: where a signal handler returns to (glibc's
/// `__restore_rt`). gdb and libunwind tell signal frames by the same bytes.
const SIGRETURN_CODE: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// Whether `pc`, in the module code `code`, is a signal handler's return into `rt_sigreturn`.
fn returns_from_signal(pc: usize, code: core::ops::Range<usize>) -> bool {
    pc.checked_add(SIGRETURN_CODE.len())
        .is_some_and(|end| end <= code.end)
        // SAFETY: `[pc, end)` lies in the code of a loaded module, which is mapped readable.
        && unsafe { is_sigreturn_code(pc) }
}

/// Whether a captured frame's address is a signal handler's return into `rt_sigreturn`, asked
/// at report time (the module it lay in may be gone: its pages are asked for first).
pub(crate) fn is_signal_return(address: usize) -> bool {
    let last = address.saturating_add(SIGRETURN_CODE.len() - 1);
    sys::page_is_mapped(address) && sys::page_is_mapped(last)
        // SAFETY: both pages of `[address, last]` can be read.
        && unsafe { is_sigreturn_code(address) }
}

/// # Safety
/// The bytes `[pc, pc + 9)` can be read.
unsafe fn is_sigreturn_code(pc: usize) -> bool {
    // SAFETY: as the caller guarantees.
    unsafe { core::slice::from_raw_parts(pc as *const u8, SIGRETURN_CODE.len()) == SIGRETURN_CODE }
}

/// The frame a signal interrupted, from the handler's return into `rt_sigreturn` at `regs`:
/// the kernel's `ucontext_t` lies at its sp, with the interrupted registers in `uc_mcontext`.
/// Its pc is where the signal struck, not a return address, so one is added: the walk and
/// the symbolizer look up a frame's address minus one.
fn interrupted_by_signal(regs: Regs, stack: impl StackWords) -> Option<Regs> {
    /// `offsetof(ucontext_t, uc_mcontext.gregs[REG_RBP / REG_RSP / REG_RIP])` (x86_64 Linux).
    const RBP: u64 = 120;
    const RSP: u64 = 160;
    const RIP: u64 = 168;
    let pc = stack.read(regs.sp + RIP).ok()?;
    let interrupted = Regs {
        pc: (pc as usize).checked_add(1)?,
        sp: stack.read(regs.sp + RSP).ok()?,
        bp: stack.read(regs.sp + RBP).ok()?,
    };
    stack.restart_at(interrupted.sp);
    Some(interrupted)
}

/// The caller of the frame `regs` by a compiled rule, reading the stack through `read`.
#[inline(always)]
fn caller_by_rule(
    rule: Rule,
    regs: Regs,
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Option<Regs> {
    let (ra, sp, bp) = rule.step(regs.sp, regs.bp, read)?;
    Some(Regs {
        pc: ra as usize,
        sp,
        bp,
    })
}

/// The DWARF walk: frames from `start` while their pcs lie in known modules and each step
/// reaches a caller further up the stack.
fn dwarf_walk(
    start: StartFrame,
    stack: impl StackWords,
    mut snap: &'static Snapshot,
    caches: &mut impl CacheSource,
    steps: Steps,
    mut last: Option<&mut LastWalk>,
    out: &mut [MaybeUninit<usize>],
) -> usize {
    let mut regs = Regs {
        pc: start.pc,
        sp: start.sp as u64,
        bp: start.fp as u64,
    };
    if let Some(l) = last.as_deref_mut() {
        l.begin(snap_id(snap));
    }
    let mut n = 0;
    loop {
        if let Some(l) = last.as_deref_mut() {
            if let Some(total) = l.take_over(n, (regs.pc, regs.sp, regs.bp), stack.own(), out) {
                #[cfg(test)]
                REPEATED.with(|r| r.set(r.get() + 1));
                #[cfg(test)]
                TAKEN_OVER_INSIDE.with(|r| r.set(r.get() + usize::from(n > 0)));
                return total;
            }
        }
        // A pc with a compiled rule was found in a module of this snapshot when the rule was
        // made: the common step checks nothing else.
        let rule = match steps {
            Steps::Rules => match last.as_deref_mut() {
                Some(l) => l.cached_rule(regs.pc),
                None => RULES.cached(regs.pc),
            }
            .map(|rule| stack.rule(rule)),
            #[cfg(test)]
            Steps::FramehopOnly => None,
        };
        let caller = match rule {
            Some(rule) if rule != Rule::FRAMEHOP_STEP => {
                out[n].write(regs.pc);
                n += 1;
                if n == out.len() {
                    break;
                }
                match last.as_deref_mut() {
                    Some(l) => {
                        l.note_step(n - 1, rule);
                        caller_by_rule(rule, regs, &mut |a| {
                            let got = stack.read(a);
                            l.note_read(n - 1, a, got);
                            got
                        })
                    }
                    None => caller_by_rule(rule, regs, &mut |a| stack.read(a)),
                }
            }
            _ => {
                let step = slow_step(&mut snap, steps, regs, caches, stack);
                if let Some(l) = last.as_deref_mut() {
                    l.note_slow_step(n, snap_id(snap));
                }
                if let SlowStep::NoModule = step {
                    break;
                }
                out[n].write(regs.pc);
                n += 1;
                if n == out.len() {
                    break;
                }
                match step {
                    // The interrupted code's sp need not lie above the handler's (an alternate
                    // stack mapped above the thread's): the walk goes on wherever it is, and
                    // still ends, at `out.len()` frames at most.
                    SlowStep::Interrupted(Some(interrupted)) => {
                        regs = interrupted;
                        continue;
                    }
                    SlowStep::Interrupted(caller) | SlowStep::Caller(caller) => caller,
                    SlowStep::NoModule => None, // ended above
                }
            }
        };
        match caller {
            // The stack grows down: a caller's sp must be above its callee's, or we would loop.
            Some(c) if c.pc != 0 && c.sp > regs.sp => regs = c,
            _ => break,
        }
    }
    if let Some(l) = last {
        l.end(snap_id(snap), out, n);
    }
    n
}

/// Snapshots are never freed, so their addresses name them.
fn snap_id(snap: &'static Snapshot) -> usize {
    ptr::from_ref(snap) as usize
}

/// The opt-in walk along saved rbp values; loses frames in code without frame pointers.
fn fp_walk(start: StartFrame, stack: impl StackWords, out: &mut [MaybeUninit<usize>]) -> usize {
    out[0].write(start.pc);
    let mut n = 1;
    let mut fp = start.fp;
    let mut floor = start.sp;
    while n < out.len() {
        // Each saved frame must be inside the stack and above the previous one.
        if fp < floor {
            break;
        }
        let (Ok(next), Ok(ra)) = (stack.read(fp as u64), stack.read(fp as u64 + 8)) else {
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
