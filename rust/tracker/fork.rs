//! `fork` in a threaded program: every lock the tracker takes is held by the forking thread
//! across the fork, so the child never finds one held by a thread it does not have.
//!
//! Taken in the order the other paths nest them: the engine registry, then the error log and
//! the error symbolizer, the unmapped-block record, the small-block heap, and last every shard (a shard lock is never
//! held while waiting for another lock). Locks inside individual engine allocators are not
//! covered: a child should not use an allocator another thread was using at the fork.

use super::guard::Inside;
use super::{errors, heap, live_list, raw};
use std::any::Any;
use std::cell::RefCell;

thread_local! {
    /// The guards taken by `prepare`, dropped by the parent and the child after the fork.
    /// Only ever touched by a forking thread.
    static HELD: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

extern "C" fn prepare() {
    let _inside = Inside::enter(); // the guard list is the tracker's own memory
    let (registry, ranges) = crate::engine::lock_registry_for_fork();
    let guards: Vec<Box<dyn Any>> = vec![
        Box::new(registry),
        Box::new(ranges),
        Box::new(errors::lock_for_fork()),
        Box::new(crate::report::text::lock_symbolizer_for_fork()),
        Box::new(raw::lock_for_fork()),
        Box::new(heap::lock_for_fork()),
    ];
    live_list::lock_all_shards_for_fork();
    HELD.with(|held| *held.borrow_mut() = guards);
}

extern "C" fn release() {
    let _inside = Inside::enter();
    live_list::unlock_all_shards_after_fork();
    HELD.with(|held| held.borrow_mut().clear());
}

/// Registered once, at the tracker's first use.
pub fn register_handlers() {
    // SAFETY: the handlers are plain functions that live for the whole process.
    unsafe { libc::pthread_atfork(Some(prepare), Some(release), Some(release)) };
}
