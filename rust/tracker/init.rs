//! First use: the options, and the stack unwinder's setup done once up front, so the first
//! `new` of the program does not pay for it in the middle of someone's frame.

use crate::options::{self, Options};
use core::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

static READY: AtomicBool = AtomicBool::new(false);
static SET_UP: Once = Once::new();

/// The options, with the tracker set up. Call with the reentrancy guard held: the unwinder's
/// setup allocates through Rust's global allocator, which may be the tracker itself.
#[inline]
pub fn options() -> &'static Options {
    if !READY.load(Ordering::Acquire) {
        set_up();
    }
    options::get()
}

/// Once per process; a second thread arriving meanwhile waits for the first.
#[cold]
#[inline(never)]
fn set_up() {
    SET_UP.call_once(set_up_once);
}

fn set_up_once() {
    let options = options::get();
    super::fork::register_handlers();
    crate::stack::set_unwind_mode(options.unwinder);
    if options.budget > 0 {
        super::budget::set_up(options.budget, options.pool_classes.as_slice());
    }
    if options.stack_depth > 0 {
        crate::stack::warm_up();
    }
    READY.store(true, Ordering::Release);
}
