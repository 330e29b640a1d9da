//! How far a write past the end of a heap block reached: its bytes behind the block, as far as
//! they can be told from what lies there (the block's guard, the headers behind it). Cold paths
//! only, and read only: the headers behind may belong to blocks another thread is using.

use super::header::{BlockHeader, Layout, GUARD, GUARD_BYTE, GUARD_SIZE};
use super::heap::HeapBlock;
use super::spans::{self, Found};
use core::ops::Range;

/// How far past a block's end the headers behind it are looked at: a header that begins within
/// these bytes and was damaged is shown whole (an `overrun` entry shows at most
/// [`super::errors::Damage::MAX_BYTES`]).
pub const REACH: usize = 64;

/// What a write past the end of a heap block left behind it.
pub struct Reach {
    /// The damaged bytes' addresses: from the first damaged byte of the block's guard (its end
    /// where its class leaves it none) to the end of the last damaged header behind it, or of
    /// its guard when no header behind it was reached.
    pub range: Range<usize>,
    /// The first block behind whose header was damaged (its user pointer), if any.
    pub victim: Option<usize>,
}

impl Reach {
    /// The bytes of the range as they are now.
    pub fn bytes(&self) -> Vec<u8> {
        bytes_at(self.range.clone())
    }
}

/// The bytes of `range`, a range within one span of the heap, as they are now.
pub fn bytes_at(range: Range<usize>) -> Vec<u8> {
    range
        // SAFETY: a span's pages are mapped while it serves a class (the callers' ranges lie
        // in blocks of one); read as plain bytes, whoever is writing them.
        .map(|at| unsafe { (at as *const u8).read_volatile() })
        .collect()
}

/// The reach of a write past the end of `front`'s `size` user bytes, when the damage runs on
/// from its end: its guard's last byte changed (or its class leaves it no guard), then every
/// header behind it up to the first intact one (or one at [`REACH`] bytes past the block's end
/// or further). The bytes between two damaged headers (a block's own) count as written; the
/// bytes behind the last damaged header are the next block's own, which cannot be told from the
/// write, and do not. `None` when nothing behind the block's bytes is damaged.
pub fn reach_behind(front: HeapBlock, size: usize) -> Option<Reach> {
    let user = front.user();
    let guard = (front.room().checked_sub(size)?).min(GUARD_SIZE);
    let guard_at = user + size;
    // SAFETY: the guard lies in the block (in a span of the heap), readable.
    let guard_byte = |i: usize| unsafe { ((guard_at + i) as *const u8).read_volatile() };
    let first_damaged = (0..guard).find(|&i| guard_byte(i) != GUARD_BYTE);
    if guard > 0 && first_damaged.is_none() {
        return None;
    }
    let start = guard_at + first_damaged.unwrap_or(0);
    let mut end = guard_at + guard;
    let mut victim = None;
    // Where the guard's last byte still holds its fill, the write stopped in the guard.
    let ran_on = guard == 0 || guard_byte(guard - 1) != GUARD_BYTE;
    let mut at = front.start + front.size;
    while ran_on && at < start + REACH {
        match spans::behind(at, front.class as usize) {
            Some(Found::Block(header, layout)) => {
                let Some(damaged_to) = damaged_header_end(header, layout, front.class) else {
                    break;
                };
                end = damaged_to;
                let user = BlockHeader::user_ptr(header) as usize;
                victim.get_or_insert(user);
                if damaged_to < user {
                    break; // the write ended within that header
                }
            }
            Some(Found::GuardWord(word)) => {
                // SAFETY: a guard word inside the span, readable.
                if unsafe { word.read_volatile() } != GUARD {
                    end = at + GUARD_SIZE;
                }
                break; // nothing is carved behind it
            }
            None => break,
        }
        at += front.size;
    }
    (end > start).then_some(Reach {
        range: start..end,
        victim,
    })
}

/// Where the damage to the heap header at `header` ends, when its cookie does not hold: the end
/// of the header, or of its first 16 bytes where its `packed` word still reads as one of its
/// class (the write ended before it; its cookie cannot tell which of the words in front changed,
/// so both are shown). `None` for an intact header.
fn damaged_header_end(header: *mut BlockHeader, layout: Layout, class: u8) -> Option<usize> {
    // SAFETY: a header carved in a span, readable; only read.
    let h = unsafe { &*header };
    if h.cookie_valid(layout) {
        return None;
    }
    let user = BlockHeader::user_ptr(header) as usize;
    Some(match layout {
        Layout::Full if h.packed_fits_heap_class(class) => user - 16,
        _ => user,
    })
}
