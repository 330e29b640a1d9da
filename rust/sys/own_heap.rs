//! The tracker's own memory: a small lock-free allocator over the tracker's own mappings, which a
//! signal handler (or a `fork` from one) may use whatever its thread was doing when interrupted.
//!
//! Why not glibc's: a handler that lands on a thread inside glibc's `malloc` or `free` (a thread
//! exiting frees its tcache there, arena lock held) and then allocates, or forks (glibc's `fork`
//! takes every arena's lock), waits for its own thread forever. With the tracker's memory from
//! here, a program whose allocations are all tracked never enters glibc's allocator at all.
//! Why not a crate's: the allocators on crates.io take a lock (a spin lock included), which the
//! interrupted code may hold.
//!
//! Blocks up to [`LARGEST_CLASS`] bytes come from size classes (16-byte steps to 128, then four
//! a doubling), each a lock-free stack of free blocks; a fresh one is carved from a 64 MiB
//! `MAP_NORESERVE` chunk by one atomic add. Freed class blocks are kept for reuse, never
//! unmapped (so a stale read in [`pop`] always lands in mapped memory). Larger blocks are
//! mapped alone and unmapped when freed. Each block has 16 bytes in front of the pointer
//! handed out: where its memory starts, and its class (or its mapping's length).

use super::{map_pages, map_unreserved, unmap_pages, within_limit, PAGE_SIZE};
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// What each block keeps in front of its pointer: where its memory starts, and its class or
/// mapping length.
const PREFIX: usize = 16;
/// The largest class's room; larger blocks are mapped alone.
const LARGEST_CLASS: usize = 256 * 1024;
/// 8 classes of 16-byte steps up to 128, then 4 per doubling from 128 to 256 KiB (11 doublings).
const CLASSES: usize = 8 + 4 * 11;
/// The address space each chunk reserves (only touched pages cost memory).
const CHUNK_BYTES: usize = 64 << 20;
/// A free list's head: the top block's address in the low 48 bits (user addresses are below
/// 2^47 on x86-64 and 2^48 on AArch64), a count of changes in the top 16, so that a `pop`
/// whose block was taken and given back meanwhile (ABA) fails its exchange and retries.
const ADDRESS_BITS: u32 = 48;
const ADDRESS_MASK: u64 = (1 << ADDRESS_BITS) - 1;

static FREE_LISTS: [AtomicU64; CLASSES] = [const { AtomicU64::new(0) }; CLASSES];

/// The start of the chunk blocks are carved from now; its first words are a [`Chunk`].
static CURRENT_CHUNK: AtomicPtr<Chunk> = AtomicPtr::new(core::ptr::null_mut());

/// Every chunk published so far, the first [`KNOWN_CHUNKS`] of them (64 MiB each, so 4 GiB of
/// the tracker's own memory and its blocks): [`holds`] looks there.
const KNOWN_CHUNKS: usize = 64;
static CHUNKS: [AtomicPtr<Chunk>; KNOWN_CHUNKS] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; KNOWN_CHUNKS];
static CHUNKS_KNOWN: AtomicUsize = AtomicUsize::new(0);

struct Chunk {
    /// The address the next carved block starts at (past `end` once the chunk is used up).
    next: AtomicUsize,
    end: usize,
}

/// The class of a block of `bytes` (at least 1) and its room, or `None` above [`LARGEST_CLASS`].
fn class_of(bytes: usize) -> Option<(usize, usize)> {
    if bytes <= 128 {
        let class = bytes.max(1).div_ceil(16) - 1;
        return Some((class, (class + 1) * 16));
    }
    if bytes > LARGEST_CLASS {
        return None;
    }
    // 2^power < bytes <= 2^(power+1), power >= 7: four steps of 2^(power-2).
    let power = (bytes - 1).ilog2() as usize;
    let step = 1 << (power - 2);
    let steps = (bytes - (1 << power)).div_ceil(step);
    Some((8 + 4 * (power - 7) + steps - 1, (1 << power) + steps * step))
}

/// `size` bytes aligned to `align` (a power of two), or null when the system has no memory.
pub fn allocate(size: usize, align: usize) -> *mut u8 {
    allocate_with(size, align, false)
}

/// [`allocate`], and `zeroed`: the bytes zeroed (a block mapped alone is zero already, so its
/// pages stay untouched).
fn allocate_with(size: usize, align: usize, zeroed: bool) -> *mut u8 {
    let align = align.max(16);
    // Room for the prefix and for moving the pointer up to `align`: a block starts 16-aligned.
    let Some(bytes) = size.checked_add(align) else {
        return core::ptr::null_mut();
    };
    let (start, tag) = match class_of(bytes) {
        Some((class, room)) => match pop(class).or_else(|| carve(room)) {
            Some(start) => (start, class),
            None => match larger_free_block(class) {
                Some(found) => found,
                None => return core::ptr::null_mut(),
            },
        },
        None => {
            let Some(len) = bytes.checked_next_multiple_of(PAGE_SIZE) else {
                return core::ptr::null_mut();
            };
            let start = map_pages(len);
            if start.is_null() {
                return core::ptr::null_mut();
            }
            (start as usize, len)
        }
    };
    let user = (start + PREFIX).next_multiple_of(align);
    let prefix = (user - PREFIX) as *mut usize;
    // SAFETY: the prefix lies inside the block, after its start (`user` is at least `PREFIX`
    // past it) and 16-aligned.
    unsafe {
        prefix.write(start);
        prefix.add(1).write(tag);
    }
    let user = user as *mut u8;
    if zeroed && tag < CLASSES {
        // SAFETY: the block holds `size` bytes from `user` (`bytes` from `start`).
        unsafe { user.write_bytes(0, size) };
    }
    user
}

/// Where no chunk can be mapped (the address space is full, `ulimit -v`, and its blocks are
/// kept on other classes' lists): a free block of a larger class and that class, to which it
/// goes back when freed.
#[cold]
fn larger_free_block(class: usize) -> Option<(usize, usize)> {
    (class + 1..CLASSES).find_map(|larger| pop(larger).map(|start| (start, larger)))
}

/// Gives back a block of [`allocate`].
///
/// # Safety
/// `ptr` came from [`allocate`] and is freed once, and nothing uses it after.
pub unsafe fn free(ptr: *mut u8) {
    let prefix = (ptr as *const usize).wrapping_sub(2);
    // SAFETY: the caller's guarantee: `allocate` wrote these two words in front of `ptr`.
    let (start, tag) = unsafe { (prefix.read(), prefix.add(1).read()) };
    if tag < CLASSES {
        push(tag, start);
    } else {
        // SAFETY: a block mapped alone, `tag` bytes long from `start`, which nothing uses now.
        unsafe { unmap_pages(start as *mut u8, tag) };
    }
}

/// Whether `[start, end)` lies in one chunk the own heap carves its class blocks from (never
/// unmapped: readable for the whole process); false also for chunks past the first
/// [`KNOWN_CHUNKS`].
pub fn holds(start: usize, end: usize) -> bool {
    let known = CHUNKS_KNOWN.load(Ordering::Relaxed).min(KNOWN_CHUNKS);
    CHUNKS[..known].iter().any(|slot| {
        // SAFETY: a published chunk stays mapped for the whole process, its header unchanged
        // but for `next`.
        unsafe { slot.load(Ordering::Acquire).as_ref() }
            .is_some_and(|chunk| (chunk as *const Chunk as usize) <= start && end <= chunk.end)
    })
}

/// The first word of a class block, which links it on its free list while it is free.
fn link_of(block: usize) -> &'static AtomicUsize {
    // SAFETY: class blocks lie in chunks that are never unmapped, 16-aligned: the word stays
    // readable and writable for the whole process, whoever holds the block.
    unsafe { &*(block as *const AtomicUsize) }
}

/// The head that replaces `seen` with `top` on top.
fn head_after(seen: u64, top: usize) -> u64 {
    (seen & !ADDRESS_MASK).wrapping_add(1 << ADDRESS_BITS) | top as u64
}

/// A free block of `class`, taken off its list; `None` when the list is empty.
fn pop(class: usize) -> Option<usize> {
    let head = &FREE_LISTS[class];
    let mut seen = head.load(Ordering::Acquire);
    loop {
        let top = (seen & ADDRESS_MASK) as usize;
        if top == 0 {
            return None;
        }
        // Stale if another thread took `top` meanwhile (its owner may be writing there): then the
        // head's count has changed and the exchange fails.
        let below = link_of(top).load(Ordering::Relaxed);
        match head.compare_exchange_weak(
            seen,
            head_after(seen, below),
            Ordering::Acquire,
            Ordering::Acquire,
        ) {
            Ok(_) => return Some(top),
            Err(now) => seen = now,
        }
    }
}

/// Puts the class block at `block` on its free list.
fn push(class: usize, block: usize) {
    let head = &FREE_LISTS[class];
    let mut seen = head.load(Ordering::Relaxed);
    loop {
        link_of(block).store((seen & ADDRESS_MASK) as usize, Ordering::Relaxed);
        match head.compare_exchange_weak(
            seen,
            head_after(seen, block),
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            Ok(_) => return,
            Err(now) => seen = now,
        }
    }
}

/// A fresh block of `room` bytes from the current chunk, or from a new one when it is used up;
/// `None` when no chunk can be mapped.
#[cold]
fn carve(room: usize) -> Option<usize> {
    loop {
        let chunk = CURRENT_CHUNK.load(Ordering::Acquire);
        // SAFETY: a published chunk stays mapped for the whole process.
        if let Some(chunk) = unsafe { chunk.as_ref() } {
            let start = chunk.next.fetch_add(room, Ordering::Relaxed);
            if start + room <= chunk.end {
                return Some(start);
            }
        }
        let header = core::mem::size_of::<Chunk>().next_multiple_of(PREFIX);
        let (fresh, len) = map_chunk(header + room)?;
        // SAFETY: a fresh mapping of ours, large enough and aligned for the chunk's header.
        unsafe {
            fresh.cast::<Chunk>().write(Chunk {
                next: AtomicUsize::new(fresh as usize + header),
                end: fresh as usize + len,
            })
        };
        // Another thread may have published a chunk meanwhile: carve from that one instead.
        if CURRENT_CHUNK
            .compare_exchange(chunk, fresh.cast(), Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // SAFETY: our own fresh mapping, never published.
            unsafe { unmap_pages(fresh, len) };
        } else if let Some(slot) = CHUNKS.get(CHUNKS_KNOWN.fetch_add(1, Ordering::Relaxed)) {
            slot.store(fresh.cast(), Ordering::Release);
        }
    }
}

/// A new chunk of [`CHUNK_BYTES`] (a 32nd of an address-space limit at most, `ulimit -v`),
/// or, where the address space is short, of a quarter of that and so on down to `least` bytes:
/// where it starts and its length.
fn map_chunk(least: usize) -> Option<(*mut u8, usize)> {
    // Whole pages: a smallest try of `least` itself would never be reached, and the tries
    // would go on for ever once the address space is full.
    let least = least.next_multiple_of(PAGE_SIZE);
    let mut len = within_limit(CHUNK_BYTES, 32).max(least);
    loop {
        let fresh = map_unreserved(len);
        if !fresh.is_null() {
            return Some((fresh, len));
        }
        if len == least {
            return None;
        }
        len = (len / 4).max(least);
    }
}

/// The own heap as a Rust allocator, for the tracker's long-lived data (the engine allocators'
/// chunks and state): never the global allocator nor the process's `malloc`, which may both be
/// the tracker.
pub struct OwnAlloc;

// SAFETY: every block comes from `allocate` with at least the layout's size and alignment, and
// goes back to `free`.
unsafe impl std::alloc::GlobalAlloc for OwnAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        allocate(layout.size(), layout.align())
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        allocate_with(layout.size(), layout.align(), true)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from `alloc` above (the caller's contract).
        unsafe { free(ptr) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_size_in_order_with_little_waste() {
        let mut last = (0, 16);
        for bytes in 1..=LARGEST_CLASS {
            let (class, room) = class_of(bytes).expect("a class");
            assert!(class < CLASSES && room >= bytes, "{bytes}: {class} {room}");
            assert!(room <= bytes.max(16) * 5 / 4 + 16, "{bytes} wastes: {room}");
            let next_class = class == last.0 + 1 && room > last.1;
            assert!(
                next_class || (class, room) == last,
                "{bytes}: {class} {room}"
            );
            last = (class, room);
        }
        assert_eq!(last.0, CLASSES - 1);
        assert!(class_of(LARGEST_CLASS + 1).is_none());
    }

    #[test]
    fn blocks_are_aligned_distinct_and_zeroed_when_asked() {
        for (size, align) in [(1, 1), (24, 16), (100, 64), (5000, 4096), (1 << 20, 16)] {
            let a = allocate(size, align);
            let b = allocate_with(size, align, true);
            assert!(!a.is_null() && !b.is_null() && a != b);
            assert!((a as usize).is_multiple_of(align.max(16)));
            assert!((b as usize).is_multiple_of(align.max(16)));
            // SAFETY: fresh blocks of at least `size` bytes, each freed once.
            unsafe {
                assert!((0..size).all(|i| *b.add(i) == 0));
                a.write_bytes(0xa5, size);
                b.write_bytes(0x5a, size);
                free(a);
                free(b);
            }
        }
    }

    /// A size no other test (nor the tracker) asks for, so that no other thread takes the block.
    #[test]
    fn a_freed_block_comes_back_and_comes_back_zeroed_when_asked() {
        let size = 150_000;
        let a = allocate(size, 16);
        // SAFETY: a fresh block of `size` bytes, freed once.
        unsafe {
            a.write_bytes(0xa5, size);
            free(a);
        }
        let b = allocate_with(size, 16, true);
        assert_eq!(a, b);
        // SAFETY: the same block again, `size` bytes.
        unsafe {
            assert!((0..size).all(|i| *b.add(i) == 0));
            free(b);
        }
    }

    #[test]
    fn threads_that_share_blocks_never_get_the_same_one() {
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for round in 0..20_000usize {
                        let size = 16 + (round * 7 + t) % 200;
                        let block = allocate(size, 16);
                        // SAFETY: a fresh block of `size` bytes, ours alone until freed.
                        unsafe {
                            block.write_bytes(t as u8, size);
                            assert!((0..size).all(|i| *block.add(i) == t as u8));
                            free(block);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no thread saw another's bytes");
        }
    }
}
