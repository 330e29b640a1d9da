//! The stack depot: stacks as a tree of (caller node, return address), so that stacks share their outer frames; lock-free.
//!
//! A stack `[f0, f1, .., fn]` (innermost first) is the node reached from the root by `fn`, then
//! `fn-1`, .., then `f0`; its id is that node's index (`>= 1`, so 0 stays "no stack"). Stacks
//! that differ only in their inner frames share every outer node, and a capture that repeats
//! the outer part of the previous one on its thread interns only the frames that changed (see
//! [`Interned`]). The nodes of yaml-cpp's test suite at depth 32: 450,000 for 174,000 distinct
//! stacks of 2.7 million frames (22 MiB as flat arrays, 5.2 MiB as nodes).
//!
//! Storage is two `MAP_NORESERVE` mappings made once (only touched pages cost memory):
//! - an append-only arena of 12-byte nodes (the return address in 48 bits, the parent and the
//!   next node of the chain in 24 bits each), claimed with an atomic bump and never reused or
//!   changed once published, so ids stay valid forever;
//! - a bucket array of `AtomicU32` chain heads indexed by a hash of (parent, return address),
//!   each with a 6-bit filter of what its chain holds; `next` links a node to the rest of its
//!   bucket's chain. A new node is written first and then
//!   pushed with a CAS of the bucket head (Release), so a reader that sees the head (Acquire)
//!   sees the node. A CAS that fails rescans only the nodes pushed since, so no child is ever
//!   added twice: each (parent, return address) has one node, and each stack one id.
//!
//! Chains grow past one node per bucket only beyond 512 Ki nodes; nothing is ever full but the
//! arena (16 Mi nodes, some 6 million distinct stacks), after which new stacks get `StackId(0)`,
//! as does a stack with a return address at or above 2^48 (user-space code lies below 2^47).
//!
//! Generations: when the module set changes (`dlopen`, `dlclose`), the same return addresses may
//! be other code (a plugin reloaded at the same address), so stacks interned from then on hang
//! below a root node of their own (a marker no code address can equal), and their ids all lie
//! above the [`watermark`] read at the change.

use core::ops::Deref;
use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use super::{map_once, StackId, MAX_DEPTH};

const BUCKET_BITS: u32 = 19; // 512 Ki chain heads, 2 MiB of address space
const BUCKETS: usize = 1 << BUCKET_BITS;
/// Arena size in nodes: 192 MiB of address space. Indexes must fit a node's 24-bit links.
const ARENA_NODES: usize = 1 << 24;

/// A node: the return address (bits 0..48), the parent's index and the next node of the chain
/// above it (24 bits each), packed into three words; 12 bytes, where plain fields took 16.
type Node = [u32; 3];

/// Return addresses a node can hold: below 2^48.
const RA_BITS: u32 = 48;

fn pack(ra: usize, parent: u32, next: u32) -> Node {
    let ra = ra as u64;
    [
        ra as u32,
        (ra >> 32) as u32 & 0xffff | parent << 16,
        parent >> 16 | next << 8,
    ]
}

static BUCKETS_PTR: AtomicPtr<AtomicU32> = AtomicPtr::new(ptr::null_mut());
static ARENA: AtomicPtr<Node> = AtomicPtr::new(ptr::null_mut());
/// Next free node of the arena; node 0 is the root and never stored.
static BUMP: AtomicUsize = AtomicUsize::new(1);

/// Maps the buckets and the arena if that has not happened yet. Returns false if mapping failed.
#[cold]
#[inline(never)]
pub(super) fn init() -> bool {
    // The arena first: a reader that sees the buckets (checked first in `child`) sees both.
    !map_once(&ARENA, ARENA_NODES * size_of::<Node>()).is_null()
        && !map_once(&BUCKETS_PTR, BUCKETS * 4).is_null()
}

/// Bits of a bucket word that hold the chain's first node (ids are below `ARENA_NODES`); the six
/// above are a filter of the chain: the OR of each node's [`chain_mark`].
const HEAD_BITS: u32 = 26;
const HEAD: u32 = (1 << HEAD_BITS) - 1;
const _: () = assert!(
    ARENA_NODES <= 1 << HEAD_BITS,
    "node ids must fit below the marks"
);

fn hash_of(parent: u32, ra: usize) -> u64 {
    (ra as u64 ^ u64::from(parent).rotate_left(40)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn bucket_of(parent: u32, ra: usize) -> usize {
    (hash_of(parent, ra) >> (64 - BUCKET_BITS)) as usize
}

/// The bit a node of (parent, return address) sets in its bucket word: a lookup whose bit is
/// not set there knows the chain lacks its node without reading any (each read is a cache miss
/// in a tree of hundreds of thousands of nodes, and most lookups are of new nodes).
fn chain_mark(parent: u32, ra: usize) -> u32 {
    1 << (HEAD_BITS + (hash_of(parent, ra) % 6) as u32)
}

/// A published node; the arena must be mapped and `id` published or checked against `BUMP`.
#[inline]
fn node(arena: *mut Node, id: u32) -> (usize, u32, u32) {
    // SAFETY: `id` came from a bucket chain (published with Release after its node was written)
    // or was checked to be below BUMP; published nodes are never written again.
    let [low, middle, high] = unsafe { arena.add(id as usize).read() };
    let ra = u64::from(low) | u64::from(middle & 0xffff) << 32;
    (ra as usize, middle >> 16 | (high & 0xff) << 16, high >> 8)
}

/// The node of return address `ra` called from the stack `parent` (0: `ra` is the outermost
/// frame), added if new; `StackId(0)` when the depot is full or unmapped, or `ra` does not fit.
pub(super) fn child(parent: StackId, ra: usize) -> StackId {
    if ra as u64 >> RA_BITS != 0 {
        return StackId(0);
    }
    let mut buckets = BUCKETS_PTR.load(Ordering::Acquire);
    if buckets.is_null() {
        if !init() {
            return StackId(0);
        }
        buckets = BUCKETS_PTR.load(Ordering::Acquire);
    }
    let arena = ARENA.load(Ordering::Acquire);
    // SAFETY: the index is below BUCKETS and the array is mapped for the process lifetime.
    let head = unsafe { &*buckets.add(bucket_of(parent.0, ra)) };
    let mark = chain_mark(parent.0, ra);
    let mut word = head.load(Ordering::Acquire);
    let mut scanned = 0; // the head of the chain already searched
    let mut mine = 0u32;
    loop {
        let first = word & HEAD;
        // Marks are only ever added, so a missing one rules out the whole chain.
        let mut at = if word & mark != 0 { first } else { scanned };
        while at != scanned {
            let (node_ra, node_parent, next) = node(arena, at);
            if node_ra == ra && node_parent == parent.0 {
                return StackId(at);
            }
            at = next;
        }
        if mine == 0 {
            let claimed = BUMP.fetch_add(1, Ordering::Relaxed);
            if claimed >= ARENA_NODES {
                return StackId(0);
            }
            mine = claimed as u32;
        }
        // SAFETY: node `mine` was claimed by this thread alone and is not published yet.
        unsafe {
            arena.add(mine as usize).write(pack(ra, parent.0, first));
        }
        let pushed = mine | (word & !HEAD) | mark;
        match head.compare_exchange(word, pushed, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return StackId(mine),
            // Someone pushed meanwhile, maybe this very node: search what they pushed.
            Err(now) => (scanned, word) = (first, now),
        }
    }
}

/// The return address of a generation's root node (with the generation's number below): above
/// every user-space code address, below 2^48.
const GENERATION_MARK: usize = 0xffff << 32;

/// The current generation's number, and its root node (0: the first generation, rooted at 0).
static GENERATION: AtomicU32 = AtomicU32::new(0);
static GENERATION_ROOT: AtomicU32 = AtomicU32::new(0);

/// A change of the module set (`dlopen`, `dlclose`): stacks interned from now on are new ones.
pub fn new_generation() {
    let generation = GENERATION.fetch_add(1, Ordering::AcqRel) + 1;
    let root = child(StackId(0), GENERATION_MARK | generation as usize);
    GENERATION_ROOT.store(root.0, Ordering::Release);
}

/// Where the stacks of the current generation start.
fn generation_root() -> StackId {
    StackId(GENERATION_ROOT.load(Ordering::Acquire))
}

/// The id the next new node will get at the earliest: ids grow with time, so a stack whose id
/// is below the watermark read at some moment was captured before it.
pub fn watermark() -> u32 {
    BUMP.load(Ordering::Acquire).min(ARENA_NODES) as u32
}

/// Returns the id of `frames` (innermost first), storing the nodes that are new.
/// Empty -> `StackId(0)`.
pub fn intern(frames: &[usize]) -> StackId {
    if frames.is_empty() || frames.len() > MAX_DEPTH {
        return StackId(0);
    }
    let mut id = generation_root();
    for &ra in frames.iter().rev() {
        id = child(id, ra);
        if id.0 == 0 {
            break;
        }
    }
    id
}

/// Children a thread looked up lately, by a hash of (parent, return address): 256 of them, 4
/// KiB of its thread-local state.
const RECENT: usize = 256;

/// One child a thread looked up: nodes never change, so the answer stays true.
#[derive(Clone, Copy)]
struct Recent {
    ra: usize,
    parent: u32,
    node: u32,
}

/// A thread's last interned stack and the node of each of its outer parts, so that the next
/// capture interns only the frames in front of the outer part the two stacks share. Kept
/// outermost first, so that the shared part stays where it is and only the new frames are
/// written. The frames in front are looked up in the thread's recent children first: the
/// depot's buckets and nodes are spread over megabytes, and a lookup there is two cache misses
/// (40% of the tracker's time on yaml-cpp's test suite before this cache).
pub(super) struct Interned {
    /// The last stack's return addresses, outermost first.
    outer_first: [usize; MAX_DEPTH],
    /// `nodes[i]`: the node of the stack whose frames are `outer_first[..=i]`.
    nodes: [u32; MAX_DEPTH],
    len: usize,
    /// The root the nodes hang from (a generation's; see [`new_generation`]).
    root: u32,
    recent: [Recent; RECENT],
}

impl Interned {
    pub(super) const EMPTY: Interned = Interned {
        outer_first: [0; MAX_DEPTH],
        nodes: [0; MAX_DEPTH],
        len: 0,
        root: 0,
        recent: [Recent {
            ra: 0,
            parent: 0,
            node: 0,
        }; RECENT],
    };

    /// [`child`], answered from the recent children when it can be.
    #[inline]
    fn child(&mut self, parent: StackId, ra: usize) -> StackId {
        let slot = &mut self.recent[bucket_of(parent.0, ra) % RECENT];
        if slot.ra == ra && slot.parent == parent.0 && slot.node != 0 {
            return StackId(slot.node);
        }
        let id = child(parent, ra);
        *slot = Recent {
            ra,
            parent: parent.0,
            node: id.0,
        };
        id
    }

    /// The id of `frames` (innermost first, at most [`MAX_DEPTH`]), which become the last stack.
    pub(super) fn intern(&mut self, frames: &[usize]) -> StackId {
        let n = frames.len().min(MAX_DEPTH);
        if n == 0 {
            return StackId(0);
        }
        let root = generation_root();
        if root.0 != self.root {
            self.len = 0; // the module set changed: nothing of the last stack is shared
            self.root = root.0;
        }
        // Equal outer frames are equal paths from the root: their nodes are the same.
        let outer = frames[..n].iter().rev();
        let shared = outer
            .clone()
            .zip(&self.outer_first[..self.len])
            .take_while(|(a, b)| a == b)
            .count();
        let mut id = match shared {
            0 => root,
            k => StackId(self.nodes[k - 1]),
        };
        for (i, &ra) in outer.enumerate().skip(shared) {
            id = self.child(id, ra);
            if id.0 == 0 {
                self.len = 0; // the depot is full: remember nothing
                return id;
            }
            self.outer_first[i] = ra;
            self.nodes[i] = id.0;
        }
        self.len = n;
        id
    }
}

/// The return addresses of a stored stack, innermost first.
#[derive(Clone, Copy)]
pub struct Frames {
    frames: [usize; MAX_DEPTH],
    len: usize,
}

impl Deref for Frames {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.frames[..self.len]
    }
}

impl core::fmt::Debug for Frames {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        (**self).fmt(f)
    }
}

impl PartialEq<&[usize]> for Frames {
    fn eq(&self, other: &&[usize]) -> bool {
        **self == **other
    }
}

impl<const N: usize> PartialEq<&[usize; N]> for Frames {
    fn eq(&self, other: &&[usize; N]) -> bool {
        **self == other[..]
    }
}

/// The frames of `id`, innermost first; empty for `StackId(0)` or an id never handed out.
pub fn frames(id: StackId) -> Frames {
    let mut out = Frames {
        frames: [0; MAX_DEPTH],
        len: 0,
    };
    let arena = ARENA.load(Ordering::Acquire);
    if arena.is_null() || id.0 as usize >= BUMP.load(Ordering::Acquire).min(ARENA_NODES) {
        return out;
    }
    let mut at = id.0;
    while at != 0 && out.len < MAX_DEPTH {
        let (ra, parent, _) = node(arena, at);
        // A parent always comes before its children; anything else is not a published node.
        if parent >= at {
            return Frames { len: 0, ..out };
        }
        if ra & GENERATION_MARK == GENERATION_MARK {
            break; // the root of a generation, no frame
        }
        out.frames[out.len] = ra;
        out.len += 1;
        at = parent;
    }
    out
}

/// Number of nodes stored so far (distinct stacks and the outer parts they share).
pub fn len() -> usize {
    BUMP.load(Ordering::Relaxed).min(ARENA_NODES) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_keeps_every_bit_of_its_fields() {
        let addresses = [
            0,
            1,
            0x5555_5555_1234,
            0x7fff_ffff_ffff,
            GENERATION_MARK | 7,
        ];
        let links = [0, 1, 0xffff, 0x1_0000, 0xab_cdef, ARENA_NODES as u32 - 1];
        for ra in addresses {
            for parent in links {
                for next in links {
                    let mut arena = [pack(ra, parent, next)];
                    assert_eq!(node(arena.as_mut_ptr(), 0), (ra, parent, next));
                }
            }
        }
    }

    #[test]
    fn a_return_address_a_node_cannot_hold_gives_no_stack() {
        assert_eq!(child(StackId(0), 1 << RA_BITS), StackId(0));
        assert_eq!(intern(&[0x1000, usize::MAX]), StackId(0));
    }
}
