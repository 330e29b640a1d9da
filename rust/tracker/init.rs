//! First use: the options, and the stack unwinder's setup done once up front, so the first
//! `new` of the program does not pay for it in the middle of someone's frame.

use crate::options;
use core::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

/// What every allocation asks of the set-up, in one word (one load on the hot path).
#[derive(Clone, Copy)]
pub struct Hot(u32);

const HOT_READY: u32 = 1 << 31;
const HOT_BUDGET: u32 = 1 << 30;
const HOT_FREE_STACKS: u32 = 1 << 29;
const HOT_BREAK_ON: u32 = 1 << 28;
const HOT_QUARANTINE: u32 = 1 << 27;
const HOT_MALLOC: u32 = 1 << 26;
const HOT_PROFILE: u32 = 1 << 25;
const HOT_TAGS: u32 = 1 << 24;

impl Hot {
    /// Frames to capture per allocation; 0: no call stacks.
    #[inline]
    pub fn stack_depth(self) -> usize {
        (self.0 & 0xffff) as usize
    }

    /// Whether an allocation may take the quick path: no stack to capture, no budget, no
    /// `break_on`.
    #[inline]
    pub fn allows_quick_allocation(self) -> bool {
        self.stack_depth() == 0 && !self.rare_allocation_options()
    }

    /// Whether blocks come from the budget (`budget=`).
    #[inline]
    pub fn budget(self) -> bool {
        self.0 & HOT_BUDGET != 0
    }

    /// Whether freed blocks are held back (`quarantine=`).
    #[inline]
    pub fn quarantine(self) -> bool {
        self.0 & HOT_QUARANTINE != 0
    }

    /// Whether an allocation is to stop in the debugger (`break_on=`).
    #[inline]
    pub fn break_on(self) -> bool {
        self.0 & HOT_BREAK_ON != 0
    }

    /// Whether every allocation and free is counted per stack (`profile=1`).
    #[inline]
    pub fn profile(self) -> bool {
        self.0 & HOT_PROFILE != 0
    }

    /// `budget`, `break_on` or `profile`: an allocation leaves the common path (one test for
    /// all).
    #[inline(always)]
    pub fn rare_allocation_options(self) -> bool {
        self.0 & (HOT_BUDGET | HOT_BREAK_ON | HOT_PROFILE) != 0
    }

    /// Whether each `delete` records its call stack in the freed block (`free_stacks=1`).
    #[inline]
    pub fn free_stacks(self) -> bool {
        self.0 & HOT_FREE_STACKS != 0
    }

    /// Whether a block may carry a tag: set by the first tag interned (`tags`), before or after
    /// the set-up. A bit of this word, so that a free tests it in the word it loaded anyway.
    #[inline]
    pub fn tags(self) -> bool {
        self.0 & HOT_TAGS != 0
    }

    /// Whether the C family is tracked (`malloc=1`).
    #[inline]
    pub fn malloc(self) -> bool {
        self.0 & HOT_MALLOC != 0
    }
}

/// Without [`HOT_READY`] until the set-up is done ([`HOT_TAGS`] may come first).
static HOT: AtomicU32 = AtomicU32::new(0);
static SET_UP: Once = Once::new();

/// The hot-path options, with the tracker set up. Call with the reentrancy guard held: the
/// unwinder's setup allocates through Rust's global allocator, which may be the tracker itself.
#[inline]
pub fn hot() -> Hot {
    match HOT.load(Ordering::Acquire) {
        hot if hot & HOT_READY == 0 => set_up(),
        hot => Hot(hot),
    }
}

/// The hot-path options where the tracker is known to be set up (a free of a block it made).
#[inline]
pub fn set_up_hot() -> Hot {
    Hot(HOT.load(Ordering::Relaxed))
}

/// The hot-path options if the set-up is done, without doing it (`None` before the first
/// allocation set the tracker up).
#[inline]
pub fn peek() -> Option<Hot> {
    match HOT.load(Ordering::Acquire) {
        hot if hot & HOT_READY == 0 => None,
        hot => Some(Hot(hot)),
    }
}

/// Notes that a tag was interned ([`Hot::tags`]); before the tag is published, so that whoever
/// holds a block of it (allocated after) sees the bit.
pub fn note_tags_in_use() {
    HOT.fetch_or(HOT_TAGS, Ordering::Relaxed);
}

/// Once per process; a second thread arriving meanwhile waits for the first.
#[cold]
#[inline(never)]
fn set_up() -> Hot {
    SET_UP.call_once(set_up_once);
    Hot(HOT.load(Ordering::Acquire))
}

fn set_up_once() {
    // The first allocation may be on a thread the program cancels; the set-up reads files.
    let _held = crate::sys::CancellationHeld::hold();
    let options = options::get();
    super::fork::register_handlers();
    crate::stack::set_unwind_mode(options.unwinder);
    if options.budget > 0 {
        super::budget::set_up(options.budget);
    }
    if let Some(path) = &options.budgets {
        super::tag_budgets::load(path.as_str());
    }
    if options.stack_depth > 0 {
        crate::stack::warm_up();
    }
    let budget = if super::budget::active().is_some() {
        HOT_BUDGET
    } else {
        0
    };
    let break_on = match options.break_on {
        Some((thread, seq)) => {
            super::integrity::break_on(thread, seq);
            HOT_BREAK_ON
        }
        None => 0,
    };
    let quarantine = if options.quarantine > 0 {
        super::quarantine::set_limit(options.quarantine);
        HOT_QUARANTINE
    } else {
        0
    };
    // A block in quarantine keeps its free stack beside it, so quarantine takes them too.
    let free_stacks = if (options.free_stacks || quarantine != 0) && options.stack_depth > 0 {
        HOT_FREE_STACKS
    } else {
        0
    };
    let malloc = if options.malloc { HOT_MALLOC } else { 0 };
    let profile = if options.profile && super::profile::set_up() {
        HOT_PROFILE
    } else {
        0
    };
    // Or'd: a tag interned before the set-up set its bit already.
    HOT.fetch_or(
        HOT_READY
            | budget
            | free_stacks
            | break_on
            | quarantine
            | malloc
            | profile
            | options.stack_depth as u32,
        Ordering::Release,
    );
}
