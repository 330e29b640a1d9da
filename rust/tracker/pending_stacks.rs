//! The stacks of new blocks, kept as return addresses in a ring per shard and interned into the depot only if the block outlives its place there.
//!
//! Interning a stack is the dearest part of a capture on real code: yaml-cpp's test suite has
//! 174,000 distinct stacks among its 350,000 allocations, and interning them added 450,000 depot
//! nodes (7 MiB of fresh memory and a hash probe each) for about 0.11x of the program's time.
//! Yet nearly all those blocks are freed soon: with a ring of some 900 stacks per thread, 14% of
//! them are still live (or freed but not yet reused) when their place is needed again. So an
//! allocation writes its frames into its shard's ring and its header holds a *tag* naming the
//! entry ([`is_pending`]); only when the ring comes round to the entry and the header still
//! holds that tag is the stack interned and the tag replaced by its id (a CAS of the header's
//! stack field, which no cookie covers for that reason). Whoever needs a block's stack before
//! that (a report, an error) interns the entry itself ([`resolve`]).
//!
//! The ring is used only where it pays ([`Ring::judge`], [`Ring::count_interned`]): a thread
//! interns at once while its stacks repeat (interning then finds their nodes, mostly among its
//! recent ones) or its blocks outlive their entries (each stack would be written twice and
//! interned whole).
//!
//! A ring is written by its shard's owner alone. Others read an entry as a seqlock: the entry's
//! tag word, the frames, then the tag word again; an owner that takes an entry's place first
//! settles the block's header (so a reader that finds the entry gone finds the id there), then
//! clears the tag word, and only then writes over the frames.
//!
//! Tags: bit 31 set (depot ids stay below 2^24), the shard in bits 23..31, the ring's lap in bits
//! 13..23 and the entry's offset (in pairs of words) below, so that a tag read from a header
//! whose entry is long gone names no other entry for 1,024 laps. Threads on guest shards, a
//! signal handler interrupting the ring's owner and blocks outside the heap (which may be
//! unmapped when their entry is settled) intern at once.

use core::mem::MaybeUninit;
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use core::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU32, AtomicUsize};

use super::header::{BlockHeader, Layout, Placement};
use super::live_list::SHARD_COUNT;
use crate::stack::{self, StackId, StartFrame, MAX_DEPTH};

/// Words in a ring: 128 KiB, some 900 stacks of yaml-cpp's depth.
const RING_WORDS: usize = 1 << 14;
const PENDING: u32 = 1 << 31;
const SHARD_SHIFT: u32 = 23;
const LAP_SHIFT: u32 = 13;
const LAP_MASK: u32 = (1 << (SHARD_SHIFT - LAP_SHIFT)) - 1;
const OFFSET_MASK: u32 = (1 << LAP_SHIFT) - 1;
const _: () = assert!(
    RING_WORDS / 2 == 1 << LAP_SHIFT,
    "an offset names every pair of words"
);
/// Marks where the entries of a lap end (an entry's first word is a header address or 0).
const WRAP: usize = usize::MAX;
/// An entry's first word: its block's header, with this bit set for a compact one.
const COMPACT_BIT: usize = 1;

/// A shard's ring. The fields other than `words` are its owner's alone; atomics only so that the
/// ring may be shared (relaxed loads and stores are plain ones).
#[repr(C)]
struct Ring {
    /// Where the next entry goes, and the oldest entry (valid while `live > 0`).
    head: AtomicUsize,
    tail: AtomicUsize,
    live: AtomicUsize,
    lap: AtomicU32,
    /// Set while the owner changes the ring: a signal handler that allocates meanwhile interns.
    busy: AtomicBool,
    /// Whether captures go into the ring (else they intern at once; see [`Ring::judge`]).
    in_use: AtomicBool,
    /// Entries evicted in the current window, and how many of them had to be interned.
    evicted: AtomicU32,
    kept: AtomicU32,
    /// Captures interned at once in the current window, and the thread's depot nodes before it.
    interned: AtomicU32,
    nodes_before: AtomicU32,
    /// Entries: the header's address (0 until [`attach`]), the tag with the frame count in the
    /// high half, the frames; each rounded up to an even number of words.
    words: [AtomicUsize; RING_WORDS],
}

static RINGS: [AtomicPtr<Ring>; SHARD_COUNT] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; SHARD_COUNT];

/// Whether `id` is a tag (a stack not interned yet) rather than a depot id.
#[inline(always)]
pub fn is_pending(id: StackId) -> bool {
    id.0 & PENDING != 0
}

/// The ring of `shard`, mapped at its first use; `None` if it cannot be.
#[inline]
fn ring_of(shard: u8) -> Option<&'static Ring> {
    mapped_ring(shard).or_else(|| {
        crate::sys::map_once(&RINGS[shard as usize], core::mem::size_of::<Ring>());
        mapped_ring(shard)
    })
}

/// The ring of `shard` if it was ever mapped.
#[inline(always)]
fn mapped_ring(shard: u8) -> Option<&'static Ring> {
    // SAFETY: a ring, once mapped, stays mapped for the process's life, zeroed at first
    // (an empty ring), and is only ever accessed through atomics.
    unsafe { RINGS[shard as usize].load(Acquire).as_ref() }
}

/// The stack of a new block of the thread that owns `shard`, `depth` frames at most: a tag
/// naming the ring entry its frames went to, or the id where the ring interns at once for now
/// ([`Ring::judge`]), is in use (a signal handler) or cannot be had.
#[inline(always)]
pub(super) fn capture(shard: u8, start: StartFrame, depth: usize) -> StackId {
    match ring_of(shard) {
        Some(ring) if !ring.busy.load(Relaxed) => {
            if ring.in_use.load(Relaxed) {
                capture_into(ring, shard, start, depth)
            } else {
                let id = stack::capture(start, depth);
                ring.count_interned();
                id
            }
        }
        _ => stack::capture(start, depth),
    }
}

/// [`capture`] into `ring`.
#[inline(never)]
fn capture_into(ring: &Ring, shard: u8, start: StartFrame, depth: usize) -> StackId {
    let depth = depth.min(MAX_DEPTH);
    ring.busy.store(true, Relaxed);
    compiler_fence(Release); // a signal handler on this thread sees `busy` before any change
    let at = ring.reserve(entry_words(depth));
    ring.judge();
    // SAFETY: the words after `at`'s first two are the owner's to write: no entry holds them
    // (`reserve` settled those that did, and cleared their tag words before, so a reader still
    // copying one rejects what it copied). `AtomicUsize` has `usize`'s layout.
    let region = unsafe {
        core::slice::from_raw_parts_mut(
            ring.words
                .as_ptr()
                .add(at + 2)
                .cast::<MaybeUninit<usize>>()
                .cast_mut(),
            depth,
        )
    };
    let n = stack::capture_frames(start, region);
    let id = if n == 0 {
        StackId(0)
    } else {
        ring.commit(shard, at, n)
    };
    compiler_fence(Release);
    ring.busy.store(false, Relaxed);
    id
}

/// Words an entry of `frames` frames takes.
#[inline(always)]
fn entry_words(frames: usize) -> usize {
    (2 + frames + 1) & !1
}

/// The ring and word offset a tag names.
fn entry_of(tag: u32) -> Option<(&'static Ring, usize)> {
    let ring = mapped_ring((tag >> SHARD_SHIFT) as u8)?;
    Some((ring, (tag & OFFSET_MASK) as usize * 2))
}

/// A block's header was written with `id` as its stack: a tag's entry learns where the header
/// is, or, for a block outside the heap, is interned now.
#[inline]
pub(super) fn attach(id: StackId, header: *mut BlockHeader, placement: Placement) {
    if !is_pending(id) {
        return;
    }
    if placement != Placement::Heap {
        // SAFETY: the header was just written, and the block is not handed out yet.
        let _ = resolve(unsafe { &*header }, id);
        return;
    }
    let Some((ring, at)) = entry_of(id.0) else {
        return;
    };
    if ring.words[at + 1].load(Relaxed) as u32 == id.0 {
        // SAFETY: the header was just written.
        let compact = unsafe { (*header).layout() } == Layout::Compact;
        ring.words[at].store(header as usize | usize::from(compact), Relaxed);
    }
}

/// The depot id of the stack whose tag `tag` the header `h` holds: its entry interned, and the
/// tag in the header replaced by the id. `StackId(0)` where the entry is gone and the header
/// still holds the tag (its block was taken for gone, its header damaged).
pub(super) fn resolve(h: &BlockHeader, tag: StackId) -> StackId {
    let field = h.stack_field();
    let id = match intern_entry(tag) {
        // The entry's owner settles the header before it lets the entry go.
        None => match field.load(Acquire) {
            now if now & PENDING == 0 => StackId(now),
            _ => StackId(0),
        },
        Some(id) => match field.compare_exchange(tag.0, id.0, Relaxed, Acquire) {
            Err(now) if now & PENDING == 0 => StackId(now),
            _ => id,
        },
    };
    if id != StackId(0) {
        BlockHeader::record_stack_interned(h, tag, id);
    }
    id
}

/// `id` itself, or for a tag its entry's stack interned now (`StackId(0)` once the entry is
/// gone): for a stack whose block was never made (a budget refused it).
pub(super) fn settled(id: StackId) -> StackId {
    if is_pending(id) {
        intern_entry(id).unwrap_or(StackId(0))
    } else {
        id
    }
}

/// The depot id of the stack in `tag`'s entry, interned now; `None` if the entry is gone.
fn intern_entry(tag: StackId) -> Option<StackId> {
    let (ring, at) = entry_of(tag.0)?;
    let mut frames = [0usize; MAX_DEPTH];
    let n = ring.read(at, tag.0, &mut frames)?;
    Some(stack::intern_frames(&frames[..n]))
}

/// Whether `id` can be the stack of the block at `header` laid out as `layout`: a depot id, or a
/// tag whose entry names that header. (An overrun of the block in front may have changed the
/// header's stack, which no cookie covers: `BlockHeader::front_overrun` asks.)
pub(super) fn names_block(id: StackId, header: *const BlockHeader, layout: Layout) -> bool {
    if !is_pending(id) {
        return (id.0 as usize) <= crate::stack::depot::len();
    }
    entry_of(id.0).is_some_and(|(ring, at)| {
        let compact = usize::from(layout == Layout::Compact);
        ring.words[at + 1].load(Relaxed) as u32 == id.0
            && ring.words[at].load(Relaxed) == header as usize | compact
    })
}

/// Interns every stack in every ring whose block still holds its tag: before the module set
/// changes, as stack ids tell when a stack was captured (`symbolize::modules`), and a stack
/// interned after a `dlclose` would be looked up without the module it was captured in. The
/// owners may be writing their rings meanwhile: each entry is read as [`resolve`] reads it, and
/// its header is used only if it lies in the heap and its cookie holds.
pub fn settle_all() {
    for shard in 0..SHARD_COUNT {
        let Some(ring) = mapped_ring(shard as u8) else {
            continue;
        };
        for at in (0..RING_WORDS).step_by(2) {
            let tag = ring.words[at + 1].load(Acquire) as u32;
            let names_this = tag & PENDING != 0
                && tag >> SHARD_SHIFT & 0xff == shard as u32
                && (tag & OFFSET_MASK) as usize * 2 == at;
            if names_this {
                if let Some((h, _)) = holder(ring.words[at].load(Relaxed), tag) {
                    let _ = resolve(h, StackId(tag));
                }
            }
        }
    }
}

/// The header an entry's first word names, if it lies in the heap, its cookie holds and it still
/// holds `tag`; with its layout.
fn holder(word: usize, tag: u32) -> Option<(&'static BlockHeader, Layout)> {
    let header = word & !COMPACT_BIT;
    if header == 0 || !header.is_multiple_of(16) || !super::heap::contains(header) {
        return None;
    }
    // SAFETY: the heap's memory stays mapped once committed, and a header address in it
    // lies in committed memory (blocks are carved only there).
    let h = unsafe { &*(header as *const BlockHeader) };
    let layout = if word & COMPACT_BIT != 0 {
        Layout::Compact
    } else {
        Layout::Full
    };
    (h.stack_field_as(layout).load(Relaxed) == tag && h.cookie_valid_where(layout, true))
        .then_some((h, layout))
}

/// The calling thread leaves `shard`: every entry is settled, and the ring's memory goes back to
/// the OS, empty for the next owner.
pub(super) fn settle_ring(shard: u8) {
    let Some(ring) = mapped_ring(shard) else {
        return;
    };
    if ring.busy.load(Relaxed) {
        return; // a thread exit inside a capture (a signal handler): left to the next owner
    }
    ring.settle_entries();
    ring.head.store(0, Relaxed);
    ring.next_lap();
    // The next owner's captures start by interning at once, its own novelty yet to be judged
    // (a new thread has added no depot nodes).
    ring.intern_at_once_from(0);
    fence(Release);
    // SAFETY: no entry is left, so no reader takes anything from these words (a slow one
    // finds zeros and rejects them); they read as zeros until written again.
    unsafe {
        crate::sys::return_pages(
            ring.words.as_ptr().cast::<u8>().cast_mut(),
            RING_WORDS * core::mem::size_of::<usize>(),
        )
    };
}

/// Evictions a ring judges its blocks' lifetimes by, and captures interned at once it judges
/// their stacks' novelty by.
const WINDOW: u32 = 1024;
const NOVELTY_WINDOW: u32 = 4096;

impl Ring {
    /// One more capture interned at once: after [`NOVELTY_WINDOW`] of them, where they added a
    /// depot node for every other capture or more, the ring is taken into use. Interning is
    /// cheap when stacks repeat (the nodes are found, mostly in the thread's recent ones) and
    /// dear when they are new (yaml-cpp's suite: 1.3 new nodes a capture), which is when the
    /// ring pays.
    #[inline(always)]
    fn count_interned(&self) {
        let interned = self.interned.load(Relaxed) + 1;
        self.interned.store(interned, Relaxed);
        if interned >= NOVELTY_WINDOW {
            self.judge_novelty();
        }
    }

    #[cold]
    #[inline(never)]
    fn judge_novelty(&self) {
        let Some(nodes) = stack::nodes_added() else {
            return;
        };
        let added = nodes.wrapping_sub(self.nodes_before.load(Relaxed));
        if added * 2 >= NOVELTY_WINDOW {
            self.evicted.store(0, Relaxed);
            self.kept.store(0, Relaxed);
            self.in_use.store(true, Relaxed);
        }
        self.interned.store(0, Relaxed);
        self.nodes_before.store(nodes, Relaxed);
    }

    /// After a window of evictions: where half or more of the blocks outlived their entries,
    /// the ring costs more than it saves (each such stack is written twice, and interned whole
    /// where a capture's own interning reuses the last stack's nodes): its entries are settled
    /// and captures intern at once again, until their stacks are judged new again. (Churn's
    /// blocks live 4,096 iterations: 71% outlive their entries; yaml-cpp's 14%.)
    #[inline]
    fn judge(&self) {
        let evicted = self.evicted.load(Relaxed);
        if evicted < WINDOW {
            return;
        }
        if self.kept.load(Relaxed) * 2 >= evicted {
            self.settle_entries();
            let nodes = stack::nodes_added().unwrap_or(self.nodes_before.load(Relaxed));
            self.intern_at_once_from(nodes);
        }
        self.evicted.store(0, Relaxed);
        self.kept.store(0, Relaxed);
    }

    /// Every entry gives up its place (see [`Ring::evict_tail`]).
    fn settle_entries(&self) {
        while self.live.load(Relaxed) > 0 {
            self.evict_tail();
        }
    }

    /// Captures intern at once from now, a novelty window starting with the thread's depot
    /// nodes at `nodes`.
    fn intern_at_once_from(&self, nodes: u32) {
        self.in_use.store(false, Relaxed);
        self.interned.store(0, Relaxed);
        self.nodes_before.store(nodes, Relaxed);
    }

    /// Entries written from now on get tags of a new lap.
    fn next_lap(&self) {
        self.lap
            .store(self.lap.load(Relaxed).wrapping_add(1) & LAP_MASK, Relaxed);
    }

    /// Room for an entry of `need` words at the head: the entries there are settled first. The
    /// offset of the room.
    fn reserve(&self, need: usize) -> usize {
        let mut head = self.head.load(Relaxed);
        if head + need > RING_WORDS {
            // The entries from `head` to the end go first, then the lap starts over.
            while self.live.load(Relaxed) > 0 && self.tail.load(Relaxed) >= head {
                self.evict_tail();
                if self.tail.load(Relaxed) == 0 {
                    break;
                }
            }
            if head < RING_WORDS {
                self.words[head].store(WRAP, Relaxed);
            }
            head = 0;
            self.next_lap();
        }
        loop {
            let tail = self.tail.load(Relaxed);
            if self.live.load(Relaxed) == 0 || tail < head || tail >= head + need {
                break;
            }
            self.evict_tail();
        }
        self.head.store(head, Relaxed);
        head
    }

    /// The oldest entry gives up its place: its block's header gets the stack's id if it still
    /// holds the tag. (Once a ring is full, every new entry takes one entry's place.)
    #[inline(never)]
    fn evict_tail(&self) {
        let at = self.tail.load(Relaxed);
        let word = self.words[at + 1].load(Relaxed);
        let (tag, n) = (word as u32, word >> 32);
        self.evicted.store(self.evicted.load(Relaxed) + 1, Relaxed);
        if let Some((h, layout)) = holder(self.words[at].load(Relaxed), tag) {
            self.kept.store(self.kept.load(Relaxed) + 1, Relaxed);
            // SAFETY: the entry's frames, written by this thread (the owner).
            let frames = unsafe {
                core::slice::from_raw_parts(self.words.as_ptr().add(at + 2).cast::<usize>(), n)
            };
            let id = stack::intern_frames(frames);
            let settled = h
                .stack_field_as(layout)
                .compare_exchange(tag, id.0, Relaxed, Relaxed);
            if settled.is_ok() {
                BlockHeader::record_stack_interned(h, StackId(tag), id);
            }
        }
        // Readers that see the tag gone see the header settled; what follows (the next
        // entries' frames) is not taken for this entry by any reader.
        self.words[at + 1].store(0, Release);
        fence(Release);
        let next = at + entry_words(n);
        let tail = if next >= RING_WORDS || self.words[next].load(Relaxed) == WRAP {
            0
        } else {
            next
        };
        self.tail.store(tail, Relaxed);
        self.live.store(self.live.load(Relaxed) - 1, Relaxed);
        // The next eviction reads the next entry's header, made some 900 allocations ago:
        // fetched now, it is in the cache by then.
        let next_header = self.words[tail].load(Relaxed) & !COMPACT_BIT;
        crate::sys::prefetch(next_header + 8);
    }

    /// The `n` frames just written after `at`'s first two words become an entry: its tag.
    fn commit(&self, shard: u8, at: usize, n: usize) -> StackId {
        let lap = self.lap.load(Relaxed);
        let tag = PENDING | u32::from(shard) << SHARD_SHIFT | lap << LAP_SHIFT | (at / 2) as u32;
        self.words[at].store(0, Relaxed);
        self.words[at + 1].store(tag as usize | n << 32, Release);
        if self.live.load(Relaxed) == 0 {
            self.tail.store(at, Relaxed);
        }
        self.live.store(self.live.load(Relaxed) + 1, Relaxed);
        self.head.store(at + entry_words(n), Relaxed);
        StackId(tag)
    }

    /// The frames of the entry at `at` if it is still `tag`'s, copied into `out` (any thread):
    /// their count.
    fn read(&self, at: usize, tag: u32, out: &mut [usize; MAX_DEPTH]) -> Option<usize> {
        let word = self.words.get(at + 1)?.load(Acquire);
        let n = word >> 32;
        if word as u32 != tag || n == 0 || n > MAX_DEPTH || at + 2 + n > RING_WORDS {
            return None;
        }
        for (o, w) in out.iter_mut().zip(&self.words[at + 2..at + 2 + n]) {
            *o = w.load(Relaxed);
        }
        fence(Acquire);
        (self.words[at + 1].load(Relaxed) == word).then_some(n)
    }
}
