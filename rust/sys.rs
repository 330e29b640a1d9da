//! The OS edge: raw memory for blocks and for the tracker itself, stderr, environment, process facts.
//!
//! Nothing here goes through `operator new` or Rust's global allocator, so the tracker can call
//! it while it is inside its own bookkeeping.

use core::ffi::{c_char, CStr};
use core::fmt::{self, Write};
use core::ptr::null_mut;
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

pub const PAGE_SIZE: usize = 4096;

pub mod own_heap;

/// glibc's allocator under its own names: `malloc` and friends of this process are the
/// tracker's (`cpp/malloc.cpp`), so the C family's memory when `malloc=0`, and glibc's blocks
/// given back, go to these, which no interposition reaches (the tracker's own memory comes from
/// [`own_heap`]). Each call marks its thread as
/// inside glibc's allocator for its length ([`in_glibc_allocator`]).
pub mod glibc {
    use libc::{c_void, size_t};

    /// The entry points, and for each a function of the same name that calls it marked.
    macro_rules! marked {
        ($($(#[$doc:meta])* $link:literal fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?;)*) => {
            mod entry {
                use libc::{c_void, size_t};
                extern "C" {
                    $(#[link_name = $link] pub fn $name($($arg: $ty),*) $(-> $ret)?;)*
                }
            }
            $(
                $(#[$doc])*
                ///
                /// # Safety
                /// As glibc's own function.
                pub unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                    // SAFETY: the caller's guarantee.
                    super::marked_inside_glibc(|| unsafe { entry::$name($($arg),*) })
                }
            )*
        };
    }

    marked! {
        "__libc_malloc" fn malloc(size: size_t) -> *mut c_void;
        "__libc_calloc" fn calloc(count: size_t, size: size_t) -> *mut c_void;
        "__libc_realloc" fn realloc(ptr: *mut c_void, size: size_t) -> *mut c_void;
        "__libc_memalign" fn memalign(align: size_t, size: size_t) -> *mut c_void;
        "__libc_valloc" fn valloc(size: size_t) -> *mut c_void;
        "__libc_pvalloc" fn pvalloc(size: size_t) -> *mut c_void;
        "__libc_free" fn free(ptr: *mut c_void);
        /// Frees what glibc keeps for the life of the process (for valgrind and mtrace).
        "__libc_freeres" fn free_runtime_caches();
    }
}

std::thread_local! {
    // `const` and without `Drop`: readable in any thread-exit destructor and signal handler.
    static INSIDE_GLIBC: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Runs `call` (a call of glibc's allocator, or of a glibc function that calls it) with the
/// thread marked as inside it.
pub(crate) fn marked_inside_glibc<R>(call: impl FnOnce() -> R) -> R {
    let was = INSIDE_GLIBC.replace(true);
    let result = call();
    INSIDE_GLIBC.set(was);
    result
}

/// Whether the calling thread is inside glibc's allocator through [`glibc`]: then it is a
/// signal handler that interrupted it there, and must not call it again (its arena locks are
/// not reentrant: the handler would wait for its own thread forever, or find an arena half
/// changed).
pub fn in_glibc_allocator() -> bool {
    INSIDE_GLIBC.get()
}

/// `size` bytes aligned to `align` (a power of two, at least 16), from the tracker's own heap
/// ([`own_heap`]), which a signal handler may use whatever its thread was doing.
#[inline]
pub fn raw_alloc(size: usize, align: usize) -> *mut u8 {
    own_heap::allocate(size, align)
}

/// Frees memory from [`raw_alloc`].
///
/// # Safety
/// `ptr` came from [`raw_alloc`] and is freed once.
#[inline]
pub unsafe fn raw_free(ptr: *mut u8) {
    // SAFETY: the caller's guarantee.
    unsafe { own_heap::free(ptr) }
}

/// Fresh anonymous pages, or null.
pub fn map_pages(len: usize) -> *mut u8 {
    map_with(len, 0)
}

/// The lock under which mappings change: taken alone by each of the program's `mmap`, `munmap`
/// and `mremap` calls (`report::mappings`, which also records them under it), and shared by the
/// tracker's changes to its large blocks' mappings (each from taking or mapping a block's pages
/// until the block is listed, from unlisting it until its pages are kept or unmapped, and
/// around its `mremap`), so that a call of the program's that the tracker let through never
/// unmaps pages just handed to a block (see `tracker::mapped_blocks`), while the tracker's own
/// changes never wait for each other. Holders take no other lock but by trying.
///
/// The word: [`PROGRAM_CALL`] while a program's call holds it or waits for the tracker's changes
/// under way, which it counts below.
static MAP_LOCK: AtomicUsize = AtomicUsize::new(0);
const PROGRAM_CALL: usize = 1 << (usize::BITS - 1);

thread_local! {
    /// Whether the thread is inside a change or call under [`MAP_LOCK`]: a signal handler that
    /// interrupted it goes on without the lock rather than wait for its own thread.
    static IN_MAPPING_CHANGE: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Marks the calling thread as inside a mapping change; false if it was already.
fn enter_mapping_change() -> bool {
    !IN_MAPPING_CHANGE.with(|inside| inside.replace(true))
}

/// Waits until no call of the program's holds [`MAP_LOCK`], and changes its word with `enter`.
fn enter_when_no_program_call(enter: impl Fn(usize) -> usize) {
    while MAP_LOCK
        .fetch_update(Ordering::Acquire, Ordering::Relaxed, |word| {
            (word & PROGRAM_CALL == 0).then(|| enter(word))
        })
        .is_err()
    {
        std::thread::yield_now();
    }
}

/// [`MAP_LOCK`], held alone: for a call of the program's.
pub struct MapLock;

impl MapLock {
    /// Waits for the lock and for the tracker's changes under way; `None` where the calling
    /// thread is inside a change already (a signal handler that interrupted it).
    pub fn take() -> Option<MapLock> {
        if !enter_mapping_change() {
            return None;
        }
        enter_when_no_program_call(|word| word | PROGRAM_CALL);
        while MAP_LOCK.load(Ordering::Acquire) != PROGRAM_CALL {
            std::thread::yield_now();
        }
        Some(MapLock)
    }
}

impl Drop for MapLock {
    fn drop(&mut self) {
        MAP_LOCK.store(0, Ordering::Release);
        IN_MAPPING_CHANGE.with(|inside| inside.set(false));
    }
}

/// [`MAP_LOCK`], shared: for a change of the tracker's to a large block's mapping.
pub struct MapChange;

impl MapChange {
    /// Waits while a call of the program's holds the lock; `None` where the calling thread is
    /// inside a change already (a signal handler that interrupted it).
    pub fn begin() -> Option<MapChange> {
        if !enter_mapping_change() {
            return None;
        }
        enter_when_no_program_call(|word| word + 1);
        Some(MapChange)
    }
}

impl Drop for MapChange {
    fn drop(&mut self) {
        MAP_LOCK.fetch_sub(1, Ordering::Release);
        IN_MAPPING_CHANGE.with(|inside| inside.set(false));
    }
}

/// Fresh anonymous pages that reserve no swap (only touched pages cost memory), or null.
pub fn map_unreserved(len: usize) -> *mut u8 {
    map_with(len, libc::MAP_NORESERVE)
}

/// Fresh anonymous readable and writable pages mapped with `flags` besides, or null.
fn map_with(len: usize, flags: libc::c_int) -> *mut u8 {
    map_anonymous(
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
    )
}

/// The tracker's own anonymous mapping, made with the system call rather than `mmap`, which the
/// program's calls reach (`cpp/mappings.cpp`): the tracker's memory must never be recorded as
/// the program's, whose mappings the leak scan reads as roots. Null on failure.
fn map_anonymous(len: usize, prot: libc::c_int, flags: libc::c_int) -> *mut u8 {
    // SAFETY: a new anonymous mapping (no MAP_FIXED) touches no existing memory.
    let p = unsafe { libc::syscall(libc::SYS_mmap, null_mut::<u8>(), len, prot, flags, -1, 0) };
    if p < 0 {
        null_mut()
    } else {
        p as *mut u8
    }
}

/// Maps `len` bytes of zeroed memory that a child process made by a raw `clone` shares: what it
/// writes there, this process reads. Null on failure.
pub fn map_shared(len: usize) -> *mut u8 {
    map_anonymous(
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED | libc::MAP_ANONYMOUS,
    )
}

/// Maps `bytes` of zeroed `MAP_NORESERVE` memory into `slot` once (slow path; only touched
/// pages cost memory): the mapping already there if another thread won the race, null if
/// mapping failed.
#[cold]
#[inline(never)]
pub fn map_once<T>(slot: &AtomicPtr<T>, bytes: usize) -> *mut T {
    let there = slot.load(Ordering::Acquire);
    if !there.is_null() {
        return there;
    }
    let mine = map_unreserved(bytes).cast::<T>();
    if mine.is_null() {
        return slot.load(Ordering::Acquire);
    }
    publish_once(slot, mine, bytes)
}

/// Publishes `mine`, a fresh mapping of `bytes` bytes, in `slot` unless another thread's is
/// there already: the mapping published. `mine` is unmapped when it lost the race.
pub fn publish_once<T>(slot: &AtomicPtr<T>, mine: *mut T, bytes: usize) -> *mut T {
    match slot.compare_exchange(null_mut(), mine, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => mine,
        Err(theirs) => {
            // SAFETY: the caller's own mapping of `bytes` bytes, never shared.
            unsafe { unmap_pages(mine.cast(), bytes) };
            theirs
        }
    }
}

/// The process's address-space limit (`ulimit -v`, `RLIMIT_AS`), where it has one: the
/// tracker's reservations then take a part of it, not the first size granted, so that the
/// program's own mappings and thread stacks still find room.
pub fn address_space_limit() -> Option<usize> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for the call to fill.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } == 0;
    (got && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur as usize)
}

/// `most` bytes, or under an address-space limit at most a `share`th of the limit (whole
/// pages): the address space a table of the tracker's that may fill `most` maps at once.
pub fn within_limit(most: usize, share: usize) -> usize {
    address_space_limit().map_or(most, |limit| {
        most.min(limit / share / PAGE_SIZE * PAGE_SIZE)
    })
}

/// Address space for `len` bytes that nothing may touch yet (no memory is committed to it), or
/// null; parts of it are made usable with [`commit_pages`].
pub fn reserve_pages(len: usize) -> *mut u8 {
    map_anonymous(
        len,
        libc::PROT_NONE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
    )
}

/// Makes `len` bytes at `ptr` of a reservation from [`reserve_pages`] readable and writable;
/// false if the OS refused (out of memory).
pub fn commit_pages(ptr: *mut u8, len: usize) -> bool {
    // SAFETY: changes the protection of part of a reservation that only the caller uses.
    unsafe {
        libc::mprotect(
            ptr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
        ) == 0
    }
}

/// Asks the CPU to bring the cache line of `addr` in: a hint, which never faults, whatever the
/// address.
#[inline(always)]
pub fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache; it reads nothing and never faults.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Gives the memory of `len` bytes at `ptr` (usable pages of ours) back to the OS: they stay
/// mapped, and read as zeros until written again.
///
/// # Safety
/// Nothing in the pages is needed any more.
pub unsafe fn return_pages(ptr: *mut u8, len: usize) {
    // SAFETY: guaranteed by the caller; MADV_DONTNEED on private anonymous memory only drops
    // its contents.
    unsafe { libc::madvise(ptr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
}

/// `block`, returned with the caller-saved registers other than `rax` zeroed: the address of a
/// fresh block (or of its header) must not stay behind in them when an allocation returns. A
/// thread that allocates and then blocks (a worker waiting on its queue) keeps its registers
/// as they were, and the leak scan reads them (`report/threads.rs`): a copy left there of a
/// block the program dropped kept that leak "reachable" (valgrind, whose allocator leaves other
/// registers, finds it lost). Eight register zeroings, which the CPU does at renaming.
#[inline(always)]
pub fn returned_alone(block: *mut u8) -> *mut u8 {
    let mut address = block.addr();
    #[cfg(target_arch = "x86_64")]
    // SAFETY: zeroes registers the compiler is told are overwritten; touches no memory.
    unsafe {
        core::arch::asm!(
            "xor ecx, ecx",
            "xor edx, edx",
            "xor esi, esi",
            "xor edi, edi",
            "xor r8d, r8d",
            "xor r9d, r9d",
            "xor r10d, r10d",
            "xor r11d, r11d",
            inout("rax") address,
            out("rcx") _,
            out("rdx") _,
            out("rsi") _,
            out("rdi") _,
            out("r8") _,
            out("r9") _,
            out("r10") _,
            out("r11") _,
            options(nomem, nostack),
        );
    }
    block.with_addr(address)
}

/// Returns pages of the tracker's own mappings, with the system call (see [`map_anonymous`]).
///
/// # Safety
/// `ptr..ptr+len` is (part of) a mapping of the tracker's that nothing uses any more.
pub unsafe fn unmap_pages(ptr: *mut u8, len: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { libc::syscall(libc::SYS_munmap, ptr, len) };
}

/// Resizes a mapping of ours at `ptr` from `old_len` to `new_len` bytes (pages), with `may_move`
/// moving it where it cannot grow in place (the kernel moves its page tables, not its bytes):
/// where it now starts, or null (the mapping left as it was). A system call, as `mmap`'s own: `mremap`
/// reaches the program's interposer (`cpp/mappings.cpp`) and the tracker's pages are no mapping
/// of the program's.
///
/// # Safety
/// `ptr..ptr + old_len` is a mapping of ours that nobody else uses while it moves.
pub unsafe fn remap_pages(ptr: *mut u8, old_len: usize, new_len: usize, may_move: bool) -> *mut u8 {
    let flags = if may_move { libc::MREMAP_MAYMOVE } else { 0 };
    // SAFETY: guaranteed by the caller; with MREMAP_MAYMOVE alone the kernel chooses the new
    // place, overwriting nothing.
    let p = unsafe { libc::syscall(libc::SYS_mremap, ptr, old_len, new_len, flags) };
    if p < 0 {
        null_mut()
    } else {
        p as *mut u8
    }
}

/// `membarrier(2)` commands (linux/membarrier.h).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// Whether [`process_barrier`] works here (registered at the first call): Linux 4.14 and later,
/// unless a seccomp filter forbids `membarrier`.
pub fn process_barrier_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        // SAFETY: registration takes no pointers; failure is reported through the result.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                0,
                0,
            ) == 0
        }
    })
}

/// A full memory barrier on every running thread of the process, as if each had executed one
/// where it stands. A syscall (microseconds): for the tracker's rare stop-the-world paths.
pub fn process_barrier() {
    if process_barrier_available() {
        // SAFETY: takes no pointers; registered by process_barrier_available.
        unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
    }
}

/// The bytes `value` occupies, as addresses (for ranges a leak scan must skip).
pub fn bytes_of<T: ?Sized>(value: &T) -> core::ops::Range<usize> {
    let start = core::ptr::from_ref(value).cast::<u8>() as usize;
    start..start + core::mem::size_of_val(value)
}

/// Whether the page holding `addr` is mapped and readable: a `PROT_NONE` reservation (glibc's
/// arenas keep one after each heap, the tracker's own heap too) is mapped, but reading it
/// faults. One syscall, asked of the kernel without reading the page here: `rt_sigprocmask`
/// copies its new signal set from user memory before it looks at `how`, so with an invalid
/// `how` it fails with EFAULT where the 8 bytes cannot be read and with EINVAL where they can,
/// and changes nothing (about 0.2 us here; `process_vm_readv` pins the page and takes 1.6 us).
pub fn page_is_mapped(addr: usize) -> bool {
    const INVALID_HOW: libc::c_long = -1;
    const KERNEL_SIGSET_BYTES: libc::c_long = 8;
    let page = addr & !(PAGE_SIZE - 1);
    // SAFETY: the kernel only copies 8 bytes from `page` (failing cleanly where it cannot) and,
    // `how` being invalid, changes no signal mask; the old mask is not asked for.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            INVALID_HOW,
            page,
            core::ptr::null_mut::<libc::c_void>(),
            KERNEL_SIGSET_BYTES,
        )
    };
    rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL)
}

/// Which pages of `[start, start + PAGE_SIZE * residency.len())` (page-aligned) hold memory now:
/// `residency[i]` is true for page `i`. False (and nothing written) where part of the range is
/// not mapped. A page never touched reads as zeros and need not be read.
pub fn resident_pages(start: usize, residency: &mut [u8]) -> bool {
    // SAFETY: mincore writes one byte per page of the range into `residency`, which has them.
    let rc = unsafe {
        libc::mincore(
            start as *mut libc::c_void,
            residency.len() * PAGE_SIZE,
            residency.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return false;
    }
    for page in residency.iter_mut() {
        *page &= 1;
    }
    true
}

/// Copies the words at `addr` (aligned) into `words` as far as they can be read, 64 KiB at most:
/// the number of words copied, stopping at the first page that cannot be read (unmapped,
/// `PROT_NONE`), even if another thread unmaps it meanwhile. `process_vm_readv` on our own
/// process; where a seccomp filter refuses it, page by page after [`page_is_mapped`].
pub fn read_words(addr: usize, words: &mut [usize]) -> usize {
    /// Pages read in one call, each its own remote piece: a transfer stops between pieces.
    const PIECES: usize = 16;
    let word = core::mem::size_of::<usize>();
    let bytes = core::mem::size_of_val(words).min(PIECES * PAGE_SIZE - addr % PAGE_SIZE);
    let local = libc::iovec {
        iov_base: words.as_mut_ptr().cast(),
        iov_len: bytes,
    };
    let mut remote = [libc::iovec {
        iov_base: null_mut(),
        iov_len: 0,
    }; PIECES];
    let (mut at, end, mut pieces) = (addr, addr + bytes, 0);
    while at < end {
        let next = ((at | (PAGE_SIZE - 1)) + 1).min(end);
        remote[pieces] = libc::iovec {
            iov_base: at as *mut libc::c_void,
            iov_len: next - at,
        };
        (at, pieces) = (next, pieces + 1);
    }
    // SAFETY: the kernel writes at most `bytes` into `words` and reads the remote pieces itself,
    // failing cleanly where it cannot.
    let got = unsafe {
        libc::process_vm_readv(libc::getpid(), &local, 1, remote.as_ptr(), pieces as _, 0)
    };
    if got >= 0 {
        return got as usize / word;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EPERM | libc::ENOSYS) => {}
        _ => return 0, // EFAULT: the first page cannot be read
    }
    let mut copied = 0;
    while copied < words.len() {
        let at = addr + copied * word;
        if !page_is_mapped(at) {
            break;
        }
        let page_end = (at | (PAGE_SIZE - 1)) + 1;
        let count = ((page_end - at) / word).min(words.len() - copied);
        for (i, slot) in words[copied..copied + count].iter_mut().enumerate() {
            // SAFETY: the page was readable just now; a conservative scan reads words another
            // thread may be writing (the range is the program's, which may unmap it at once:
            // the window process_vm_readv closes).
            *slot = unsafe { core::ptr::read_volatile((at + i * word) as *const usize) };
        }
        copied += count;
    }
    copied
}

extern "C" {
    // Not in the libc crate for glibc targets.
    fn pthread_setcancelstate(state: libc::c_int, old_state: *mut libc::c_int) -> libc::c_int;
}

/// glibc's `PTHREAD_CANCEL_DISABLE`.
const CANCEL_DISABLE: libc::c_int = 1;

/// Holds off `pthread_cancel` on the calling thread while the tracker works there with libc
/// calls that are cancellation points (`write`, `open`, `read`, `close`, `nanosleep`: a report,
/// an error's lines, the set-up's files). Acted on inside one, a cancellation would unwind
/// through the tracker's frames, which cannot be unwound: glibc aborts the process. A
/// cancellation asked for meanwhile acts at the program's next cancellation point, once the
/// thread's own state is back.
pub struct CancellationHeld {
    old_state: libc::c_int,
}

impl CancellationHeld {
    pub fn hold() -> Self {
        let mut old_state = 0;
        // SAFETY: sets the calling thread's own state; `old_state` is written, nothing else.
        unsafe { pthread_setcancelstate(CANCEL_DISABLE, &mut old_state) };
        CancellationHeld { old_state }
    }
}

impl Drop for CancellationHeld {
    fn drop(&mut self) {
        // SAFETY: restores the state `hold` found on this same thread (the guard is not `Send`
        // in practice: it lives in the frame that made it).
        unsafe { pthread_setcancelstate(self.old_state, core::ptr::null_mut()) };
    }
}

/// The working directory the process started in ([`note_launch_dir`]), NUL-terminated: held
/// in place, as a block of the program's heap would show in its report.
static LAUNCH_DIR: std::sync::OnceLock<[u8; LAUNCH_DIR_BYTES]> = std::sync::OnceLock::new();
const LAUNCH_DIR_BYTES: usize = 4096;

/// Notes the working directory at start-up: the options' relative paths (`log_path`'s default,
/// `k15_leaks.log`) name files there, where the user looks, even after the program changes
/// directory (a game to its data, a daemon to `/`).
pub fn note_launch_dir() {
    let mut dir = [0u8; LAUNCH_DIR_BYTES];
    // SAFETY: `getcwd` writes at most `dir.len()` bytes, NUL included, or fails.
    if !unsafe { libc::getcwd(dir.as_mut_ptr().cast(), dir.len()) }.is_null() {
        let _ = LAUNCH_DIR.set(dir);
    }
}

/// `path`, a relative one taken from the directory the process started in when it has moved
/// since (else as given, so that the lines naming it read as the user wrote it).
pub fn from_launch_dir(path: &str) -> String {
    let launch = LAUNCH_DIR
        .get()
        .and_then(|dir| core::ffi::CStr::from_bytes_until_nul(dir).ok())
        .and_then(|dir| dir.to_str().ok());
    match launch {
        Some(dir)
            if std::path::Path::new(path).is_relative()
                && std::env::current_dir().ok().as_deref() != Some(std::path::Path::new(dir)) =>
        {
            std::path::Path::new(dir)
                .join(path)
                .to_string_lossy()
                .into_owned()
        }
        _ => path.to_owned(),
    }
}

/// Descriptors a report may open beyond the program's own limit (`RLIMIT_NOFILE`, its soft
/// value raised towards the hard one while the guard lives): a program that used up its
/// descriptors would otherwise get its report unsymbolized, on stderr instead of its file.
pub struct DescriptorHeadroom {
    program_limit: Option<libc::rlimit>,
}

impl DescriptorHeadroom {
    /// Enough for the report's files, the modules it symbolizes (one open at a time) and
    /// `/proc`'s.
    const EXTRA: libc::rlim_t = 256;

    pub fn raise() -> Self {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `limit` is a valid rlimit for the calls to read.
        let raised = unsafe {
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0
                && limit.rlim_cur < limit.rlim_max
                && libc::setrlimit(
                    libc::RLIMIT_NOFILE,
                    &libc::rlimit {
                        rlim_cur: limit
                            .rlim_cur
                            .saturating_add(Self::EXTRA)
                            .min(limit.rlim_max),
                        rlim_max: limit.rlim_max,
                    },
                ) == 0
        };
        DescriptorHeadroom {
            program_limit: raised.then_some(limit),
        }
    }
}

impl Drop for DescriptorHeadroom {
    fn drop(&mut self) {
        if let Some(limit) = &self.program_limit {
            // SAFETY: puts back the limit `raise` read.
            unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, limit) };
        }
    }
}

/// Writes all of `bytes` to the file descriptor, retrying on short writes and EINTR.
pub fn write_fd(fd: i32, mut bytes: &[u8]) {
    let _held = CancellationHeld::hold();
    while !bytes.is_empty() {
        // SAFETY: the pointer and length come from a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr() as *const libc::c_void, bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            return;
        }
    }
}

/// A fixed buffer that formats without allocating; what does not fit is cut, marked with "...".
pub struct StackBuffer<const N: usize> {
    bytes: [u8; N],
    len: usize,
    truncated: bool,
}

impl<const N: usize> Default for StackBuffer<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> StackBuffer<N> {
    pub const fn new() -> Self {
        StackBuffer {
            bytes: [0; N],
            len: 0,
            truncated: false,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Whether something written did not fit (and was cut).
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Empties the buffer for the next text.
    pub fn clear(&mut self) {
        self.len = 0;
        self.truncated = false;
    }

    /// Writes the buffer to stderr in one `write(2)`, so lines from two threads do not interleave.
    pub fn flush_to_stderr(&mut self) {
        if self.truncated && self.len >= 4 {
            self.bytes[self.len - 4..self.len].copy_from_slice(b"...\n");
        }
        write_fd(2, self.as_bytes());
        self.len = 0;
        self.truncated = false;
    }
}

impl<const N: usize> Write for StackBuffer<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = N - self.len;
        let take = s.len().min(room);
        self.bytes[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        self.truncated |= take < s.len();
        Ok(())
    }
}

/// The value of an environment variable, read without allocating.
pub fn env_var(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv returns null or a pointer into the process environment, which lives (and is
    // not modified by this program's tracker) for the rest of the process.
    unsafe {
        let value = libc::getenv(name.as_ptr());
        (!value.is_null()).then(|| CStr::from_ptr(value).to_bytes())
    }
}

/// The text of a NUL-terminated C string, if the pointer is not null (file names from `__FILE__`).
///
/// # Safety
/// `ptr` is null or points to a NUL-terminated string that outlives the returned slice.
pub unsafe fn c_str<'a>(ptr: *const c_char) -> Option<&'a str> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
    Some(core::str::from_utf8(bytes).unwrap_or("<non-utf8 file name>"))
}

/// Ends the process at once, skipping exit handlers (they already ran when this is used).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and needs no preconditions.
    unsafe { libc::_exit(code) }
}

pub fn abort() -> ! {
    // SAFETY: abort never returns.
    unsafe { libc::abort() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_readable_pages_count_as_mapped() {
        let reserved = reserve_pages(3 * PAGE_SIZE);
        assert!(!reserved.is_null());
        assert!(commit_pages(reserved, PAGE_SIZE));
        let page = |n: usize| reserved as usize + n * PAGE_SIZE;
        assert!(page_is_mapped(page(0) + 100));
        assert!(
            !page_is_mapped(page(1)),
            "a PROT_NONE reserve cannot be read"
        );
        // SAFETY: pages of the reservation above, which nothing else uses.
        unsafe { unmap_pages(page(2) as *mut u8, PAGE_SIZE) };
        assert!(!page_is_mapped(page(2)), "an unmapped page");
        assert!(page_is_mapped(bytes_of(&reserved).start), "a stack page");
        // SAFETY: as above.
        unsafe { unmap_pages(reserved, 2 * PAGE_SIZE) };
    }

    #[test]
    fn words_are_read_up_to_the_first_page_that_cannot_be_read_and_only_touched_pages_count() {
        let reserved = reserve_pages(4 * PAGE_SIZE);
        assert!(commit_pages(reserved, 2 * PAGE_SIZE));
        let words_per_page = PAGE_SIZE / core::mem::size_of::<usize>();
        // SAFETY: the first page of the reservation, committed above and ours alone.
        unsafe {
            reserved
                .cast::<usize>()
                .add(words_per_page - 1)
                .write(0x1234)
        };
        let mut residency = [9u8; 4];
        assert!(resident_pages(reserved as usize, &mut residency));
        assert_eq!(
            residency,
            [1, 0, 0, 0],
            "only the page written holds memory"
        );
        // From the middle of the first page across the second (readable) into the third (not).
        let start = reserved as usize + PAGE_SIZE / 2;
        let mut words = vec![7usize; 2 * words_per_page];
        let got = read_words(start, &mut words);
        assert_eq!(
            got,
            words_per_page / 2 + words_per_page,
            "stops at the PROT_NONE page"
        );
        assert_eq!(words[words_per_page / 2 - 1], 0x1234);
        assert!(words[words_per_page / 2..got].iter().all(|&w| w == 0));
        assert_eq!(read_words(reserved as usize + 2 * PAGE_SIZE, &mut words), 0);
        // SAFETY: pages of the reservation above, which nothing else uses.
        unsafe { unmap_pages(reserved.add(3 * PAGE_SIZE), PAGE_SIZE) };
        assert!(
            !resident_pages(reserved as usize, &mut residency),
            "part is unmapped"
        );
        // SAFETY: as above.
        unsafe { unmap_pages(reserved, 3 * PAGE_SIZE) };
    }
}
