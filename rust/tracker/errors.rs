//! Memory errors: what went wrong at a free, kept for the report and printed at once.

use super::BlockKind;
use crate::stack::StackId;
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    MismatchedDelete,
    DoubleFree,
    InvalidFree,
    /// Budget mode: an allocation the budget could not serve.
    BudgetExceeded,
    /// The guard behind a block's bytes was overwritten.
    Overrun,
    /// The check word in front of a block's bytes was overwritten.
    Underrun,
    /// A freed block held in quarantine was written to.
    UseAfterFree,
    /// The tracker's own records (a header's links, a free list) were overwritten.
    HeapCorruption,
    /// A tag's live bytes went over its budget (`budgets=FILE`); the allocation was served.
    TagOverBudget,
    /// An aligned allocation asked for an alignment its function refuses (not a power of two);
    /// it failed as it does without the tracker.
    InvalidAlignment,
}

impl ErrorKind {
    /// Bytes overwritten that should not have been (reported with the offset and bytes found).
    pub fn is_damage(self) -> bool {
        matches!(
            self,
            ErrorKind::Overrun
                | ErrorKind::Underrun
                | ErrorKind::UseAfterFree
                | ErrorKind::HeapCorruption
        )
    }

    /// Every kind (suppression files name them).
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::MismatchedDelete,
        ErrorKind::DoubleFree,
        ErrorKind::InvalidFree,
        ErrorKind::BudgetExceeded,
        ErrorKind::Overrun,
        ErrorKind::Underrun,
        ErrorKind::UseAfterFree,
        ErrorKind::HeapCorruption,
        ErrorKind::TagOverBudget,
        ErrorKind::InvalidAlignment,
    ];

    /// The name used in the reports (SPEC's `errors[].kind`).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::MismatchedDelete => "mismatched_delete",
            ErrorKind::DoubleFree => "double_free",
            ErrorKind::InvalidFree => "invalid_free",
            ErrorKind::BudgetExceeded => "budget_exceeded",
            ErrorKind::Overrun => "overrun",
            ErrorKind::Underrun => "underrun",
            ErrorKind::UseAfterFree => "use_after_free",
            ErrorKind::HeapCorruption => "heap_corruption",
            ErrorKind::TagOverBudget => "tag_over_budget",
            ErrorKind::InvalidAlignment => "invalid_alignment",
        }
    }
}

/// One memory error (a bad free, damaged bytes), with what the block's header still told about
/// its allocation.
#[derive(Clone, Debug)]
pub struct MemoryError {
    pub kind: ErrorKind,
    pub address: usize,
    pub size: usize,
    pub file: Option<String>,
    pub line: u32,
    pub thread: u32,
    /// How the block was allocated, where known.
    pub allocated_with: Option<BlockKind>,
    pub freed_with: BlockKind,
    /// The engine allocator the pointer was given to, for errors of `rust/engine` allocators
    /// (then `allocated_with`/`freed_with` do not apply).
    pub allocator: Option<&'static str>,
    /// What exactly was wrong, where the kind alone does not say (e.g. "freed out of LIFO order").
    pub detail: Option<&'static str>,
    pub alloc_stack: StackId,
    pub free_stack: StackId,
    /// Where the bytes that should not have changed did, for `overrun`, `underrun`,
    /// `use_after_free` and `heap_corruption`.
    pub damage: Option<Damage>,
    /// For an `invalid_free` of a pointer inside a live block: how far inside (the block's size,
    /// site and stack are the error's).
    pub interior_offset: Option<usize>,
    /// For a `double_free`: the stack of the `delete` that freed the block first, where kept.
    pub previous_free_stack: StackId,
    /// For a `tag_over_budget`: the tag and its figures when the allocation crossed its budget.
    pub over_budget: Option<OverBudget>,
    /// For an `invalid_alignment`: the alignment asked for.
    pub alignment: Option<usize>,
    /// For an `overrun` that ran into the header of the block behind (see `overrun_reach`): that
    /// block's user address.
    pub victim: Option<usize>,
}

/// A tag's budget crossed: its budget, and its live bytes with the crossing allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverBudget {
    pub tag: super::tags::TagId,
    pub budget_bytes: u64,
    pub live_bytes: u64,
}

/// Changed bytes: from `offset` (relative to the block's user pointer; negative in front of it)
/// on, `len` bytes as found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Damage {
    pub offset: isize,
    pub found: [u8; Damage::MAX_BYTES],
    pub len: u8,
}

impl Damage {
    /// An overrun's bytes are shown up to 64 past the block's end, and on to the end of a header
    /// that begins within them (`overrun_reach`).
    pub const MAX_BYTES: usize = 96;

    /// `found`, which begins at `offset`, as it is (up to [`Damage::MAX_BYTES`] of it).
    pub fn as_found(offset: isize, found: &[u8]) -> Damage {
        let len = found.len().min(Self::MAX_BYTES);
        let mut bytes = [0; Self::MAX_BYTES];
        bytes[..len].copy_from_slice(&found[..len]);
        Damage {
            offset,
            found: bytes,
            len: len as u8,
        }
    }

    /// The bytes of `found` (which begin at `start`) from the first one that differs from
    /// `expected` to the last one that does; `None` when none does.
    pub fn between(start: isize, found: &[u8], expected: &[u8]) -> Option<Damage> {
        Self::where_differs(start, found, |i| expected[i])
    }

    /// As [`Damage::between`], against bytes that should all be `fill`.
    pub fn against_fill(start: isize, found: &[u8], fill: u8) -> Option<Damage> {
        Self::where_differs(start, found, |_| fill)
    }

    fn where_differs(start: isize, found: &[u8], expected: impl Fn(usize) -> u8) -> Option<Damage> {
        let first = (0..found.len()).position(|i| found[i] != expected(i))?;
        let last = (0..found.len()).rposition(|i| found[i] != expected(i))?;
        Some(Self::as_found(start + first as isize, &found[first..=last]))
    }

    pub fn bytes(&self) -> &[u8] {
        &self.found[..self.len as usize]
    }

    /// The bytes as hex pairs: `41 41 00`.
    pub fn hex(&self) -> String {
        let pairs: Vec<String> = self.bytes().iter().map(|b| format!("{b:02x}")).collect();
        pairs.join(" ")
    }
}

impl MemoryError {
    /// A bad free of `ptr` through `freed_with`, of which nothing else is known yet.
    pub fn at_free(
        kind: ErrorKind,
        ptr: *mut u8,
        freed_with: BlockKind,
        free_stack: StackId,
    ) -> MemoryError {
        MemoryError {
            kind,
            address: ptr as usize,
            size: 0,
            file: None,
            line: 0,
            thread: 0,
            allocated_with: None,
            freed_with,
            allocator: None,
            detail: None,
            alloc_stack: StackId(0),
            free_stack,
            damage: None,
            interior_offset: None,
            previous_free_stack: StackId(0),
            over_budget: None,
            alignment: None,
            victim: None,
        }
    }
}

/// The errors kept for the report; past this many only the count grows, so a program that
/// double-frees in a loop does not grow the tracker without bound.
pub const MAX_KEPT_ERRORS: usize = 10_000;

pub struct ErrorLog {
    /// The first errors, in the order they happened.
    pub kept: Vec<MemoryError>,
    /// All errors, kept or not.
    pub total: usize,
}

static ERRORS: Mutex<ErrorLog> = Mutex::new(ErrorLog {
    kept: Vec::new(),
    total: 0,
});

fn log() -> MutexGuard<'static, ErrorLog> {
    ERRORS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How a memory error is printed the moment it happens: symbolizing it is the report layer's
/// work, which installs its printer at start-up ([`set_printer`]).
pub type Printer = fn(&MemoryError);

static PRINTER: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());
/// Errors recorded before a printer was installed (a library's constructor freeing badly before
/// the tracker's own ran): the first ones of the log, printed when the printer comes.
static UNPRINTED: AtomicUsize = AtomicUsize::new(0);

fn printer() -> Option<Printer> {
    let printer = PRINTER.load(Ordering::Acquire);
    // SAFETY: only `set_printer` stores here, and it stores a `Printer`.
    (!printer.is_null()).then(|| unsafe { core::mem::transmute::<*mut (), Printer>(printer) })
}

/// Installs the printer of memory errors, and prints those recorded before it.
pub fn set_printer(print: Printer) {
    PRINTER.store(print as *mut (), Ordering::Release);
    let early = UNPRINTED.swap(0, Ordering::AcqRel);
    if early > 0 {
        let kept: Vec<MemoryError> = log().kept.iter().take(early).cloned().collect();
        kept.iter().for_each(print);
    }
}

/// Records the error, prints it on stderr, and aborts if `halt_on_error` is set.
/// Called inside the tracker (its reentrancy guard held), never with a shard lock held.
#[cold]
#[inline(never)]
pub fn report(error: MemoryError) {
    let _held = crate::sys::CancellationHeld::hold();
    let printed = printer().map(|print| print(&error)).is_some();
    if crate::options::get().halt_on_error {
        crate::sys::write_fd(2, b"k15-memory: halt_on_error=1, aborting\n");
        crate::sys::abort();
    }
    let mut log = log();
    log.total += 1;
    if log.kept.len() < MAX_KEPT_ERRORS {
        log.kept.push(error);
        if !printed {
            UNPRINTED.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The kept errors and the count of all of them. Empty, with a line on stderr, when the log
/// stays locked for as long as stopping the world waits: an `exit` from a signal handler that
/// interrupted this very thread while it recorded an error.
pub fn all() -> (Vec<MemoryError>, usize) {
    match super::live_list::lock_within(&ERRORS) {
        Some(log) => (log.kept.clone(), log.total),
        None => {
            crate::sys::write_fd(
                2,
                b"k15-memory: the memory error log stayed locked: errors left out\n",
            );
            (Vec::new(), 0)
        }
    }
}

/// In a forked child: the errors so far were the parent's, which reports them.
pub(crate) fn forget_inherited() {
    *log() = ErrorLog {
        kept: Vec::new(),
        total: 0,
    };
}

/// Held by `fork` (see `fork`).
pub(crate) fn lock_for_fork() -> MutexGuard<'static, ErrorLog> {
    log()
}

/// The allocation family's name as a user writes it.
pub fn family(kind: BlockKind) -> &'static str {
    match kind {
        BlockKind::NewArray => "new[]",
        BlockKind::Rust => "Rust's allocator",
        BlockKind::Bullet => "btAlignedAlloc",
        BlockKind::Malloc => "malloc",
        BlockKind::Calloc => "calloc",
        BlockKind::Realloc => "realloc",
        BlockKind::AlignedAlloc => "aligned_alloc",
        BlockKind::PosixMemalign => "posix_memalign",
        BlockKind::Memalign => "memalign",
        BlockKind::Valloc => "valloc",
        BlockKind::Pvalloc => "pvalloc",
        BlockKind::Named => "k15::memory::allocate",
        _ => "new",
    }
}

/// The matching release function's name.
pub fn release_family(kind: BlockKind) -> &'static str {
    match kind {
        BlockKind::NewArray => "delete[]",
        BlockKind::Rust => "Rust's deallocator",
        BlockKind::Bullet => "btAlignedFree",
        BlockKind::Realloc => "realloc",
        BlockKind::Named => "k15::memory::deallocate",
        BlockKind::Malloc
        | BlockKind::Calloc
        | BlockKind::AlignedAlloc
        | BlockKind::PosixMemalign
        | BlockKind::Memalign
        | BlockKind::Valloc
        | BlockKind::Pvalloc => "free",
        _ => "delete",
    }
}
