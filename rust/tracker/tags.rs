//! Tags: the subsystem names a thread's allocations carry (`K15_MEMORY_SCOPE("Physics/Broadphase")`),
//! interned into a fixed table of ids, and each tag's counters, kept per shard.
//!
//! A name is copied into the table the first time it is seen (under a lock, once per name);
//! looking it up again takes no lock: the table's entries are written once, before they are
//! published. `/` makes a hierarchy: interning `Physics/Broadphase` interns `Physics` first, its
//! parent. A block's tag is the innermost scope of its allocating thread (`guard`), kept in its
//! header for life.
//!
//! The counters of a tag are kept by every shard apart and written only by whoever holds the
//! shard (the allocating thread, or the free of one of its blocks): no lock, no atomic
//! read-modify-write on the allocation path. They are inclusive: an allocation counts against
//! its tag and every parent of it, so a parent's figures are read as they are. Live bytes are
//! also summed process-wide in steps of [`PEAK_FLUSH_BYTES`] per shard and tag, for the tag's
//! peak, as the process's own peak is (`live_list`).

use super::live_list::SHARD_COUNT;
use super::tag_budgets::{self, Crossed};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicI64, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// A tag's id: 0 for none (untagged), else its index in the table.
pub type TagId = u16;

/// Tags a process may name (the untagged id 0 among them): a name beyond them tags nothing.
pub const MAX_TAGS: usize = 256;
/// Bytes of all names together.
const NAME_ROOM: usize = 16 * 1024;
/// Slots of the lookup by name: twice the tags, so that probes stay short.
const INDEX_SLOTS: usize = 2 * MAX_TAGS;
/// How far a shard's live bytes of a tag move before they are added to the process-wide sum
/// (its peak is then exact for one thread, and within this much per thread otherwise).
const PEAK_FLUSH_BYTES: u64 = 32 * 1024;

/// The names' bytes: each name's are written once, under [`INTERNING`], before its entry in
/// [`ENTRIES`] is published, and never changed after.
struct NameBytes(UnsafeCell<[u8; NAME_ROOM]>);

// SAFETY: bytes are written only under `INTERNING` into room no published entry covers, and
// read only through a published entry (see `NameBytes`).
unsafe impl Sync for NameBytes {}

static NAME_BYTES: NameBytes = NameBytes(UnsafeCell::new([0; NAME_ROOM]));
/// Per id: the name's offset in [`NAME_BYTES`] (high half) and length (low half); 0 until
/// published.
static ENTRIES: [AtomicU32; MAX_TAGS] = [const { AtomicU32::new(0) }; MAX_TAGS];
/// Per id: its parent's id (0 for a top-level tag).
static PARENTS: [AtomicU16; MAX_TAGS] = [const { AtomicU16::new(0) }; MAX_TAGS];
/// Open addressing by the name's hash: ids, 0 for an empty slot.
static INDEX: [AtomicU16; INDEX_SLOTS] = [const { AtomicU16::new(0) }; INDEX_SLOTS];
/// Whether any block may have a tag: any tag interned, a bit of the hot word (`init`), so that
/// a free tests it in the word it loaded anyway. A block's tag was interned (and the bit set)
/// before it was allocated, so a thread that frees it sees this set.
#[inline(always)]
pub fn any() -> bool {
    super::init::set_up_hot().tags()
}

/// What only interning changes: the ids and name bytes given out so far.
struct Interned {
    tags: usize,
    name_bytes: usize,
}

static INTERNING: Mutex<Interned> = Mutex::new(Interned {
    tags: 1,
    name_bytes: 0,
});

/// Held by `fork` (see `tracker::fork`): a child forked while another thread interned a tag
/// would wait forever at its first new tag.
pub(crate) fn lock_for_fork() -> std::sync::MutexGuard<'static, impl Sized> {
    INTERNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The id of the tag `name` (interned now if new, with its parents); 0 for an empty name, one
/// with an empty part (`a//b`, `/a`), or when the table is full.
pub fn intern(name: &[u8]) -> TagId {
    if name.is_empty() || name.len() >= NAME_ROOM {
        return 0;
    }
    let hash = hash(name);
    if let Some(id) = find(name, hash) {
        return id;
    }
    // A handler's interning inside an interrupted one leaves its tag out (0) past the tracker's
    // patience; inside the tracker while the lock is held (see `frames::mark`: a signal handler
    // that lands here and forks would wait forever for this thread's lock).
    let interrupted = super::guard::inside();
    let _inside = super::guard::Inside::enter();
    let Some(mut interned) = super::live_list::lock_unless_interrupted(interrupted, &INTERNING)
    else {
        return 0;
    };
    intern_locked(&mut interned, name, hash)
}

/// [`intern`] with the lock held (its parents are interned on the way).
fn intern_locked(interned: &mut Interned, name: &[u8], hash: u64) -> TagId {
    if let Some(id) = find(name, hash) {
        return id;
    }
    let parent = match name.iter().rposition(|&b| b == b'/') {
        Some(0) => return 0,
        Some(slash) if slash + 1 == name.len() => return 0,
        Some(slash) => match intern_locked(interned, &name[..slash], self::hash(&name[..slash])) {
            0 => return 0,
            parent => parent,
        },
        None => 0,
    };
    if interned.tags == MAX_TAGS || interned.name_bytes + name.len() > NAME_ROOM {
        return 0;
    }
    let id = interned.tags as TagId;
    let offset = interned.name_bytes;
    // SAFETY: room past every published name (`name_bytes + len` is within it), written under
    // the lock, which no reader's slice covers (see `NameBytes`).
    unsafe {
        let room = NAME_BYTES.0.get().cast::<u8>().add(offset);
        core::ptr::copy_nonoverlapping(name.as_ptr(), room, name.len());
    }
    super::init::note_tags_in_use();
    PARENTS[id as usize].store(parent, Ordering::Relaxed);
    ENTRIES[id as usize].store((offset << 16 | name.len()) as u32, Ordering::Release);
    let mut slot = hash as usize % INDEX_SLOTS;
    while INDEX[slot].load(Ordering::Relaxed) != 0 {
        slot = (slot + 1) % INDEX_SLOTS;
    }
    INDEX[slot].store(id, Ordering::Release);
    interned.tags += 1;
    interned.name_bytes += name.len();
    id
}

/// The id of a name interned already.
fn find(name: &[u8], hash: u64) -> Option<TagId> {
    let mut slot = hash as usize % INDEX_SLOTS;
    loop {
        match INDEX[slot].load(Ordering::Acquire) {
            0 => return None,
            id if name_of(id) == name => return Some(id),
            _ => slot = (slot + 1) % INDEX_SLOTS,
        }
    }
}

/// FNV-1a: names are short, and hashed only when a scope is opened by name.
fn hash(name: &[u8]) -> u64 {
    name.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The name of tag `id` (empty for 0 or an id not given out).
pub fn name_of(id: TagId) -> &'static [u8] {
    let Some(entry) = ENTRIES.get(id as usize) else {
        return &[];
    };
    let entry = entry.load(Ordering::Acquire) as usize;
    let (offset, len) = (entry >> 16, entry & 0xffff);
    // SAFETY: a published entry's bytes lie within the room, written before it was published
    // and never changed (see `NameBytes`).
    unsafe { core::slice::from_raw_parts(NAME_BYTES.0.get().cast::<u8>().add(offset), len) }
}

/// The name of tag `id` as text (a name that is not UTF-8 is shown lossily).
pub fn name(id: TagId) -> String {
    String::from_utf8_lossy(name_of(id)).into_owned()
}

/// The parent of tag `id`, 0 for none.
pub fn parent(id: TagId) -> TagId {
    PARENTS
        .get(id as usize)
        .map_or(0, |p| p.load(Ordering::Relaxed))
}

/// `tag` if it is an id given out, else 0 (a number the program made up tags nothing).
pub fn known(tag: u32) -> TagId {
    match ENTRIES.get(tag as usize) {
        Some(entry) if tag != 0 && entry.load(Ordering::Acquire) != 0 => tag as TagId,
        _ => 0,
    }
}

/// The ids given out so far, 1 up.
pub fn ids() -> core::ops::Range<TagId> {
    let published = ENTRIES[1..]
        .iter()
        .take_while(|e| e.load(Ordering::Acquire) != 0)
        .count();
    1..published as TagId + 1
}

/// One shard's counters of one tag, written only by whoever holds the shard.
struct Counters {
    allocations: AtomicU64,
    frees: AtomicU64,
    total_bytes: AtomicU64,
    live_bytes: AtomicU64,
    peak_bytes: AtomicU64,
    /// `live_bytes` as last added to [`FLUSHED_LIVE_BYTES`].
    flushed: AtomicU64,
}

/// Only the arrays' initialiser: each element is a copy of its own.
#[allow(clippy::declare_interior_mutable_const)]
const ZERO: Counters = Counters {
    allocations: AtomicU64::new(0),
    frees: AtomicU64::new(0),
    total_bytes: AtomicU64::new(0),
    live_bytes: AtomicU64::new(0),
    peak_bytes: AtomicU64::new(0),
    flushed: AtomicU64::new(0),
};

/// By shard, then tag: 3 MiB of `.bss`, of which only the pages of the shards and tags in use
/// are ever touched.
static COUNTERS: [[Counters; MAX_TAGS]; SHARD_COUNT] = [const { [ZERO; MAX_TAGS] }; SHARD_COUNT];
static FLUSHED_LIVE_BYTES: [AtomicI64; MAX_TAGS] = [const { AtomicI64::new(0) }; MAX_TAGS];
static FLUSHED_PEAK_BYTES: [AtomicU64; MAX_TAGS] = [const { AtomicU64::new(0) }; MAX_TAGS];

/// Where the per-shard counters lie: numbers, which a leak scan skips (reading them all would
/// also fault in every page never touched).
pub fn counters_range() -> core::ops::Range<usize> {
    crate::sys::bytes_of(&COUNTERS)
}

/// Written only by whoever holds the shard, so a plain load and store suffice.
#[inline(always)]
fn bump(counter: &AtomicU64, by: u64) -> u64 {
    let value = counter.load(Ordering::Relaxed).wrapping_add(by);
    counter.store(value, Ordering::Relaxed);
    value
}

/// Counts a new block of `size` bytes tagged `tag` (not 0) on `shard`, which the caller holds;
/// returns the tags whose budgets it crossed (`tag_budgets`).
#[inline]
pub fn count_allocation(shard: u8, tag: TagId, size: usize) -> Crossed {
    let mut crossed = Crossed::default();
    let mut tag = tag;
    while tag != 0 {
        let c = &COUNTERS[shard as usize][tag as usize];
        bump(&c.allocations, 1);
        bump(&c.total_bytes, size as u64);
        let live = bump(&c.live_bytes, size as u64);
        if live > c.peak_bytes.load(Ordering::Relaxed) {
            c.peak_bytes.store(live, Ordering::Relaxed);
        }
        flush_if_moved(c, tag, live);
        if let Some(live_bytes) = tag_budgets::charge(tag, size) {
            crossed.push(tag, live_bytes);
        }
        tag = parent(tag);
    }
    crossed
}

/// Counts the free of a block of `size` bytes tagged `tag` (not 0) on `shard`, which the caller
/// holds.
#[cold]
#[inline(never)]
pub fn count_free(shard: u8, tag: TagId, size: usize) {
    let mut tag = tag;
    while tag != 0 {
        let c = &COUNTERS[shard as usize][tag as usize];
        bump(&c.frees, 1);
        let live = bump(&c.live_bytes, (size as u64).wrapping_neg());
        flush_if_moved(c, tag, live);
        tag_budgets::credit(tag, size);
        tag = parent(tag);
    }
}

/// Which way [`shift_live_bytes`] moves a tag's live bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Loan {
    /// Bytes of a block of the tag that a sub-block now holds (`told`), counted against the
    /// sub-block's tag instead: off the tag's live bytes, without counting a free.
    Lent,
    /// The sub-block that held them is gone: back onto the tag's live bytes.
    GivenBack,
}

/// Moves `size` live bytes of tag `tag` (not 0) and its parents on `shard`, which the caller
/// holds, as `loan` says; the budgets follow (a crossing was reported when the bytes were
/// first allocated).
#[cold]
#[inline(never)]
pub fn shift_live_bytes(shard: u8, tag: TagId, size: usize, loan: Loan) {
    let delta = match loan {
        Loan::Lent => (size as u64).wrapping_neg(),
        Loan::GivenBack => size as u64,
    };
    let mut tag = tag;
    while tag != 0 {
        let c = &COUNTERS[shard as usize][tag as usize];
        flush_if_moved(c, tag, bump(&c.live_bytes, delta));
        match loan {
            Loan::Lent => tag_budgets::credit(tag, size),
            Loan::GivenBack => drop(tag_budgets::charge(tag, size)),
        }
        tag = parent(tag);
    }
}

/// Adds a shard's change of a tag's live bytes to the process-wide sum once it is
/// [`PEAK_FLUSH_BYTES`] either way, and raises the tag's peak.
#[inline(always)]
fn flush_if_moved(c: &Counters, tag: TagId, live: u64) {
    let flushed = c.flushed.load(Ordering::Relaxed);
    if live.abs_diff(flushed) < PEAK_FLUSH_BYTES {
        return;
    }
    let delta = live.wrapping_sub(flushed) as i64;
    let total = FLUSHED_LIVE_BYTES[tag as usize].fetch_add(delta, Ordering::Relaxed) + delta;
    FLUSHED_PEAK_BYTES[tag as usize].fetch_max(total.max(0) as u64, Ordering::Relaxed);
    c.flushed.store(live, Ordering::Relaxed);
}

/// A tag's figures, its children's included.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TagStats {
    pub id: TagId,
    pub name: String,
    pub live_blocks: u64,
    pub live_bytes: u64,
    pub peak_bytes: u64,
    pub total_allocations: u64,
    pub total_bytes: u64,
    /// The tag's budget (`budgets=FILE`), 0 for none.
    pub budget_bytes: u64,
}

/// A tag's counters summed over the shards, read without locks (exact once threads are quiet).
#[derive(Clone, Copy, Default)]
pub struct Sums {
    pub allocations: u64,
    pub frees: u64,
    pub total_bytes: u64,
    pub live_bytes: u64,
    /// The highest of the shards' peaks.
    pub shard_peak_bytes: u64,
}

/// The counters of tag `id`, summed over the shards.
pub fn sums(id: TagId) -> Sums {
    let mut s = Sums::default();
    for shard in &COUNTERS {
        let c = &shard[id as usize];
        s.allocations += c.allocations.load(Ordering::Relaxed);
        s.frees += c.frees.load(Ordering::Relaxed);
        s.total_bytes += c.total_bytes.load(Ordering::Relaxed);
        s.live_bytes = s
            .live_bytes
            .wrapping_add(c.live_bytes.load(Ordering::Relaxed));
        s.shard_peak_bytes = s.shard_peak_bytes.max(c.peak_bytes.load(Ordering::Relaxed));
    }
    s
}

/// The figures of tag `id` (see [`PEAK_FLUSH_BYTES`] for the peak).
pub fn stats_of(id: TagId) -> TagStats {
    let s = sums(id);
    let flushed_peak = FLUSHED_PEAK_BYTES[id as usize].load(Ordering::Relaxed);
    TagStats {
        id,
        name: name(id),
        live_blocks: s.allocations.saturating_sub(s.frees),
        live_bytes: s.live_bytes,
        peak_bytes: flushed_peak.max(s.shard_peak_bytes).max(s.live_bytes),
        total_allocations: s.allocations,
        total_bytes: s.total_bytes,
        budget_bytes: tag_budgets::budget_of(id),
    }
}

/// Every tag's figures, in the order the tags were first seen (a parent before its children).
pub fn all_stats() -> Vec<TagStats> {
    ids().map(stats_of).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_interned_once_with_its_parents() {
        let leaf = intern(b"TagsTest/Physics/Broadphase");
        assert_ne!(leaf, 0);
        assert_eq!(intern(b"TagsTest/Physics/Broadphase"), leaf);
        let physics = parent(leaf);
        assert_eq!(name_of(physics), b"TagsTest/Physics");
        assert_eq!(name_of(parent(physics)), b"TagsTest");
        assert_eq!(parent(parent(physics)), 0);
        assert_eq!(intern(b"TagsTest/Physics"), physics);
    }

    #[test]
    fn names_with_empty_parts_tag_nothing() {
        for bad in [&b""[..], b"/a", b"a/", b"a//b"] {
            assert_eq!(intern(bad), 0, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn counts_include_the_children_and_the_peak_stays() {
        let leaf = intern(b"CountTest/Leaf");
        let top = parent(leaf);
        let shard = 3;
        assert!(count_allocation(shard, leaf, 100).tags().is_empty());
        assert!(count_allocation(shard, top, 50).tags().is_empty());
        count_free(shard, leaf, 100);
        let (l, t) = (stats_of(leaf), stats_of(top));
        assert_eq!((l.live_blocks, l.live_bytes, l.peak_bytes), (0, 0, 100));
        assert_eq!((l.total_allocations, l.total_bytes), (1, 100));
        assert_eq!((t.live_blocks, t.live_bytes, t.peak_bytes), (1, 50, 150));
        assert_eq!((t.total_allocations, t.total_bytes), (2, 150));
    }
}
