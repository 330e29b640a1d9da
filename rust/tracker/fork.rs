//! `fork` in a threaded program: every lock the tracker takes is held by the forking thread
//! across the fork, so the child never finds one held by a thread it does not have; and the
//! child's reports leave out the blocks and errors it inherited (the parent reports those).
//!
//! First `fork` waits for the `dlopen`/`dlclose` calls in progress on other threads (glibc
//! leaves the loader's lock as it was at the fork). Then the locks, taken in the order the
//! other paths nest them: the engine registry, each engine allocator's locks and the
//! registry's address ranges, then the table of allocator names (whose holder may allocate),
//! the error log and the error symbolizer, then every shard (the world stopped, queued frees
//! settled), then the module rescan and the module history, then the quarantine, the
//! unmapped-block record, the small-block heap (settling frees blocks into them) and the
//! record of damaged headers (found with shards held), the growth of the unwinder's
//! caches (a thread holding any of the others may be capturing a stack), and last the record of
//! the program's mappings (its holder takes no other lock); let go of in the reverse order. Not covered: a stack allocator's lock (a stack allocator belongs to one
//! thread).
//!
//! A `fork` from a signal handler that interrupted the tracker on its own thread (an
//! allocation, a free's slow path, a frame mark, the interning of a tag) takes none of them:
//! the interrupted code may hold any, and would let go only after the handler returns
//! (the fork waited forever: a crash handler that forks a reporter, a timer that forks). The
//! fork goes ahead unprepared: the parent's tracker goes on as it was; the child inherits it
//! as it was, which is safe to `exec` or `_exit` from, and to allocate in unless another thread
//! was inside the tracker at that instant too.

use super::guard::Inside;
use super::live_list::{self, StoppedWorld};
use super::{errors, heap, integrity, kept_mappings, quarantine, raw};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::any::Any;
use std::cell::Cell;

/// In a forked child: the thread that forked, its last allocation before the fork, and the
/// first thread number handed out after it (every block of an earlier number, or of the
/// forking thread up to that allocation, was the parent's).
static FORKED: AtomicBool = AtomicBool::new(false);
static FORKING_THREAD: AtomicU32 = AtomicU32::new(0);
static FORKING_THREAD_SEQ: AtomicU32 = AtomicU32::new(0);
static FIRST_THREAD_AFTER: AtomicU32 = AtomicU32::new(0);

/// Whether this process is a child forked from a tracked parent (after a prepared fork).
pub fn is_forked_child() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// When, in a fork's `prepare`, a participant's locks are taken (see the module docs for why
/// in this order): before the error log (the engine registry and its names, whose holders may
/// allocate and so report errors), before the shards are stopped (the error symbolizer, whose
/// holder prints errors), or last (the record of the program's mappings, whose holder takes no
/// other lock). Within a phase, in the order the participants joined.
#[derive(Clone, Copy)]
pub enum ForkPhase {
    BeforeErrors,
    BeforeShards,
    Last,
}

/// Takes a participant's locks for a fork, pushing a guard per lock (dropped after the fork,
/// in the reverse order).
pub type HoldForFork = fn(&mut Vec<Box<dyn Any>>);

const PARTICIPANTS_PER_PHASE: usize = 4;
static PARTICIPANTS: [[AtomicPtr<()>; PARTICIPANTS_PER_PHASE]; 3] =
    [const { [const { AtomicPtr::new(core::ptr::null_mut()) }; PARTICIPANTS_PER_PHASE] }; 3];

/// A layer above the tracker whose locks a fork must hold (the tracker cannot name them: it
/// lies below). Joined once, at start-up (`process::start_up`).
pub fn take_part(phase: ForkPhase, hold: HoldForFork) {
    let free = PARTICIPANTS[phase as usize].iter().find(|slot| {
        slot.compare_exchange(
            core::ptr::null_mut(),
            hold as *mut (),
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
    });
    assert!(free.is_some(), "more fork participants than slots");
}

fn hold_participants(phase: ForkPhase, guards: &mut Vec<Box<dyn Any>>) {
    for slot in &PARTICIPANTS[phase as usize] {
        let hold = slot.load(Ordering::Acquire);
        if !hold.is_null() {
            // SAFETY: only `take_part` stores here, and it stores a `HoldForFork`.
            let hold = unsafe { core::mem::transmute::<*mut (), HoldForFork>(hold) };
            hold(guards);
        }
    }
}

/// Whether a block of `thread`/`seq` was allocated before this process was forked from its
/// parent, which reports it: a child reports only its own blocks, so that a child exiting
/// normally neither repeats the parent's report nor pays for symbolizing it (hundreds of
/// milliseconds of debug information loaded per child). Engine allocator blocks (thread 0)
/// are always reported.
pub fn inherited(thread: u32, seq: u32) -> bool {
    FORKED.load(Ordering::Relaxed)
        && thread != 0
        && thread < FIRST_THREAD_AFTER.load(Ordering::Relaxed)
        && (thread != FORKING_THREAD.load(Ordering::Relaxed)
            || seq <= FORKING_THREAD_SEQ.load(Ordering::Relaxed))
}

/// Threads inside a `dlopen` or `dlclose` (through `cpp/modules.cpp`), and whether a fork waits
/// for them to come out. glibc's `fork` leaves the loader's lock as it was, so a child forked
/// while another thread was inside would wait for it forever in its first `dl_iterate_phdr`
/// (its report reads the modules and their data segments so).
static IN_LOADER: AtomicU32 = AtomicU32::new(0);
/// Forks between their `prepare` and their `release` (threads may fork at once), and reports
/// between the roots they gather and their scan ([`hold_loader_calls`]): new loader calls wait.
static LOADER_HOLDS: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// This thread's loader calls in progress (a library's constructor may `dlopen` again, or
    /// fork): a fork does not wait for its own thread, nor a nested call for a fork.
    static MY_LOADER_CALLS: Cell<u32> = const { Cell::new(0) };
}

/// A `dlopen` or `dlclose` is about to enter the loader: waits while a fork is being prepared.
pub fn loader_call_begins() {
    let mine = MY_LOADER_CALLS.with(|calls| calls.replace(calls.get() + 1));
    loop {
        while mine == 0 && LOADER_HOLDS.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
        IN_LOADER.fetch_add(1, Ordering::SeqCst);
        if mine > 0 || LOADER_HOLDS.load(Ordering::SeqCst) == 0 {
            return;
        }
        IN_LOADER.fetch_sub(1, Ordering::SeqCst); // the fork came first: let it go
    }
}

/// Keeps new loader calls of other threads out until dropped, once those in progress came out
/// (within the tracker's patience): a report reads the modules' writable segments as roots
/// before it suspends the threads, and scans them after; a `dlclose` in between unmapped them
/// (a plugin reloaded while reports were written: a crash, or the tracker's own memory mapped
/// there since read as the program's, its leaks called reachable).
pub fn hold_loader_calls() -> LoaderCallsHeld {
    wait_for_loader_calls();
    LoaderCallsHeld
}

/// See [`hold_loader_calls`].
pub struct LoaderCallsHeld;

impl Drop for LoaderCallsHeld {
    fn drop(&mut self) {
        LOADER_HOLDS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The loader call [`loader_call_begins`] announced has returned.
pub fn loader_call_ends() {
    MY_LOADER_CALLS.with(|calls| calls.set(calls.get().saturating_sub(1)));
    IN_LOADER.fetch_sub(1, Ordering::SeqCst);
}

/// Keeps new loader calls out and waits (within the tracker's patience) for those in progress
/// on other threads.
fn wait_for_loader_calls() {
    LOADER_HOLDS.fetch_add(1, Ordering::SeqCst);
    let mine = MY_LOADER_CALLS.with(Cell::get);
    let mut waited = live_list::Patience::new();
    while IN_LOADER.load(Ordering::SeqCst) > mine && waited.more() {}
}

/// The stopped world and the other guards `prepare` took.
type Held = (StoppedWorld, Vec<Box<dyn Any>>);

thread_local! {
    /// The guards taken by `prepare` (boxed), dropped by the parent and the child after the
    /// fork. Only ever touched by a forking thread. A bare pointer, so that the thread-local has
    /// no destructor: registering one on first use takes the dynamic loader's lock, which a
    /// thread inside `dlopen` may hold while it waits, in `malloc`, for the world `prepare`
    /// has just stopped.
    static HELD: Cell<*mut Held> = const { Cell::new(core::ptr::null_mut()) };
}

extern "C" fn prepare() {
    // First: a thread inside the loader may need the world (its `malloc`) to come out.
    wait_for_loader_calls();
    if interrupted_the_tracker() {
        return; // unprepared (see the module docs); `release` finds nothing held
    }
    let _inside = Inside::enter(); // the guard list is the tracker's own memory
    let mut guards: Vec<Box<dyn Any>> = Vec::new();
    hold_participants(ForkPhase::BeforeErrors, &mut guards);
    guards.push(Box::new(errors::lock_for_fork()));
    hold_participants(ForkPhase::BeforeShards, &mut guards);
    let world = StoppedWorld::stop(live_list::FORK_HOLDER);
    guards.push(Box::new(crate::stack::lock_modules_for_fork()));
    guards.push(Box::new(crate::stack::history::lock_for_fork()));
    guards.push(Box::new(quarantine::lock_for_fork()));
    guards.push(Box::new(raw::lock_for_fork()));
    guards.push(Box::new(kept_mappings::lock_for_fork()));
    guards.push(Box::new(heap::lock_for_fork()));
    guards.push(Box::new(integrity::lock_for_fork()));
    guards.push(Box::new(crate::stack::lock_caches_for_fork()));
    // Leaves: their holders take no other lock meanwhile, but for a frame mark's holder of
    // the frames' lock, which takes the timeline's (a `Last` participant) in it.
    guards.push(Box::new(super::checkpoints::lock_for_fork()));
    guards.push(Box::new(super::frames::lock_for_fork()));
    guards.push(Box::new(super::tags::lock_for_fork()));
    hold_participants(ForkPhase::Last, &mut guards);
    HELD.with(|held| held.set(Box::into_raw(Box::new((world, guards)))));
}

/// Whether the calling thread is a signal handler that interrupted the tracker: inside it, or
/// in the middle of a change of its own shard.
fn interrupted_the_tracker() -> bool {
    let me = super::guard::thread_number();
    super::guard::inside()
        || super::guard::own_shard().is_some_and(|shard| live_list::is_changing(me, shard))
}

fn release() {
    LOADER_HOLDS.fetch_sub(1, Ordering::SeqCst);
    let _inside = Inside::enter();
    let held = HELD.with(|held| held.replace(core::ptr::null_mut()));
    if held.is_null() {
        return;
    }
    // SAFETY: made by `Box::into_raw` in `prepare` on this thread, and taken once.
    let (world, mut guards) = *unsafe { Box::from_raw(held) };
    // In the reverse order of taking: an engine allocator's lock before the registry's, which
    // keeps that allocator alive.
    while let Some(guard) = guards.pop() {
        drop(guard);
    }
    drop(world);
}

extern "C" fn release_in_parent() {
    release();
}

/// The other threads are gone in the child, and so is their ownership of shards.
extern "C" fn release_in_child() {
    let held = HELD.with(Cell::get);
    // Unprepared (see the module docs): what the others' going would change is behind locks
    // a thread now gone may hold.
    let prepared = !held.is_null();
    if prepared {
        super::threads::forget_others();
        crate::stack::history::note_forked_child();
        crate::stack::note_forked_child();
    }
    let me = super::guard::thread_number();
    // SAFETY: `prepare` on this thread left it there, and only `release` below takes it.
    if let Some((world, _)) = unsafe { held.as_ref() } {
        world.forget_other_owners(me);
    }
    FORKING_THREAD.store(me, Ordering::Relaxed);
    FORKING_THREAD_SEQ.store(super::guard::allocations_so_far(), Ordering::Relaxed);
    FIRST_THREAD_AFTER.store(super::guard::next_thread_number(), Ordering::Relaxed);
    FORKED.store(true, Ordering::Relaxed);
    // The other threads' loader calls and forks are gone with them.
    IN_LOADER.store(MY_LOADER_CALLS.with(Cell::get), Ordering::SeqCst);
    LOADER_HOLDS.store(1, Ordering::SeqCst); // this one, which `release` ends
    release();
    if prepared {
        errors::forget_inherited();
    }
    super::timeline::in_forked_child(prepared);
}

extern "C" {
    /// glibc's registration behind `pthread_atfork`, which passes the caller's module
    /// (`__dso_handle`); the module's finalization at exit (`__cxa_finalize`, from `_dl_fini`)
    /// then takes its handlers off the list.
    fn __register_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
        dso_handle: *mut libc::c_void,
    ) -> libc::c_int;
}

/// Registered once, at the tracker's first use, for no module: registered through
/// `pthread_atfork`, the handlers left the list when the program's module was finalized at
/// exit, and a `fork` on another thread between its `prepare` and its `release` then ran no
/// `release`: the world stayed stopped, the exit's report waited for it, and the child spun on
/// the shard locks (measured: a thread forking while `main` returns hung 20 runs in 200).
pub fn register_handlers() {
    // SAFETY: the handlers are plain functions that live for the whole process (the tracker
    // is never unloaded); no module owns them, so none takes them off the list.
    unsafe {
        __register_atfork(
            Some(prepare),
            Some(release_in_parent),
            Some(release_in_child),
            core::ptr::null_mut(),
        )
    };
}
