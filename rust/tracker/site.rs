//! Allocation sites (`K15_NEW`'s `__FILE__` and `__LINE__`, or an engine allocator's name) as
//! 32-bit ids, so that a block header keeps 4 bytes for them instead of a pointer and a line.
//!
//! The table is interned without a lock: each entry is one word, the file pointer (47 bits, as
//! every x86-64 user address) and the line (17 bits) packed, set once by a compare-and-swap.
//! Only allocations that name a site pay for the probe; a plain `new` (no file) is site 0.

use core::ffi::c_char;
use core::sync::atomic::{AtomicU64, Ordering};

/// Entries in the table: a program has far fewer distinct `K15_NEW` lines.
pub const CAPACITY: usize = 1 << 14;
const ADDRESS_BITS: u32 = 47;
/// Lines from this one on are kept without their line (0), like a plain `new`'s file.
const LINE_LIMIT: u32 = 1 << (64 - ADDRESS_BITS);

static SITES: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];

/// A site's id: 0 for none (no file), else its table index + 1. A table that is full, or a
/// file pointer outside user space, gives 0 too (the call stack still shows the site).
#[inline]
pub fn intern(file: *const c_char, line: u32) -> u32 {
    if file.is_null() {
        return 0;
    }
    intern_named(file, line)
}

/// Read first and written only when the entry is empty: the threads that allocate at one site
/// share its entry's cache line without fighting over it.
#[inline(never)]
fn intern_named(file: *const c_char, line: u32) -> u32 {
    let address = file as u64;
    if address >> ADDRESS_BITS != 0 {
        return 0;
    }
    let line = if line < LINE_LIMIT { line } else { 0 };
    let key = address | (line as u64) << ADDRESS_BITS;
    let mut index = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 50) as usize % CAPACITY;
    for _ in 0..CAPACITY {
        let entry = &SITES[index];
        let mut found = entry.load(Ordering::Acquire);
        if found == 0 {
            found = match entry.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => key,
                Err(other) => other,
            };
        }
        if found == key {
            return index as u32 + 1;
        }
        index = (index + 1) % CAPACITY;
    }
    0
}

/// The file pointer and line of site `id`; null and 0 for site 0 or an id no site has (a
/// stray write in a freed header).
pub fn resolve(id: u32) -> (*const c_char, u32) {
    let Some(entry) = (id as usize)
        .checked_sub(1)
        .and_then(|index| SITES.get(index))
    else {
        return (core::ptr::null(), 0);
    };
    let key = entry.load(Ordering::Acquire);
    (
        (key & ((1 << ADDRESS_BITS) - 1)) as *const c_char,
        (key >> ADDRESS_BITS) as u32,
    )
}

/// Whether `id` names a site that was interned (or none): a check of a header that may have
/// been overwritten.
pub fn is_known(id: u32) -> bool {
    id == 0 || (id as usize <= CAPACITY && SITES[id as usize - 1].load(Ordering::Relaxed) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_keeps_its_id_and_gives_back_its_file_and_line() {
        let file = c"site_test.cpp".as_ptr();
        let other = c"other_site_test.cpp".as_ptr();
        let id = intern(file, 42);
        assert_ne!(id, 0);
        assert_eq!(intern(file, 42), id, "the same site, interned again");
        assert_ne!(intern(file, 43), id);
        assert_ne!(intern(other, 42), id);
        assert_eq!(resolve(id), (file, 42));
        assert!(is_known(id));
    }

    #[test]
    fn no_file_and_lines_beyond_the_limit_have_no_line() {
        assert_eq!(intern(core::ptr::null(), 7), 0);
        assert_eq!(resolve(0), (core::ptr::null(), 0));
        let file = c"far_lines.cpp".as_ptr();
        assert_eq!(resolve(intern(file, LINE_LIMIT + 5)), (file, 0));
        assert!(!is_known(CAPACITY as u32 + 1));
    }
}
