//! `fork` in a threaded program: every lock the tracker takes is held by the forking thread
//! across the fork, so the child never finds one held by a thread it does not have; and the
//! child's reports leave out the blocks and errors it inherited (the parent reports those).
//!
//! Taken in the order the other paths nest them: the engine registry, each engine allocator's
//! locks and the registry's address ranges, then the error log and the error symbolizer, then
//! every shard (the world stopped, queued frees settled), and last the quarantine, the
//! unmapped-block record, the small-block heap (settling frees blocks into them) and the record
//! of damaged headers (found with shards held); let go of in the reverse order. Not covered: a
//! stack allocator's lock (a stack allocator belongs to one thread).

use super::guard::Inside;
use super::live_list::{self, StoppedWorld};
use super::{errors, heap, integrity, quarantine, raw};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::any::Any;
use std::cell::RefCell;

/// In a forked child: the thread that forked, its last allocation before the fork, and the
/// first thread number handed out after it (every block of an earlier number, or of the
/// forking thread up to that allocation, was the parent's).
static FORKED: AtomicBool = AtomicBool::new(false);
static FORKING_THREAD: AtomicU32 = AtomicU32::new(0);
static FORKING_THREAD_SEQ: AtomicU32 = AtomicU32::new(0);
static FIRST_THREAD_AFTER: AtomicU32 = AtomicU32::new(0);

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

/// The stopped world and the other guards `prepare` took.
type Held = (Option<StoppedWorld>, Vec<Box<dyn Any>>);

thread_local! {
    /// The guards taken by `prepare`, dropped by the parent and the child after the fork.
    /// Only ever touched by a forking thread.
    static HELD: RefCell<Held> = const { RefCell::new((None, Vec::new())) };
}

extern "C" fn prepare() {
    let _inside = Inside::enter(); // the guard list is the tracker's own memory
    let mut guards: Vec<Box<dyn Any>> = Vec::new();
    crate::engine::hold_registry_for_fork(&mut guards);
    guards.push(Box::new(errors::lock_for_fork()));
    guards.push(Box::new(crate::report::text::lock_symbolizer_for_fork()));
    let world = StoppedWorld::stop(live_list::FORK_HOLDER);
    guards.push(Box::new(quarantine::lock_for_fork()));
    guards.push(Box::new(raw::lock_for_fork()));
    guards.push(Box::new(heap::lock_for_fork()));
    guards.push(Box::new(integrity::lock_for_fork()));
    HELD.with(|held| *held.borrow_mut() = (Some(world), guards));
}

fn release() {
    let _inside = Inside::enter();
    let (world, mut guards) = HELD.with(|held| core::mem::take(&mut *held.borrow_mut()));
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
    crate::report::note_forked_child();
    let me = super::guard::thread_number();
    HELD.with(|held| {
        if let Some(world) = &held.borrow().0 {
            world.forget_other_owners(me);
        }
    });
    FORKING_THREAD.store(me, Ordering::Relaxed);
    FORKING_THREAD_SEQ.store(super::guard::allocations_so_far(), Ordering::Relaxed);
    FIRST_THREAD_AFTER.store(super::guard::next_thread_number(), Ordering::Relaxed);
    FORKED.store(true, Ordering::Relaxed);
    release();
    errors::forget_inherited();
}

/// Registered once, at the tracker's first use.
pub fn register_handlers() {
    // SAFETY: the handlers are plain functions that live for the whole process.
    unsafe {
        libc::pthread_atfork(
            Some(prepare),
            Some(release_in_parent),
            Some(release_in_child),
        )
    };
}
