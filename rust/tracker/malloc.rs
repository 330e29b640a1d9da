//! The C family beside `new`/`delete`: `malloc`, `calloc`, `realloc`, the aligned forms and
//! `malloc_usable_size` of the whole process (`cpp/malloc.cpp` defines the symbols and calls the
//! entry points here). With `malloc=1` their blocks go through the same hot path, lists and
//! report as `new`'s; with `malloc=0` they are glibc's, and only `free`s of tracked blocks are
//! checked.
//!
//! No pointer reaches the wrong allocator: a block of ours carries a cookie in the word before
//! it that glibc's chunk header (a size below 2^48) can never hold, so every block is either
//! ours (released by us, whatever function frees it) or glibc's (released by `__libc_free`, and
//! only while glibc serves the family), else it is reported and left alone.

use super::guard::{self, Inside};
use super::header::{BlockHeader, Lookup, NewBlock, Placement};
use super::resize::{resize_in_place, room_to_grow};
use super::BlockKind;
use super::{allocate_inside, allocate_untracked, deallocate, init, report_foreign};
use crate::stack::StartFrame;
use crate::sys::{self, glibc, PAGE_SIZE};
use core::ffi::c_void;
use core::sync::atomic::{AtomicUsize, Ordering};

/// Whether both kinds belong to one family: the C family's blocks may be freed by any of its
/// functions, every other kind only by its own.
#[inline]
pub fn same_family(a: BlockKind, b: BlockKind) -> bool {
    is_c_family(a) && is_c_family(b)
}

#[inline]
fn is_c_family(kind: BlockKind) -> bool {
    (BlockKind::Malloc as u8..=BlockKind::Pvalloc as u8).contains(&(kind as u8))
}

/// Whether glibc serves the family: `malloc=0`, or the tracker not set up yet (glibc served
/// every `malloc` before the first allocation set it up).
#[inline]
fn glibc_serves_the_family() -> bool {
    !init::peek().is_some_and(|hot| hot.malloc())
}

/// `malloc=0` once the tracker is set up: the program's allocations go straight to glibc (before,
/// the set-up's own allocations need the tracker's path). The tracker's own (inside it) never
/// do: they come from its own heap, which a signal handler, or a `fork` from one, may use
/// whatever its thread was doing.
#[inline]
fn set_up_with_glibc_serving() -> bool {
    init::peek().is_some_and(|hot| !hot.malloc())
}

/// Whether `ptr`, no block of ours, is glibc's to free: only while glibc serves the family, and
/// only if the word before it can be a glibc chunk's size (so a pointer into the stack, a private
/// mapping or the middle of a block is reported rather than passed on).
pub fn is_glibc_block(ptr: *mut u8) -> bool {
    let addr = ptr as usize;
    if !glibc_serves_the_family() || addr < PAGE_SIZE {
        return false;
    }
    if addr.is_multiple_of(PAGE_SIZE) && !sys::page_is_mapped(addr - 16) {
        return false;
    }
    addr.is_multiple_of(16) && {
        // SAFETY: the word lies in `ptr`'s page, or in the page before it, which is mapped.
        is_glibc_size_field(unsafe { (ptr as *const usize).wrapping_sub(1).read() })
    }
}

/// Whether the word before a block can be glibc's chunk size (at least 32, a multiple of 16,
/// three flag bits): never one of our cookies, whose top bits are set.
#[inline]
fn is_glibc_size_field(word: usize) -> bool {
    let chunk_size = word & !0b111;
    chunk_size >= 32 && chunk_size.is_multiple_of(16) && chunk_size < 1 << 47
}

/// `free`: a block of ours is freed as by `delete` (checked against its family); while glibc
/// serves the family, its blocks go straight back to it.
///
/// # Safety
/// As for [`k15_memory_c_allocate`]; `ptr` may be anything (bad pointers are reported).
#[no_mangle]
pub unsafe extern "C" fn k15_memory_c_free(ptr: *mut u8, frame_address: usize) {
    let addr = ptr as usize;
    // glibc's block, as `is_glibc_block` decides, without its page probe (not needed off a
    // page start) or a call.
    if glibc_serves_the_family()
        && addr > PAGE_SIZE
        && addr.is_multiple_of(16)
        && !addr.is_multiple_of(PAGE_SIZE)
        // SAFETY: the word before a pointer off a page start lies in the same page.
        && is_glibc_size_field(unsafe { (ptr as *const usize).wrapping_sub(1).read() })
    {
        // SAFETY: a glibc block (no cookie of ours before it) freed through its own family.
        return unsafe { glibc::free(ptr as *mut c_void) };
    }
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { free_checked(ptr, frame_address) }
}

/// A `free` that is not glibc's: apart, so that glibc's path saves no registers for it, and
/// `extern "C"` (it cannot unwind), so that the entry jumps to it instead of calling it.
///
/// # Safety
/// As for [`k15_memory_c_free`].
#[inline(never)]
unsafe extern "C" fn free_checked(ptr: *mut u8, frame_address: usize) {
    // SAFETY: forwarded from the caller's guarantee.
    deallocate(ptr, BlockKind::Malloc, || unsafe {
        StartFrame::caller_of(frame_address)
    })
}

/// A block of the C family (`kind`, aligned to `align`; 0 = default), tracked with `malloc=1`,
/// else glibc's. Null with `errno` = `ENOMEM` when memory is exhausted.
///
/// `kind` crosses as the tracker's own type, not mapped from the bridge's in `rust/ffi.rs`: a
/// call from there would cost this entry point, which every `malloc` of the process takes, its
/// tail call to glibc. `rust/ffi.rs` checks at compile time that the values are the same.
///
/// # Safety
/// `kind` is one of `BlockKind`'s enumerators (C++ passes no other); `frame_address` is the
/// frame of the calling C function, compiled with frame pointers.
#[no_mangle]
pub unsafe extern "C" fn k15_memory_c_allocate(
    size: usize,
    align: usize,
    kind: BlockKind,
    frame_address: usize,
) -> *mut u8 {
    if set_up_with_glibc_serving() && !super::guard::inside() {
        return allocate_by_glibc(size, align, kind);
    }
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { allocate_checked(size, align, kind, frame_address) }
}

/// An allocation that is not left to glibc: apart, so that glibc's path saves no registers
/// for it, and `extern "C"` as [`free_checked`] (a `malloc`/`free` pair: 9 instructions fewer).
///
/// # Safety
/// As for [`k15_memory_c_allocate`].
#[inline(never)]
unsafe extern "C" fn allocate_checked(
    size: usize,
    align: usize,
    kind: BlockKind,
    frame_address: usize,
) -> *mut u8 {
    // SAFETY: forwarded from the caller's guarantee.
    let start = || unsafe { StartFrame::caller_of(frame_address) };
    allocate(size, align, kind, start)
}

/// `calloc`: zeroed, and null (`ENOMEM`) when `count * size` overflows.
///
/// # Safety
/// As for [`k15_memory_c_allocate`].
#[no_mangle]
pub unsafe extern "C" fn k15_memory_c_calloc(
    count: usize,
    size: usize,
    frame_address: usize,
) -> *mut u8 {
    let Some(total) = count.checked_mul(size) else {
        return out_of_memory();
    };
    if set_up_with_glibc_serving() && !super::guard::inside() {
        // SAFETY: a plain glibc allocation.
        return unsafe { glibc::calloc(count, size) } as *mut u8;
    }
    // SAFETY: forwarded from the caller's guarantee.
    let start = || unsafe { StartFrame::caller_of(frame_address) };
    let ptr = allocate(total, 0, BlockKind::Calloc, start);
    if let Lookup::Live(header, _) | Lookup::Untracked(header) = BlockHeader::lookup(ptr) {
        // SAFETY: a fresh block of ours of `total` bytes; fresh mappings are zero already.
        unsafe {
            if (*header).placement() != Placement::Mapped || super::raw::mapping_reused(header) {
                ptr.write_bytes(0, total);
            }
        }
    }
    crate::sys::returned_alone(ptr)
}

/// `realloc` as glibc does it: `realloc(NULL, n)` allocates, `realloc(p, 0)` frees and returns
/// null, a failure leaves the old block as it was. A tracked block is resized in place where it
/// has room (`resize`), else it moves to a new block and the old one is freed, checked as by
/// `free`: a block of another family is a `mismatched_delete`, an already freed one a
/// `double_free` (null returned). Either way it takes the stack of this call.
///
/// # Safety
/// As for [`k15_memory_c_allocate`]; `ptr` may be anything (bad pointers are reported).
#[no_mangle]
pub unsafe extern "C" fn k15_memory_c_realloc(
    ptr: *mut u8,
    size: usize,
    frame_address: usize,
) -> *mut u8 {
    // SAFETY: forwarded from the caller's guarantee.
    let start = || unsafe { StartFrame::caller_of(frame_address) };
    if ptr.is_null() {
        return allocate(size, 0, BlockKind::Realloc, start);
    }
    let old_size = match BlockHeader::lookup(ptr) {
        Lookup::Live(header, cookie) => {
            if size != 0 {
                if let Some(resized) = resize_in_place(header, cookie, size, start) {
                    return crate::sys::returned_alone(resized);
                }
            }
            // SAFETY: a live block of ours; the program owns it for this call.
            unsafe { (*header).size() }
        }
        // SAFETY: as above.
        Lookup::Untracked(header) | Lookup::Underrun { header, .. } => unsafe { (*header).size() },
        Lookup::Foreign if is_glibc_block(ptr) => {
            // SAFETY: a glibc block, resized by glibc.
            return unsafe { glibc::realloc(ptr as *mut c_void, size) } as *mut u8;
        }
        // A block whose header the report repairs moves as any live one: freed and null
        // returned, the program would go on with the old pointer, as after a failure.
        Lookup::Foreign if !guard::inside() => match report_foreign(ptr, BlockKind::Realloc, start)
        {
            // SAFETY: a live block of ours (its header repaired just now).
            Some((header, _)) => unsafe { (*header).size() },
            None => return core::ptr::null_mut(),
        },
        Lookup::Freed { .. } | Lookup::Foreign | Lookup::Damaged => {
            deallocate(ptr, BlockKind::Realloc, start); // reports it
            return core::ptr::null_mut();
        }
    };
    if size == 0 {
        deallocate(ptr, BlockKind::Realloc, start);
        return core::ptr::null_mut();
    }
    let room = room_to_grow(old_size, size);
    let moved = allocate_with_room(size, room, 0, BlockKind::Realloc, start);
    if !moved.is_null() {
        // SAFETY: both blocks are live, distinct, and at least this long.
        unsafe { core::ptr::copy_nonoverlapping(ptr, moved, old_size.min(size)) };
        deallocate(ptr, BlockKind::Realloc, start);
    }
    crate::sys::returned_alone(moved)
}

/// `malloc_usable_size`: the size asked for, for a block of ours (the tracker never lets a
/// program use the slack of a block); glibc's answer for a glibc block; 0 otherwise.
#[no_mangle]
pub extern "C" fn k15_memory_c_usable_size(ptr: *mut u8) -> usize {
    if ptr.is_null() {
        return 0;
    }
    match BlockHeader::lookup(ptr) {
        // SAFETY: a live block of ours.
        Lookup::Live(header, _) | Lookup::Untracked(header) | Lookup::Underrun { header, .. } => unsafe {
            (*header).size()
        },
        Lookup::Foreign if is_glibc_block(ptr) => glibc_usable_size(ptr),
        Lookup::Freed { .. } | Lookup::Foreign | Lookup::Damaged => 0,
    }
}

/// At exit with `malloc=1`, before the report: the C and C++ runtimes free what they keep for the
/// life of the process (stdio buffers, libstdc++'s emergency exception pool, name-service and
/// time-zone data, cached thread stacks), as valgrind and glibc's `mtrace` have them do, so that
/// the report lists the program's blocks only. Skipped while other threads still run: they may
/// be using those caches.
pub fn release_runtime_caches() {
    if glibc_serves_the_family() || other_threads_running() {
        return;
    }
    // SAFETY: a lookup by a NUL-terminated name; null where libstdc++ is too old to have it.
    let libstdcxx =
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_ZN9__gnu_cxx9__freeresEv".as_ptr()) };
    // SAFETY: `__gnu_cxx::__freeres()` and `__libc_freeres()` take no arguments and may be
    // called at exit, once every other thread is gone; each runs once however often called.
    unsafe {
        if !libstdcxx.is_null() {
            let free_pool: unsafe extern "C" fn() = core::mem::transmute(libstdcxx);
            free_pool();
        }
        glibc::free_runtime_caches();
    }
}

/// Whether a thread besides the caller is still in the process. A thread the program joined a
/// moment ago may still be counted: `pthread_join` returns once the kernel clears the thread's
/// id, before the thread leaves the process's count (one run in four of a program that joins
/// four threads and exits saw it). So while the tracker's own record says every other thread is
/// gone, the count is read again for up to [`EXITING_THREADS_WAIT_MS`].
fn other_threads_running() -> bool {
    for waited in 0..=EXITING_THREADS_WAIT_MS {
        if threads_counted() == Some(1) {
            return false;
        }
        if waited == EXITING_THREADS_WAIT_MS || !super::threads::alone() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}

/// How long exiting threads may take to leave the process's count at exit: on a loaded machine
/// a thread that has let its joiner go may wait a scheduler period or more to finish. Paid in
/// full only by a program that exits while a thread it never allocated on still runs.
const EXITING_THREADS_WAIT_MS: u32 = 100;

/// The process's thread count, as the kernel gives it.
fn threads_counted() -> Option<u32> {
    // Reading the file allocates: the tracker's own memory, not the program's (nor its budget's).
    let _inside = Inside::enter();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|count| count.trim().parse::<u32>().ok())
}

/// glibc's `malloc_usable_size` (exported under no other name), found once with `dlsym`.
#[cold]
fn glibc_usable_size(ptr: *mut u8) -> usize {
    static FUNCTION: AtomicUsize = AtomicUsize::new(0);
    let mut function = FUNCTION.load(Ordering::Acquire);
    if function == 0 {
        // dlsym may allocate: the tracker's own memory.
        let _inside = Inside::enter();
        // SAFETY: a lookup by a NUL-terminated name past this module (glibc's definition).
        function = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) } as usize;
        FUNCTION.store(function, Ordering::Release);
    }
    if function == 0 {
        return 0;
    }
    // SAFETY: glibc's malloc_usable_size, given one of glibc's blocks.
    unsafe {
        let usable: unsafe extern "C" fn(*mut c_void) -> usize = core::mem::transmute(function);
        usable(ptr as *mut c_void)
    }
}

/// The shared path of every allocating function: tracked (`malloc=1`) through the same hot
/// path as `new`, the tracker's own memory (nested calls) through the raw system path (the own
/// heap), and glibc's block with `malloc=0`.
#[inline(always)]
fn allocate(
    size: usize,
    align: usize,
    kind: BlockKind,
    start: impl FnOnce() -> StartFrame,
) -> *mut u8 {
    allocate_with_room(size, 0, align, kind, start)
}

/// [`allocate`] of a block whose heap class holds at least `room` bytes (see `resize`).
#[inline(always)]
fn allocate_with_room(
    size: usize,
    room: usize,
    align: usize,
    kind: BlockKind,
    start: impl FnOnce() -> StartFrame,
) -> *mut u8 {
    // Rounded up to whole pages; a size within a page of `usize::MAX` would wrap (to 0).
    let size = if kind == BlockKind::Pvalloc {
        let Some(pages) = size.max(1).checked_next_multiple_of(PAGE_SIZE) else {
            return out_of_memory();
        };
        pages
    } else {
        size
    };
    let Some(inside) = Inside::enter() else {
        return or_out_of_memory(allocate_untracked(size, align, kind));
    };
    let hot = init::hot();
    if !hot.malloc() {
        drop(inside);
        return allocate_by_glibc(size, align, kind);
    }
    let block = NewBlock {
        size,
        kind,
        file: core::ptr::null(),
        line: 0,
    };
    // SAFETY: no file name that would have to outlive the block.
    or_out_of_memory(unsafe { allocate_inside(inside, hot, &block, align, room.max(size), start) })
}

/// `malloc=0`: glibc's block for the call (glibc sets `errno`).
#[inline(never)]
fn allocate_by_glibc(size: usize, align: usize, kind: BlockKind) -> *mut u8 {
    // SAFETY: plain glibc allocation calls.
    let block = unsafe {
        match kind {
            BlockKind::Valloc => glibc::valloc(size),
            BlockKind::Pvalloc => glibc::pvalloc(size),
            BlockKind::Calloc => glibc::calloc(1, size),
            _ if align <= 16 => glibc::malloc(size),
            _ => glibc::memalign(align, size),
        }
    };
    block as *mut u8
}

#[inline(always)]
fn or_out_of_memory(block: *mut u8) -> *mut u8 {
    if block.is_null() {
        return out_of_memory();
    }
    block
}

#[cold]
fn out_of_memory() -> *mut u8 {
    // SAFETY: errno is the calling thread's.
    unsafe { *libc::__errno_location() = libc::ENOMEM };
    core::ptr::null_mut()
}
