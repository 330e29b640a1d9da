//! Per-thread state: the reentrancy guard ("inside the tracker"), the thread's number, its
//! shard of the live lists, its allocation sequence, the frees its signal handlers deferred,
//! and what happens at its exit.
//!
//! The thread-local is `const`-initialised and has no `Drop`: C++ `thread_local` destructors
//! call `delete` at thread exit, after Rust TLS destructors would have run.

use super::header::BlockHeader;
use super::live_list::{self, ThreadShard};
use super::tags::TagId;
use super::BlockKind;
use core::cell::Cell;
use core::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};

/// Frees a thread's signal handlers may defer before the thread next leaves the tracker.
const DEFERRED_CAPACITY: usize = 128;
/// Nested tag scopes a thread keeps: deeper ones open and close, but their allocations carry
/// the tag of the deepest scope kept.
pub const SCOPE_DEPTH: usize = 32;

struct ThreadState {
    inside_tracker: Cell<bool>,
    /// 0 until the thread's first allocation; then 1 for the first thread that allocated, 2, …
    number: Cell<u32>,
    /// How many blocks this thread has allocated: the `seq` of the next one.
    allocations: Cell<u32>,
    /// The shard this thread works on; claimed with its number, given back at its exit.
    shard: Cell<Option<ThreadShard>>,
    /// Whether the thread-exit destructor is set for this thread.
    exit_hook_armed: Cell<bool>,
    /// Frees that signal handlers of this thread could not complete (see [`DeferredFree`]);
    /// atomics so a handler's push and the thread's pop cannot lose an entry to each other.
    deferred_len: AtomicUsize,
    deferred: [AtomicUsize; DEFERRED_CAPACITY],
    deferred_kinds: [AtomicU8; DEFERRED_CAPACITY],
    /// Claimed blocks deferred while the record was full, chained through their own first word
    /// (see [`defer`]): the last one's header, 0 for none.
    chained: AtomicUsize,
    /// The innermost open tag scope's tag (0: none), which the thread's allocations carry.
    tag: Cell<TagId>,
    /// Open tag scopes; only the first [`SCOPE_DEPTH`] keep their tags.
    scope_depth: Cell<usize>,
    scopes: [Cell<TagId>; SCOPE_DEPTH],
}

thread_local! {
    static THREAD: ThreadState = const {
        ThreadState {
            inside_tracker: Cell::new(false),
            number: Cell::new(0),
            allocations: Cell::new(0),
            shard: Cell::new(None),
            exit_hook_armed: Cell::new(false),
            deferred_len: AtomicUsize::new(0),
            deferred: [const { AtomicUsize::new(0) }; DEFERRED_CAPACITY],
            deferred_kinds: [const { AtomicU8::new(0) }; DEFERRED_CAPACITY],
            chained: AtomicUsize::new(0),
            tag: Cell::new(0),
            scope_depth: Cell::new(0),
            scopes: [const { Cell::new(0) }; SCOPE_DEPTH],
        }
    };
}

/// The calling thread's state, in one TLS access. `LocalKey::with` around a whole allocation
/// is not inlined and costs a call per use on the hot path; the reference it hands out here
/// cannot leave the thread (`ThreadState` is not `Sync`, so `&ThreadState` is not `Send`).
#[inline(always)]
fn this_thread() -> &'static ThreadState {
    // SAFETY: a `const` thread-local without `Drop` stays valid until the thread itself is gone,
    // and the reference stays on this thread (see above).
    THREAD.with(|t| unsafe { &*(t as *const ThreadState) })
}

/// Where the calling thread's state lies: its record of deferred frees keeps block and header
/// addresses after they are applied, which a leak scan must not take for the program's pointers.
pub fn thread_state_range() -> core::ops::Range<usize> {
    crate::sys::bytes_of(this_thread())
}

static NEXT_THREAD_NUMBER: AtomicU32 = AtomicU32::new(1);

/// Proof that this thread is inside the tracker; nested allocations (the tracker's own, a
/// signal handler's) get `None` and take the untracked path. Frees need no guard: a held shard
/// says so (its owner's `busy` flag, or a lock that knows its holder; see `live_list`).
pub struct Inside(&'static ThreadState);

impl Inside {
    #[inline]
    pub fn enter() -> Option<Inside> {
        let thread = this_thread();
        (!thread.inside_tracker.replace(true)).then(|| Inside(thread))
    }

    /// The calling thread (its number is assigned at its first tracked allocation: 1, 2, …)
    /// and the sequence number of the allocation being made now (1, 2, … per thread).
    #[inline]
    pub fn next_allocation(&self) -> (Me, u32) {
        (me_of(self.0), self.next_seq())
    }

    /// The sequence number of the allocation being made now.
    #[inline(always)]
    pub fn next_seq(&self) -> u32 {
        let t = self.0;
        let seq = t.allocations.get().wrapping_add(1);
        t.allocations.set(seq);
        seq
    }

    /// Leaves the tracker without applying the frees signal handlers deferred meanwhile; true
    /// if there are any (the caller applies them, or enters again, as the general allocation
    /// path does, and they are applied when it leaves).
    #[inline(always)]
    pub fn leave(self) -> bool {
        let thread = self.0;
        core::mem::forget(self);
        thread.inside_tracker.set(false);
        thread.deferred_len.load(Ordering::Relaxed) != 0
    }

    /// The tag of the thread's innermost open scope (0: none).
    #[inline(always)]
    pub fn tag(&self) -> TagId {
        self.0.tag.get()
    }

    /// The calling thread if it works on a shard of its own; `None` if it has no shard yet
    /// or shares a guest shard.
    #[inline(always)]
    pub fn me_on_own_shard(&self) -> Option<Me> {
        let t = self.0;
        let shard = t.shard.get().filter(|shard| shard.owned)?;
        Some(Me {
            number: t.number.get(),
            shard,
        })
    }
}

/// Opens a tag scope on the calling thread: its allocations carry `tag` until it is closed.
#[inline]
pub fn open_scope(tag: TagId) {
    let t = this_thread();
    let depth = t.scope_depth.get();
    if let Some(slot) = t.scopes.get(depth) {
        slot.set(tag);
        t.tag.set(tag);
    }
    t.scope_depth.set(depth + 1);
}

/// Closes the calling thread's innermost tag scope (none open: nothing happens).
#[inline]
pub fn close_scope() {
    let t = this_thread();
    let Some(depth) = t.scope_depth.get().checked_sub(1) else {
        return;
    };
    t.scope_depth.set(depth);
    if depth < SCOPE_DEPTH {
        t.tag.set(
            depth
                .checked_sub(1)
                .map_or(0, |outer| t.scopes[outer].get()),
        );
    }
}

/// Whether the calling thread is inside the tracker (allocating, or on a slow path of a free):
/// then a signal handler's free must wait (see [`DeferredFree`]).
#[inline]
pub fn inside() -> bool {
    this_thread().inside_tracker.get()
}

/// A free that a signal handler could not complete because it interrupted its own thread inside
/// the tracker (which may hold the locks and lists the free needs): kept on the thread and
/// applied when the thread leaves the tracker.
#[derive(Clone, Copy)]
pub enum DeferredFree {
    /// A live block, claimed at once (a report in between does not list it, and a second free
    /// of it is a double free); applied by queueing it for settling.
    Claimed(*mut BlockHeader),
    /// Anything else (a block freed since, a pointer not ours): freed again when applied, which
    /// reports it.
    Free { ptr: *mut u8, kind: BlockKind },
}

/// The kind kept for a [`DeferredFree::Claimed`]; a `Free` keeps its `BlockKind` there.
const CLAIMED: u8 = u8::MAX;

impl DeferredFree {
    /// The pointer and the kind kept for it (a foreign pointer may have any alignment, so
    /// the two are kept apart).
    fn split(self) -> (usize, u8) {
        match self {
            DeferredFree::Claimed(header) => (header as usize, CLAIMED),
            DeferredFree::Free { ptr, kind } => (ptr as usize, kind as u8),
        }
    }

    fn join(address: usize, kind: u8) -> DeferredFree {
        match kind {
            CLAIMED => DeferredFree::Claimed(address as *mut BlockHeader),
            byte => DeferredFree::Free {
                ptr: address as *mut u8,
                kind: BlockKind::from_byte(byte),
            },
        }
    }
}

/// Keeps `free` for the thread to apply; false when it cannot: the thread's record is full and
/// the free is no claimed block of 8 bytes or more.
///
/// A claimed block beyond the record is chained through its first 8 bytes, which the program
/// freed (a signal storm deferred tens of thousands at once, counted lost before). The chain is
/// only pushed while the record is full, so a thread leaving the tracker, which looks at the
/// record's length alone, finds work and applies both ([`take_chained`] after the record).
/// Async-signal-safe: a handler interrupting another push or a pop loses nothing.
pub fn defer(free: DeferredFree) -> bool {
    let t = this_thread();
    // Reserve the slot first: a nested handler arriving before the store takes the next one.
    let at = t.deferred_len.fetch_add(1, Ordering::Relaxed);
    if at >= DEFERRED_CAPACITY {
        t.deferred_len.fetch_sub(1, Ordering::Relaxed);
        return match free {
            DeferredFree::Claimed(header) => chain(t, header),
            DeferredFree::Free { .. } => false,
        };
    }
    let (address, kind) = free.split();
    t.deferred[at].store(address, Ordering::Relaxed);
    t.deferred_kinds[at].store(kind, Ordering::Relaxed);
    true
}

/// Chains claimed block `header` on `t` (see [`defer`]), if its user bytes hold a link.
fn chain(t: &ThreadState, header: *mut BlockHeader) -> bool {
    // SAFETY: a claimed block's header: ours, intact, and no one frees the block but the
    // thread that claimed it.
    if unsafe { (*header).size() } < core::mem::size_of::<usize>() {
        return false; // its guard would be written over
    }
    let link = BlockHeader::user_ptr(header).cast::<usize>();
    let mut last = t.chained.load(Ordering::Relaxed);
    loop {
        // SAFETY: the block's first 8 user bytes, freed by the program and read by nobody until
        // the chain is taken.
        unsafe { link.write_unaligned(last) };
        // A handler interrupting between the load and here pushed on top: link again.
        match t.chained.compare_exchange_weak(
            last,
            header as usize,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => return true,
            Err(now) => last = now,
        }
    }
}

/// The claimed blocks chained on the calling thread (see [`defer`]), all taken at once: each
/// link is read before the block is handed out, so the caller may free it.
pub fn take_chained() -> impl Iterator<Item = *mut BlockHeader> {
    let mut next = this_thread().chained.swap(0, Ordering::Relaxed);
    core::iter::from_fn(move || {
        let header = (next != 0).then_some(next as *mut BlockHeader)?;
        // SAFETY: a block chained by `chain`, whose first user word holds the next link.
        next = unsafe {
            BlockHeader::user_ptr(header)
                .cast::<usize>()
                .read_unaligned()
        };
        Some(header)
    })
}

/// The last deferred free of the calling thread, taken off its record.
pub fn take_deferred() -> Option<DeferredFree> {
    let t = this_thread();
    loop {
        let len = t.deferred_len.load(Ordering::Relaxed);
        if len == 0 {
            return None;
        }
        let address = t.deferred[len - 1].load(Ordering::Relaxed);
        let kind = t.deferred_kinds[len - 1].load(Ordering::Relaxed);
        // Fails when a handler pushed in between; its entry is then the last one.
        if t.deferred_len
            .compare_exchange(len, len - 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            return Some(DeferredFree::join(address, kind));
        }
    }
}

/// The calling thread, for the live lists.
#[derive(Clone, Copy)]
pub struct Me {
    pub number: u32,
    pub shard: ThreadShard,
}

/// The calling thread, given a number and a shard now if it has none.
#[inline]
pub fn me() -> Me {
    me_of(this_thread())
}

#[inline]
fn me_of(t: &ThreadState) -> Me {
    match t.shard.get() {
        Some(shard) => Me {
            number: t.number.get(),
            shard,
        },
        None => join(t),
    }
}

/// The calling thread's shard, if it has one (none is claimed).
pub fn own_shard() -> Option<ThreadShard> {
    this_thread().shard.get()
}

/// A thread's first use of the live lists (or its first after giving its shard back at exit).
#[cold]
fn join(t: &ThreadState) -> Me {
    let number = number_of(t);
    let shard = live_list::claim_shard(number);
    t.shard.set(Some(shard));
    arm_thread_exit();
    record_thread();
    Me { number, shard }
}

/// Puts the calling thread in the record of threads that reports scan (once; again after it
/// left), with where the tracker's own state lies in it.
pub fn record_thread() {
    super::threads::register([
        crate::stack::tracker_thread_state(),
        thread_state_range(),
        super::thread_heap_range(),
    ]);
}

/// Makes sure this thread's shard and heap lists are given back when it exits. The pthread key
/// destructor runs after C++ `thread_local` destructors (which may still `delete`); a later
/// allocation sets it again, and glibc then runs it again.
pub fn arm_thread_exit() {
    let t = this_thread();
    if t.exit_hook_armed.replace(true) {
        return;
    }
    static KEY: std::sync::OnceLock<Option<libc::pthread_key_t>> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: creates a key whose destructor is a plain function; without a key, exiting
        // threads keep their shard and free blocks, which only wastes them.
        (unsafe { libc::pthread_key_create(&mut key, Some(at_thread_exit)) } == 0).then_some(key)
    });
    if let Some(key) = *key {
        // SAFETY: any non-null value makes glibc call the destructor at this thread's exit.
        unsafe { libc::pthread_setspecific(key, core::ptr::dangling::<libc::c_void>()) };
    }
}

extern "C" fn at_thread_exit(_: *mut libc::c_void) {
    let t = this_thread();
    t.exit_hook_armed.set(false);
    super::apply_deferred_frees();
    // Inside the tracker from here: a signal handler that allocates while this thread holds
    // shard locks (settling its queued frees stops the world) gets untracked memory instead of
    // waiting for them (it waited forever).
    let _inside = Inside::enter();
    let Some(shard) = t.shard.take() else {
        return; // no shard, so no heap lists either (both come with the first allocation)
    };
    let number = t.number.get();
    if shard.owned {
        super::pending_stacks::settle_ring(shard.index);
    }
    give_back_thread_lists(number, shard);
    live_list::leave_shard(number, shard);
    super::threads::unregister();
}

/// The heap's lists that thread `number` keeps on `shard` go back to their classes.
fn give_back_thread_lists(number: u32, shard: ThreadShard) {
    if let Some(mut held) = live_list::SHARDS[shard.index as usize].hold(number, shard.owned) {
        super::heap::give_back_thread_lists(&mut held);
    }
}

/// Before the exit report: the calling thread's cached free blocks go back to their classes,
/// as at a thread's exit (it keeps its shard), so that the spans only they held are free.
pub fn give_back_own_lists() {
    let t = this_thread();
    if let Some(shard) = t.shard.get() {
        give_back_thread_lists(t.number.get(), shard);
    }
}

/// The calling thread's number, assigned now if it has none (for frees, which need no guard).
#[inline]
pub fn thread_number() -> u32 {
    number_of(this_thread())
}

/// The calling thread's number and the `seq` its next allocation will get (off the hot path:
/// `ScopedLeakIgnore` marks its bounds with it).
pub fn next_sequence() -> (u32, u32) {
    let t = this_thread();
    (number_of(t), t.allocations.get().wrapping_add(1))
}

#[inline]
fn number_of(t: &ThreadState) -> u32 {
    match t.number.get() {
        0 => assign_thread_number(t),
        number => number,
    }
}

/// How many blocks the calling thread has allocated (the `seq` of its last one).
pub fn allocations_so_far() -> u32 {
    this_thread().allocations.get()
}

/// The number the next thread to allocate will get.
pub fn next_thread_number() -> u32 {
    NEXT_THREAD_NUMBER.load(Ordering::Relaxed)
}

#[cold]
fn assign_thread_number(t: &ThreadState) -> u32 {
    let number = NEXT_THREAD_NUMBER.fetch_add(1, Ordering::Relaxed);
    t.number.set(number);
    number
}

impl Drop for Inside {
    #[inline]
    fn drop(&mut self) {
        self.0.inside_tracker.set(false);
        if self.0.deferred_len.load(Ordering::Relaxed) != 0 {
            super::apply_deferred_frees();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_entry_is_refused_and_leaves_the_outer_one_in_place() {
        let outer = Inside::enter().expect("first entry");
        assert!(Inside::enter().is_none());
        assert!(
            Inside::enter().is_none(),
            "the refused entry did not clear the flag"
        );
        drop(outer);
        assert!(Inside::enter().is_some());
    }

    #[test]
    fn deferred_frees_come_back_last_first_and_a_full_record_refuses() {
        // A foreign pointer may be odd: kept whole.
        let block = |i: usize| (0x10_0001 + i * 0x40) as *mut u8;
        assert!(defer(DeferredFree::Claimed(block(1) as *mut BlockHeader)));
        assert!(defer(DeferredFree::Free {
            ptr: block(2),
            kind: BlockKind::NewArray,
        }));
        match take_deferred() {
            Some(DeferredFree::Free { ptr, kind }) => {
                assert_eq!(ptr, block(2));
                assert_eq!(kind, BlockKind::NewArray);
            }
            _ => panic!("the last one first"),
        }
        match take_deferred() {
            Some(DeferredFree::Claimed(header)) => assert_eq!(header as *mut u8, block(1)),
            _ => panic!("then the claimed one"),
        }
        assert!(take_deferred().is_none());
        for i in 0..DEFERRED_CAPACITY {
            assert!(defer(DeferredFree::Claimed(block(i) as *mut BlockHeader)));
        }
        // A claimed block beyond the record is chained through its memory (these are no
        // blocks); anything else is refused.
        assert!(!defer(DeferredFree::Free {
            ptr: block(0),
            kind: BlockKind::New,
        }));
        let mut taken = 0;
        while take_deferred().is_some() {
            taken += 1;
        }
        assert_eq!(
            taken, DEFERRED_CAPACITY,
            "a refused push left the record as it was"
        );
    }
}
