//! `TrackedAlloc`: Rust's global allocator over the tracker, so Rust blocks land in the same
//! lists and the same leak log (`"language": "rust"`).

use crate::stack::StartFrame;
use crate::tracker;
use crate::tracker::BlockKind;
use core::alloc::{GlobalAlloc, Layout};

/// Use as `#[global_allocator] static A: k15_memory::TrackedAlloc = k15_memory::TrackedAlloc;`
pub struct TrackedAlloc;

// SAFETY: every block comes from `tracker::allocate` with the layout's size and alignment and
// goes back through `tracker::deallocate`, which accepts exactly those blocks.
unsafe impl GlobalAlloc for TrackedAlloc {
    #[inline(never)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: no file name that would have to outlive the block.
        unsafe {
            tracker::allocate(
                layout.size(),
                layout.align(),
                BlockKind::Rust,
                core::ptr::null(),
                0,
                StartFrame::here,
            )
        }
    }

    #[inline(never)]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        tracker::deallocate(ptr, BlockKind::Rust, StartFrame::here)
    }
}
