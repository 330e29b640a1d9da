//! Memory errors: what went wrong at a free, kept for the report and printed at once.

use crate::ffi::BlockKind;
use crate::stack::StackId;
use std::sync::{Mutex, MutexGuard, PoisonError};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    MismatchedDelete,
    DoubleFree,
    InvalidFree,
    /// Budget mode: an allocation the budget could not serve.
    BudgetExceeded,
}

impl ErrorKind {
    /// The name used in the reports (SPEC's `errors[].kind`).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::MismatchedDelete => "mismatched_delete",
            ErrorKind::DoubleFree => "double_free",
            ErrorKind::InvalidFree => "invalid_free",
            ErrorKind::BudgetExceeded => "budget_exceeded",
        }
    }
}

/// One bad free, with what the block's header still told about its allocation.
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

/// Records the error, prints it on stderr, and aborts if `halt_on_error` is set.
/// Called inside the tracker (its reentrancy guard held), never with a shard lock held.
#[cold]
#[inline(never)]
pub fn report(error: MemoryError) {
    crate::report::text::print_error(&error);
    if crate::options::get().halt_on_error {
        crate::sys::write_fd(2, b"k15-memory: halt_on_error=1, aborting\n");
        crate::sys::abort();
    }
    let mut log = log();
    log.total += 1;
    if log.kept.len() < MAX_KEPT_ERRORS {
        log.kept.push(error);
    }
}

/// The kept errors and the count of all of them.
pub fn all() -> (Vec<MemoryError>, usize) {
    let log = log();
    (log.kept.clone(), log.total)
}

/// Held by `fork` (see `tracker::fork`).
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
