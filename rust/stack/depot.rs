//! The stack depot: each distinct stack stored once, named by a `u32` id, lock-free.
//!
//! Storage is two `MAP_NORESERVE` mappings made once (only touched pages cost memory):
//! - an append-only arena of words; a stack at word offset `id` is `[len, frame0, frame1, ..]`
//!   and its id is that offset (`id >= 1`, so 0 stays "no stack"); space is claimed with an
//!   atomic bump and never reused, so ids and the slices of [`frames`] are valid forever;
//! - an open-addressing table of `AtomicU64` slots, `hash_tag << 32 | id`, 0 = empty, linear
//!   probing. Inserting writes the record first and then CASes an empty slot (Release), so a
//!   reader that sees the slot (Acquire) sees the frames. Two threads racing to insert the same
//!   new stack both write a record, one wins the slot and the other returns the winner's id,
//!   leaving its record unused (bounded by the number of such races).
//!
//! When the table is 3/4 full or the arena is exhausted, new stacks get `StackId(0)`.

use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use super::{StackId, MAX_DEPTH};

const TABLE_BITS: u32 = 22; // 4 Mi slots, 32 MiB of address space
const TABLE_SLOTS: usize = 1 << TABLE_BITS;
const TABLE_MASK: usize = TABLE_SLOTS - 1;
const MAX_ENTRIES: usize = TABLE_SLOTS / 4 * 3;
/// Arena size in words: 1 GiB of address space, about 7 million 16-frame stacks. Must stay
/// below 2^32 so offsets fit in a `u32` id.
const ARENA_WORDS: usize = 1 << 27;

static TABLE: AtomicPtr<AtomicU64> = AtomicPtr::new(ptr::null_mut());
static ARENA: AtomicPtr<usize> = AtomicPtr::new(ptr::null_mut());
/// Next free word of the arena; word 0 is never used so that no id is 0.
static BUMP: AtomicUsize = AtomicUsize::new(1);
static ENTRIES: AtomicUsize = AtomicUsize::new(0);

/// Maps the table and the arena if that has not happened yet. Returns false if mapping failed.
#[cold]
#[inline(never)]
pub(super) fn init() -> bool {
    fn map(bytes: usize) -> *mut u8 {
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            ptr::null_mut()
        } else {
            p.cast()
        }
    }
    fn install<T>(slot: &AtomicPtr<T>, bytes: usize) -> bool {
        if !slot.load(Ordering::Acquire).is_null() {
            return true;
        }
        let p = map(bytes);
        if p.is_null() {
            return false;
        }
        if slot
            .compare_exchange(
                ptr::null_mut(),
                p.cast(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // Another thread installed one first; give ours back.
            // SAFETY: `p` is our own mapping of `bytes` bytes, never shared.
            unsafe { libc::munmap(p.cast(), bytes) };
        }
        true
    }
    // The arena first: a reader that sees the table (checked first in `intern`) sees both.
    install(&ARENA, ARENA_WORDS * 8) && install(&TABLE, TABLE_SLOTS * 8)
}

/// Bumped when the module set changes: the same return addresses captured before and after are
/// different stacks (a plugin reloaded at the same address may be another build).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// A change of the module set (`dlopen`, `dlclose`): stacks interned from now on are new ones.
pub fn new_generation() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

fn hash(frames: &[usize]) -> u64 {
    // Four independent multiply-rotate lanes (the multiplies overlap instead of forming one
    // 30-step dependency chain), then a murmur3 finaliser so the low bits (slot index) and the
    // high bits (tag) both depend on every frame.
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let generation = GENERATION.load(Ordering::Relaxed).wrapping_mul(K);
    let mut lanes = [
        0x243f_6a88_85a3_08d3u64 ^ frames.len() as u64 ^ generation,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    ];
    let mut chunks = frames.chunks_exact(4);
    for c in &mut chunks {
        for (lane, &f) in lanes.iter_mut().zip(c) {
            *lane = (*lane ^ f as u64).wrapping_mul(K).rotate_left(31);
        }
    }
    for (lane, &f) in lanes.iter_mut().zip(chunks.remainder()) {
        *lane = (*lane ^ f as u64).wrapping_mul(K).rotate_left(31);
    }
    let mut h =
        lanes[0] ^ lanes[1].rotate_left(17) ^ lanes[2].rotate_left(34) ^ lanes[3].rotate_left(51);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The stored stack at `id`; the arena must be mapped and `id` published.
#[inline]
fn record(arena: *mut usize, id: u32) -> &'static [usize] {
    // SAFETY: `id` came from a published slot or a checked `frames` call, so `[id, id+1+len)`
    // was fully written before publication and the arena is never unmapped.
    unsafe {
        let base = arena.add(id as usize);
        core::slice::from_raw_parts(base.add(1), *base)
    }
}

/// Appends `frames` to the arena and returns its id, or 0 when the arena is full.
fn append(arena: *mut usize, frames: &[usize]) -> u32 {
    let words = frames.len() + 1;
    let off = BUMP.fetch_add(words, Ordering::Relaxed);
    if off + words > ARENA_WORDS {
        return 0;
    }
    // SAFETY: `[off, off+words)` was claimed by this thread alone and lies inside the arena.
    unsafe {
        let base = arena.add(off);
        base.write(frames.len());
        ptr::copy_nonoverlapping(frames.as_ptr(), base.add(1), frames.len());
    }
    off as u32
}

/// Returns the id of `frames`, storing them if they are new. Empty -> `StackId(0)`.
pub fn intern(frames: &[usize]) -> StackId {
    if frames.is_empty() || frames.len() > MAX_DEPTH {
        return StackId(0);
    }
    let mut table = TABLE.load(Ordering::Acquire);
    if table.is_null() {
        if !init() {
            return StackId(0);
        }
        table = TABLE.load(Ordering::Acquire);
    }
    let arena = ARENA.load(Ordering::Acquire);
    let h = hash(frames);
    let tag = h >> 32;
    let mut i = h as usize & TABLE_MASK;
    let mut mine = 0u32; // our appended record, once written
    for _ in 0..TABLE_SLOTS {
        // SAFETY: `i < TABLE_SLOTS` and the table is mapped for the process lifetime.
        let slot = unsafe { &*table.add(i) };
        let mut v = slot.load(Ordering::Acquire);
        if v == 0 {
            if ENTRIES.load(Ordering::Relaxed) >= MAX_ENTRIES {
                return StackId(0);
            }
            if mine == 0 {
                mine = append(arena, frames);
                if mine == 0 {
                    return StackId(0);
                }
            }
            match slot.compare_exchange(
                0,
                tag << 32 | mine as u64,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    ENTRIES.fetch_add(1, Ordering::Relaxed);
                    return StackId(mine);
                }
                Err(current) => v = current, // lost the race: maybe to the same stack
            }
        }
        if v >> 32 == tag && record(arena, v as u32) == frames {
            return StackId(v as u32);
        }
        i = (i + 1) & TABLE_MASK;
    }
    StackId(0)
}

/// The frames of `id`, innermost first; empty for `StackId(0)` or an id never handed out.
pub fn frames(id: StackId) -> &'static [usize] {
    let arena = ARENA.load(Ordering::Acquire);
    if id.0 == 0
        || arena.is_null()
        || id.0 as usize >= BUMP.load(Ordering::Acquire).min(ARENA_WORDS)
    {
        return &[];
    }
    // SAFETY: `id < BUMP <= ARENA_WORDS`, so the word is inside the mapped arena.
    let len = unsafe { *arena.add(id.0 as usize) };
    if len > MAX_DEPTH || id.0 as usize + 1 + len > ARENA_WORDS {
        return &[]; // not the start of a record: a forged id
    }
    record(arena, id.0)
}

/// Number of distinct stacks stored so far.
pub fn len() -> usize {
    ENTRIES.load(Ordering::Relaxed)
}

/// The id the next new stack will get at the earliest: ids grow with time, so a stack whose id
/// is below the watermark read at some moment was captured before it.
pub fn watermark() -> u32 {
    BUMP.load(Ordering::Acquire).min(ARENA_WORDS) as u32
}
