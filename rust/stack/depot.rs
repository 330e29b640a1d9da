//! The stack depot: stacks as a tree of (caller node, return address), so that stacks share their outer frames; lock-free.
//!
//! A stack `[f0, f1, .., fn]` (innermost first) is the node reached from the root by `fn`, then
//! `fn-1`, .., then `f0`; its id is that node's index (`>= 1`, so 0 stays "no stack"). Stacks
//! that differ only in their inner frames share every outer node, and a capture that repeats
//! the outer part of the previous one on its thread interns only the frames that changed (see
//! [`Interned`]). The nodes of yaml-cpp's test suite at depth 32: 450,000 for 174,000 distinct
//! stacks of 2.7 million frames (22 MiB as flat arrays, 6.9 MiB as nodes).
//!
//! Storage is two `MAP_NORESERVE` mappings made once (only touched pages cost memory):
//! - an append-only arena of 16-byte nodes (the return address in 48 bits, the parent and the
//!   next node in 24 bits each, and a word heading the node's own children), claimed with an
//!   atomic bump and never reused, so ids stay valid forever; only the children word changes
//!   once a node is published. A capturing thread claims ids up to [`CLAIM_BATCH`] at a time
//!   ([`Claims`]): the bump is a locked add on a line every thread shares, and a locked
//!   instruction waits for every store the allocation made before it (yaml-cpp's suite adds
//!   450,000 nodes: 900,000 locked instructions with one claim per node, 464,000 now);
//! - a hash of `AtomicU32` chain heads indexed by (parent, return address), for the children of
//!   wide parents only.
//!
//! A node's first [`LIST_MAX`] children hang from the node itself, linked by `next`: adding a
//! child to a node that this thread just created or read costs no cache miss (its line is hot,
//! and a fresh node has no children to search), where a random bucket of a 2 MiB hash cost one
//! on most of the 450,000 new nodes of yaml-cpp's suite. Children past the list go to the hash
//! (`next` then links the bucket's chain); a lookup searches the list and, only when it is
//! full, the hash. Both heads are [`Chain`] words: a first node, a filter of what the chain
//! holds (a lookup whose mark is missing reads no node) and for a list its length. A new node
//! is written first and then pushed with a CAS of the head (Release), so a reader that sees the
//! head (Acquire) sees the node. A CAS that fails rescans only the nodes pushed since, and a
//! list fills exactly once before the hash gets any of its node's children, so no child is
//! ever added twice: each (parent, return address) has one node, and each stack one id.
//!
//! Nothing is ever full but the arena (16 Mi nodes, some 6 million distinct stacks; less in a
//! process under an address-space limit, see [`ARENA_SIZES`]), after which new stacks get
//! `StackId(0)`, as does a stack with a return address at or above 2^48 (user-space code lies
//! below 2^47).
//!
//! Generations: when the module set changes (`dlopen`, `dlclose`), the same return addresses may
//! be other code (a plugin reloaded at the same address), so stacks interned from then on hang
//! below a root node of their own (a marker no code address can equal), and their ids all lie
//! above the [`watermark`] read at the change.

use core::ops::Deref;
use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use super::{StackId, MAX_DEPTH};
use crate::sys::map_once;

/// 64 Ki chain heads, 256 KiB of address space: the hash holds only the children of nodes with
/// more than [`LIST_MAX`] of them (70,000 of the 450,000 nodes of yaml-cpp's suite).
const BUCKET_BITS: u32 = 16;
const BUCKETS: usize = 1 << BUCKET_BITS;
/// Node ids a capturing thread claims at once, at most: its first claim takes one and each
/// next one twice as many, so that a thread that adds a few nodes (one of 20,000 short-lived
/// threads) leaves at most as many ids unused.
const CLAIM_BATCH: u32 = 32;

/// Counts the watermarks read: ids a thread claimed before a watermark was read are below it,
/// and are not used for nodes added after it (see [`Claims`]).
static CLAIM_EPOCH: AtomicU32 = AtomicU32::new(0);

/// Node ids a thread claimed and has not used yet: `next..end`, claimed in watermark epoch
/// `epoch`. Ids claimed and never used (at thread exit, at a new epoch) are holes in the
/// arena: zeroed nodes no chain links to, at most as many as the thread's nodes.
pub(super) struct Claims {
    next: u32,
    end: u32,
    epoch: u32,
    /// Ids the next claim from the bump takes, and the most it may grow to.
    batch: u32,
    most: u32,
    /// Ids handed out for new nodes so far (wrapping): how many nodes the thread added.
    used: u32,
}

impl Claims {
    /// A capturing thread's claims.
    pub(super) const EMPTY: Claims = Claims {
        next: 0,
        end: 0,
        epoch: 0,
        batch: 1,
        most: CLAIM_BATCH,
        used: 0,
    };
    /// One id at a time, for a caller that keeps no claims between calls.
    const SINGLE: Claims = Claims {
        most: 1,
        ..Claims::EMPTY
    };

    /// An unused id for a new node; `None` when the arena is full.
    #[inline]
    fn claim(&mut self) -> Option<u32> {
        let epoch = CLAIM_EPOCH.load(Ordering::Relaxed);
        if epoch != self.epoch {
            // The ids kept back are left unused, and claims start small again: a thread leaves
            // at most as many unused as it used since (a plugin reloaded in a loop changes the
            // epoch at every load).
            (self.end, self.batch, self.epoch) = (self.next, 1, epoch);
        }
        if self.next == self.end {
            let base = BUMP.fetch_add(self.batch as usize, Ordering::Relaxed);
            let capacity = CAPACITY.load(Ordering::Acquire);
            if base >= capacity {
                return None; // nothing kept back: `next == end` stays
            }
            (self.next, self.end) = (
                base as u32,
                (base + self.batch as usize).min(capacity) as u32,
            );
            self.batch = (self.batch * 2).min(self.most);
        }
        self.next += 1;
        self.used = self.used.wrapping_add(1);
        Some(self.next - 1)
    }

    /// `id`, just claimed, was not used: the next claim gets it again.
    fn unclaim(&mut self, id: u32) {
        self.used = self.used.wrapping_sub(1);
        if id + 1 == self.next {
            self.next = id;
        }
    }
}

/// Arena size in nodes: 256 MiB of address space. Indexes must fit a node's 24-bit links.
const ARENA_NODES: usize = 1 << 24;
/// The arena sizes tried in turn, in nodes: 256 MiB of address space, then 64 and 16 for a
/// process under an address-space limit (`ulimit -v`), whose stacks would otherwise all be lost.
const ARENA_SIZES: [usize; 3] = [ARENA_NODES, ARENA_NODES / 4, ARENA_NODES / 16];

/// A node: the return address (bits 0..48), the parent's index and the next node of its chain
/// (24 bits each) packed into three words that never change once published, and the head of its
/// children list.
#[repr(C)]
struct Node {
    fields: [u32; 3],
    children: AtomicU32,
}

/// Return addresses a node can hold: below 2^48.
const RA_BITS: u32 = 48;

fn pack(ra: usize, parent: u32, next: u32) -> [u32; 3] {
    let ra = ra as u64;
    [
        ra as u32,
        (ra >> 32) as u32 & 0xffff | parent << 16,
        parent >> 16 | next << 8,
    ]
}

static BUCKETS_PTR: AtomicPtr<AtomicU32> = AtomicPtr::new(ptr::null_mut());
static ARENA: AtomicPtr<Node> = AtomicPtr::new(ptr::null_mut());
/// Next free node of the arena; node 0 is the root, holding no frame but the root's children.
static BUMP: AtomicUsize = AtomicUsize::new(1);
/// Nodes the arena holds: stored by the thread whose mapping became the arena, after it did (so
/// never more than that mapping holds); 0 until then, when a node claimed counts as past it.
static CAPACITY: AtomicUsize = AtomicUsize::new(0);

/// Maps the buckets and the arena if that has not happened yet. Returns false if mapping failed.
#[cold]
#[inline(never)]
pub(super) fn init() -> bool {
    // The arena first: a reader that sees the buckets (checked first in `child`) sees both.
    map_arena() && !map_once(&BUCKETS_PTR, BUCKETS * 4).is_null()
}

/// Maps the arena, the largest of [`ARENA_SIZES`] the address space allows, unless another
/// thread did.
fn map_arena() -> bool {
    // Under an address-space limit, at most a sixteenth of it (the smallest size in any case).
    let room = crate::sys::address_space_limit().map_or(usize::MAX, |limit| limit / 16);
    let smallest = ARENA_SIZES[ARENA_SIZES.len() - 1];
    let fitting = ARENA_SIZES
        .into_iter()
        .filter(|&nodes| nodes == smallest || nodes * size_of::<Node>() <= room);
    for nodes in fitting {
        if !ARENA.load(Ordering::Acquire).is_null() {
            return true;
        }
        let bytes = nodes * size_of::<Node>();
        let mine = crate::sys::map_unreserved(bytes).cast::<Node>();
        if mine.is_null() {
            continue;
        }
        if crate::sys::publish_once(&ARENA, mine, bytes) == mine {
            CAPACITY.store(nodes, Ordering::Release);
        }
        return true;
    }
    false
}

/// Nodes handed out so far, the root included (1 before the arena is mapped).
fn published() -> usize {
    BUMP.load(Ordering::Acquire)
        .min(CAPACITY.load(Ordering::Acquire).max(1))
}

/// Bits of a chain head that hold the chain's first node; the ones above hold the chain's
/// filter (and a list's length).
const FIRST: u32 = (1 << 24) - 1;
const _: () = assert!(ARENA_NODES <= 1 << 24, "node ids must fit a 24-bit link");

/// Children a node holds in its own list; the rest go to the hash.
const LIST_MAX: u32 = 4;
/// A children word: first child (bits 0..24), length (24..27) and a 5-bit filter (27..32).
const LIST_STEP: u32 = 1 << 24;
const LIST_LENGTH: u32 = 7 << 24;
const _: () = assert!(LIST_MAX * LIST_STEP <= LIST_LENGTH);

/// How a chain's head word is laid out: what a push adds to it besides the node and its mark.
#[derive(Clone, Copy)]
struct Chain {
    /// Added to the head word by each push: a list's length unit; 0 for a bucket.
    step: u32,
    /// The mark of the node looked up (or pushed) in the head's filter.
    mark: u32,
}

impl Chain {
    /// A node's own children list, for a child whose (parent, return address) hash is `hash`.
    fn list(hash: u64) -> Chain {
        Chain {
            step: LIST_STEP,
            mark: 1 << (27 + (hash >> 32) % 5) as u32,
        }
    }

    /// A bucket of the hash (an 8-bit filter above the first node).
    fn bucket(hash: u64) -> Chain {
        Chain {
            step: 0,
            mark: 1 << (24 + (hash >> 40) % 8) as u32,
        }
    }

    /// A list that holds [`LIST_MAX`] children takes no more.
    fn full(self, word: u32) -> bool {
        self.step != 0 && word & LIST_LENGTH == LIST_MAX * LIST_STEP
    }
}

fn hash_of(parent: u32, ra: usize) -> u64 {
    (ra as u64 ^ u64::from(parent).rotate_left(40)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn bucket_of(hash: u64) -> usize {
    (hash >> (64 - BUCKET_BITS)) as usize
}

/// Node `id`; the arena must be mapped and `id` published, checked against `BUMP` or the root.
#[inline]
fn node_at(arena: *mut Node, id: u32) -> &'static Node {
    // SAFETY: `id` came from a chain head (published with Release after its node was written),
    // was checked to be below BUMP or is the root; the arena is mapped for the process lifetime
    // and a published node's fields are never written again (its children word is atomic).
    unsafe { &*arena.add(id as usize) }
}

/// A node's (return address, parent, next) fields.
fn unpack([low, middle, high]: [u32; 3]) -> (usize, u32, u32) {
    let ra = u64::from(low) | u64::from(middle & 0xffff) << 32;
    (ra as usize, middle >> 16 | (high & 0xff) << 16, high >> 8)
}

/// The node of return address `ra` called from the stack `parent` (0: `ra` is the outermost
/// frame), added if new with an id from `claims`; `StackId(0)` when the depot is full or
/// unmapped, or `ra` is 0 or does not fit.
fn child(parent: StackId, ra: usize, claims: &mut Claims) -> StackId {
    if ra == 0 || ra as u64 >> RA_BITS != 0 {
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
    let hash = hash_of(parent.0, ra);
    let mut mine = 0;
    let list = &node_at(arena, parent.0).children;
    let found = find_or_push(
        arena,
        list,
        Chain::list(hash),
        parent.0,
        ra,
        &mut mine,
        claims,
    )
    .or_else(|| {
        // SAFETY: the index is below BUCKETS and the array is mapped for the process lifetime.
        let head = unsafe { &*buckets.add(bucket_of(hash)) };
        find_or_push(
            arena,
            head,
            Chain::bucket(hash),
            parent.0,
            ra,
            &mut mine,
            claims,
        )
    })
    .unwrap_or(StackId(0));
    if mine != 0 && found.0 != mine {
        claims.unclaim(mine); // another thread added the node first
    }
    found
}

/// Searches the chain headed by `head` for the node of (`parent`, `ra`) and pushes node `mine`
/// (claimed first if 0) there if it is absent; `None` if absent from a full list.
#[inline]
fn find_or_push(
    arena: *mut Node,
    head: &AtomicU32,
    chain: Chain,
    parent: u32,
    ra: usize,
    mine: &mut u32,
    claims: &mut Claims,
) -> Option<StackId> {
    let mut word = head.load(Ordering::Acquire);
    let mut scanned = 0; // the first node of the chain already searched
    loop {
        let first = word & FIRST;
        // Marks are only ever added, so a missing one rules out the whole chain.
        let mut at = if word & chain.mark != 0 {
            first
        } else {
            scanned
        };
        while at != scanned {
            let (node_ra, node_parent, next) = unpack(node_at(arena, at).fields);
            if node_ra == ra && node_parent == parent {
                return Some(StackId(at));
            }
            at = next;
        }
        if chain.full(word) {
            return None;
        }
        if *mine == 0 {
            let Some(claimed) = claims.claim() else {
                return Some(StackId(0));
            };
            *mine = claimed;
        }
        let fresh = Node {
            fields: pack(ra, parent, first),
            children: AtomicU32::new(0),
        };
        // SAFETY: node `mine` was claimed by this thread alone and is not published yet.
        unsafe { arena.add(*mine as usize).write(fresh) };
        let pushed = *mine | ((word & !FIRST) + chain.step) | chain.mark;
        match head.compare_exchange(word, pushed, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(StackId(*mine)),
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
    let mut claims = Claims::SINGLE;
    let root = child(
        StackId(0),
        GENERATION_MARK | generation as usize,
        &mut claims,
    );
    GENERATION_ROOT.store(root.0, Ordering::Release);
}

/// Where the stacks of the current generation start.
pub(super) fn generation_root() -> StackId {
    StackId(GENERATION_ROOT.load(Ordering::Acquire))
}

/// The id the next new node will get at the earliest: ids grow with time, so a stack whose id
/// is below the watermark read at some moment was captured before it. Ids threads claimed
/// before are not used after it: each thread's next claim sees the epoch changed.
pub fn watermark() -> u32 {
    let mark = published() as u32;
    CLAIM_EPOCH.fetch_add(1, Ordering::SeqCst);
    mark
}

/// Returns the id of `frames` (innermost first), storing the nodes that are new.
/// Empty -> `StackId(0)`.
pub fn intern(frames: &[usize]) -> StackId {
    if frames.is_empty() || frames.len() > MAX_DEPTH {
        return StackId(0);
    }
    let mut id = generation_root();
    let mut claims = Claims::SINGLE;
    for &ra in frames.iter().rev() {
        id = child(id, ra, &mut claims);
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
/// depot's nodes are spread over megabytes, and a lookup there reads the parent's node and
/// maybe its children or a bucket, each a likely cache miss.
pub(super) struct Interned {
    /// The last stack's return addresses, outermost first.
    outer_first: [usize; MAX_DEPTH],
    /// `nodes[i]`: the node of the stack whose frames are `outer_first[..=i]`.
    nodes: [u32; MAX_DEPTH],
    len: usize,
    /// The root the nodes hang from (a generation's; see [`new_generation`]).
    root: u32,
    recent: [Recent; RECENT],
    claims: Claims,
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
        claims: Claims::EMPTY,
    };

    /// [`child`], answered from the recent children when it can be.
    #[inline]
    pub(super) fn child(&mut self, parent: StackId, ra: usize) -> StackId {
        let slot = &mut self.recent[bucket_of(hash_of(parent.0, ra)) % RECENT];
        if slot.ra == ra && slot.parent == parent.0 && slot.node != 0 {
            return StackId(slot.node);
        }
        let id = child(parent, ra, &mut self.claims);
        *slot = Recent {
            ra,
            parent: parent.0,
            node: id.0,
        };
        id
    }

    /// Nodes this thread has added to the depot so far (wrapping).
    pub(super) fn nodes_added(&self) -> u32 {
        self.claims.used
    }

    /// The nodes of the last stack's outer parts, outermost first (`nodes()[i]` is the stack
    /// of its `i + 1` outermost frames), and the root they hang from; none after a failure.
    pub(super) fn nodes(&self) -> (&[u32], u32) {
        (&self.nodes[..self.len], self.root)
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
    if arena.is_null() || id.0 as usize >= published() {
        return out;
    }
    let mut at = id.0;
    while at != 0 && out.len < MAX_DEPTH {
        let (ra, parent, _) = unpack(node_at(arena, at).fields);
        // A published node holds a return address (0 never is one) and a parent handed out
        // before it (though its id may be higher: threads claim ids in batches); anything else
        // is not a published node, such as a claimed id never used.
        if ra == 0 || parent as usize >= published() {
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
    published() - 1
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
                    assert_eq!(unpack(pack(ra, parent, next)), (ra, parent, next));
                }
            }
        }
    }

    #[test]
    fn a_thread_keeps_back_at_most_as_many_ids_as_it_used() {
        let mut claims = Claims::EMPTY;
        let mut last = None;
        for used in 1..=200u32 {
            let id = claims.claim().expect("the arena has room");
            assert!(last.is_none_or(|l| id != l), "an id claimed twice");
            last = Some(id);
            let kept_back = claims.end - claims.next;
            assert!(
                kept_back < used && kept_back < CLAIM_BATCH,
                "{kept_back} after {used}"
            );
        }
        // A watermark read leaves the ids kept back unused and starts the claims small again.
        let _ = watermark();
        let id = claims.claim().unwrap();
        assert_eq!(
            claims.end - claims.next,
            0,
            "{id}: kept back after a watermark"
        );
        // An id given back right after its claim is the next one claimed.
        let id = claims.claim().unwrap();
        claims.unclaim(id);
        assert_eq!(claims.claim(), Some(id));
    }

    #[test]
    fn a_return_address_a_node_cannot_hold_gives_no_stack() {
        let mut claims = Claims::SINGLE;
        assert_eq!(child(StackId(0), 1 << RA_BITS, &mut claims), StackId(0));
        assert_eq!(child(StackId(0), 0, &mut claims), StackId(0));
        assert_eq!(intern(&[0x1000, usize::MAX]), StackId(0));
    }
}
