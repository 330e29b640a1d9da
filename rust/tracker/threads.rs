//! The process's other threads, so that a report scans what they hold, as valgrind and
//! LeakSanitizer do: each one's stack from where it stands now (its `thread_local`s lie above,
//! at the top of its stack's mapping), leaving out the tracker's own state in it, and its
//! registers. A thread the report suspended (`tracker::suspend`) gives both as it was stopped.
//!
//! For a thread still running (it blocks the suspend signal), registers come from
//! [`registers_of`] (midway only where that needs no tracer named), and where it stands is asked
//! of the kernel (`/proc/self/task/TID/syscall`: the stack
//! pointer of a thread blocked in a system call or waiting to run); a thread running on another
//! core at that moment gives none, and its whole stack mapping is read if the record of threads
//! knows it: those the program started (recorded as they start, `cpp/threads.cpp`) and those
//! that allocated, with where the tracker's state lies in each.

use crate::tracker::suspend::Suspension;
use core::ops::Range;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

/// Set once the report at exit has begun: the process is going, and what a report does to its
/// other threads (naming itself their tracer for a moment) no longer matters to it.
static EXIT_REPORT_BEGUN: AtomicBool = AtomicBool::new(false);

/// Marks the report at exit as begun; false if it had begun already (it runs once).
pub fn begin_exit_report() -> bool {
    !EXIT_REPORT_BEGUN.swap(true, Ordering::AcqRel)
}

/// Whether the report at exit has begun.
pub fn exit_report_begun() -> bool {
    EXIT_REPORT_BEGUN.load(Ordering::Acquire)
}

/// Threads alive at once that the record keeps (one more goes unscanned).
const CAPACITY: usize = 4096;
/// The bytes below the stack pointer that x86-64's ABI leaves to a leaf function.
const RED_ZONE: usize = 128;
/// The tracker's own state in a thread: its stack walk, its guard and its heap lists.
const OWN_RANGES: usize = 3;
/// A slot being written.
const WRITING: u32 = u32::MAX;

struct Slot {
    /// The thread's id (0: free).
    tid: AtomicU32,
    /// An address on the thread's stack: its stack's mapping, where the kernel gives no stack
    /// pointer.
    on_stack: AtomicUsize,
    /// [`OWN_RANGES`] ranges, start and end.
    own: [AtomicUsize; 2 * OWN_RANGES],
}

static SLOTS: [Slot; CAPACITY] = [const {
    Slot {
        tid: AtomicU32::new(0),
        on_stack: AtomicUsize::new(0),
        own: [const { AtomicUsize::new(0) }; 2 * OWN_RANGES],
    }
}; CAPACITY];

/// One past the highest slot ever claimed: the loops over the record stop there, so that a
/// forked child, which clears the others' slots, writes only pages that hold some (every page
/// it writes costs a fault in the child, and in the parent after it too).
static SLOTS_USED: AtomicUsize = AtomicUsize::new(0);

/// The slots claimed so far (some may be free again).
fn used_slots() -> &'static [Slot] {
    &SLOTS[..SLOTS_USED.load(Ordering::Acquire)]
}

/// The record's own bytes, which hold stack addresses: not the program's pointers.
pub fn record_range() -> Range<usize> {
    crate::sys::bytes_of(&SLOTS)
}

fn gettid() -> u32 {
    // SAFETY: gettid takes nothing and cannot fail.
    unsafe { libc::gettid() as u32 }
}

std::thread_local! {
    /// The calling thread's slot, plus one (0: it holds none).
    static MINE: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// The calling thread, when it starts (the program's `pthread_create`) or at its first
/// allocation, whichever comes first: `own` is the tracker's state in it.
pub fn register(own: [Range<usize>; OWN_RANGES]) {
    if MINE.try_with(core::cell::Cell::get) != Ok(0) {
        return; // in the record already
    }
    let on_stack = core::ptr::from_ref(&own) as usize;
    let Some(index) = SLOTS.iter().position(|slot| {
        slot.tid.load(Ordering::Relaxed) == 0
            && slot
                .tid
                .compare_exchange(0, WRITING, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }) else {
        return;
    };
    SLOTS_USED.fetch_max(index + 1, Ordering::AcqRel);
    let slot = &SLOTS[index];
    slot.on_stack.store(on_stack, Ordering::Relaxed);
    for (i, range) in own.iter().enumerate() {
        slot.own[2 * i].store(range.start, Ordering::Relaxed);
        slot.own[2 * i + 1].store(range.end, Ordering::Relaxed);
    }
    slot.tid.store(gettid(), Ordering::Release);
    let _ = MINE.try_with(|mine| mine.set(index + 1));
}

/// Whether the calling thread is the only one that has used the tracker and not exited: then
/// no other thread can be changing a heap header (a thread is in the record before its first
/// allocation or free, `guard::join`).
pub fn alone() -> bool {
    let mine = MINE.try_with(core::cell::Cell::get).unwrap_or(0);
    mine != 0
        && used_slots()
            .iter()
            .enumerate()
            .all(|(index, slot)| index + 1 == mine || slot.tid.load(Ordering::Acquire) == 0)
}

/// The calling thread is exiting.
pub fn unregister() {
    if let Ok(Some(index)) = MINE.try_with(|mine| mine.replace(0).checked_sub(1)) {
        SLOTS[index].tid.store(0, Ordering::Release);
    }
}

/// In a forked child: only the forking thread came along, under a new id.
pub fn forget_others() {
    let mine = MINE
        .try_with(core::cell::Cell::get)
        .unwrap_or(0)
        .checked_sub(1);
    for (index, slot) in used_slots().iter().enumerate() {
        if Some(index) == mine {
            slot.tid.store(gettid(), Ordering::Release);
        } else if slot.tid.load(Ordering::Relaxed) != 0 {
            slot.tid.store(0, Ordering::Release);
        }
    }
}

/// What a report reads of the other threads: the live part of each one's stack, and the
/// tracker's own state in them, to leave out.
pub struct OtherThreads {
    pub stacks: Vec<Range<usize>>,
    pub own_state: Vec<Range<usize>>,
    /// Their general registers, as words ([`registers_of`]), where they can be read.
    pub registers: Vec<usize>,
}

/// The process's other threads now (`/proc/self/task`): those `suspension` holds from the stack
/// pointer and with the registers they were suspended with; the others (still running) as the
/// record knows them, scanned where the kernel says they stand (one running on a core then,
/// which the record does not know, is not).
pub fn others(suspension: &Suspension) -> OtherThreads {
    let me = gettid();
    let mut found = OtherThreads {
        stacks: Vec::new(),
        own_state: Vec::new(),
        registers: Vec::new(),
    };
    let tids = crate::tracker::suspend::other_threads(me);
    let running: Vec<u32> = tids
        .iter()
        .copied()
        .filter(|&tid| suspension.thread(tid).is_none())
        .collect();
    found.registers = match tracing() {
        Tracing::Open => registers_of(&running, false),
        // Naming a tracer replaces the one the program may have named: only once it exits.
        Tracing::ByNamedTracer if exit_report_begun() => registers_of(&running, true),
        _ => Vec::new(),
    };
    for thread in &suspension.threads {
        found.registers.extend(thread.registers);
    }
    let maps = Mappings::read();
    for tid in tids {
        let standing = match suspension.thread(tid) {
            // The red zone below the stack pointer may hold a leaf function's locals.
            Some(thread) => Some(Some(thread.stack_pointer().saturating_sub(RED_ZONE))),
            None => stack_pointer_of(tid),
        };
        let Some(standing) = standing else {
            continue; // gone meanwhile
        };
        let slot = used_slots()
            .iter()
            .find(|slot| slot.tid.load(Ordering::Acquire) == tid);
        let on_stack = slot.map_or(0, |slot| slot.on_stack.load(Ordering::Relaxed));
        let stack = match standing.and_then(|sp| Some((sp, maps.containing(sp)?))) {
            Some((sp, mapping)) => sp..mapping.end,
            None => maps.containing(on_stack).unwrap_or(0..0),
        };
        found.stacks.push(stack);
        if let Some(slot) = slot {
            let own = slot.own.each_ref().map(|word| word.load(Ordering::Relaxed));
            found
                .own_state
                .extend(own.chunks(2).map(|range| range[0]..range[1]));
        }
    }
    found
}

/// Whether the helper of [`registers_of`] may trace this process's threads (Yama's
/// `ptrace_scope`).
enum Tracing {
    /// No Yama, scope 0, or scope 2 (a helper with `CAP_SYS_PTRACE` may, others fail alone).
    Open,
    /// Scope 1: only a tracer the process named (`PR_SET_PTRACER`).
    ByNamedTracer,
    /// Scope 3: nobody.
    Closed,
}

fn tracing() -> Tracing {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Ok(scope) if scope.trim() == "1" => Tracing::ByNamedTracer,
        Ok(scope) if scope.trim() == "3" => Tracing::Closed,
        _ => Tracing::Open,
    }
}

/// Words of x86-64's `user_regs_struct`.
const REGISTER_WORDS: usize = size_of::<libc::user_regs_struct>() / 8;
/// A thread's slot in the helper's answer: a mark (1: read), then its registers.
const ANSWER_WORDS: usize = 1 + REGISTER_WORDS;

/// The general registers of threads `tids`, read through ptrace by a helper process (as
/// LeakSanitizer reads them), so that a pointer a thread holds only in a register (a
/// callee-saved one across a call, at `-O2`) is a root, as valgrind finds. Each thread stops
/// for its read alone; a blocked system call restarts as after any stop. A thread that cannot be
/// traced (a debugger holds it, the system forbids ptrace) gives none. `name_tracer`: the helper
/// is named the process's tracer first (Yama's scope 1), which replaces whatever the program
/// named.
fn registers_of(tids: &[u32], name_tracer: bool) -> Vec<usize> {
    if tids.is_empty() {
        return Vec::new();
    }
    let bytes = (tids.len() * ANSWER_WORDS * 8).next_multiple_of(crate::sys::PAGE_SIZE);
    let mut go = [0; 2];
    // SAFETY: pipe2 fills the two-element array it is given.
    if unsafe { libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Vec::new();
    }
    let shared = crate::sys::map_shared(bytes).cast::<usize>();
    if shared.is_null() {
        // SAFETY: the pipe's ends are this function's.
        unsafe {
            libc::close(go[0]);
            libc::close(go[1]);
        }
        return Vec::new();
    }
    // SAFETY: a fresh zeroed mapping of `bytes`, this function's alone until unmapped below.
    let answer = unsafe { core::slice::from_raw_parts_mut(shared, bytes / 8) };
    // A child with no exit signal: the program's SIGCHLD handler and its waits never see it.
    // SAFETY: a fork without atfork handlers: the child only makes system calls, then exits.
    let child = unsafe { libc::syscall(libc::SYS_clone, 0usize, 0usize, 0usize, 0usize, 0usize) };
    if child == 0 {
        helper_ends_soon();
        let mut byte = 0u8;
        // SAFETY: reads one byte into a local.
        while unsafe { libc::read(go[0], (&raw mut byte).cast(), 1) } < 0 && interrupted() {}
        for (tid, slot) in tids.iter().zip(answer.chunks_mut(ANSWER_WORDS)) {
            read_registers(*tid as libc::pid_t, slot);
        }
        // SAFETY: ends the helper without running anything of the program's.
        unsafe { libc::_exit(0) };
    }
    if child > 0 {
        if name_tracer {
            // SAFETY: prctl takes plain values.
            unsafe { libc::prctl(libc::PR_SET_PTRACER, child as libc::c_ulong, 0, 0, 0) };
        }
        crate::sys::write_fd(go[1], b"g");
        // SAFETY: waitpid writes a local.
        unsafe {
            let mut status = 0;
            while libc::waitpid(child as libc::pid_t, &mut status, libc::__WALL) < 0
                && interrupted()
            {}
        }
    }
    let registers = answer
        .chunks(ANSWER_WORDS)
        .take(tids.len())
        .filter(|slot| slot[0] == 1)
        .flat_map(|slot| slot[1..].iter().copied())
        .collect();
    // SAFETY: the pipe's ends and the mapping are this function's; the helper is gone.
    unsafe {
        libc::close(go[0]);
        libc::close(go[1]);
        crate::sys::unmap_pages(shared.cast(), bytes);
    }
    registers
}

/// Whether the last system call was interrupted by a signal (and is to be made again).
fn interrupted() -> bool {
    std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
}

/// In the helper, first: no signal runs the program's handlers in it (it is a copy of the
/// process), and an alarm ends it within 5 s whatever happens (a thread that never stops, a
/// parent that never says go).
fn helper_ends_soon() {
    // SAFETY: sets this process's signal mask and SIGALRM's disposition from locals.
    unsafe {
        let mut all = core::mem::MaybeUninit::<libc::sigset_t>::zeroed();
        libc::sigfillset(all.as_mut_ptr());
        libc::sigdelset(all.as_mut_ptr(), libc::SIGALRM);
        libc::sigprocmask(libc::SIG_SETMASK, all.as_ptr(), core::ptr::null_mut());
        libc::signal(libc::SIGALRM, libc::SIG_DFL);
        libc::alarm(5);
    }
}

/// In the helper: stops thread `tid`, copies its registers into `slot` (marked read) and lets it
/// go on; a signal that stopped it first is delivered as it goes on.
fn read_registers(tid: libc::pid_t, slot: &mut [usize]) {
    let mut status = 0;
    let mut regs = core::mem::MaybeUninit::<libc::user_regs_struct>::zeroed();
    // SAFETY: ptrace requests on a thread of the parent, and waitpid into a local; the registers
    // are written into a local of their type.
    unsafe {
        if libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) != 0 {
            return;
        }
        if libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) != 0
            || libc::waitpid(tid, &mut status, libc::__WALL) != tid
            || !libc::WIFSTOPPED(status)
        {
            libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0);
            return;
        }
        let pending = if status >> 16 == libc::PTRACE_EVENT_STOP {
            0
        } else {
            libc::WSTOPSIG(status)
        };
        if libc::ptrace(libc::PTRACE_GETREGS, tid, 0, regs.as_mut_ptr()) == 0 {
            let words = core::slice::from_raw_parts(regs.as_ptr().cast::<usize>(), REGISTER_WORDS);
            slot[1..].copy_from_slice(words);
            slot[0] = 1;
        }
        libc::ptrace(libc::PTRACE_DETACH, tid, 0, pending);
    }
}

/// Where thread `tid` stands: `None` if it is gone, `Some(None)` if the kernel gives no stack
/// pointer (it is running now).
fn stack_pointer_of(tid: u32) -> Option<Option<usize>> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok()?;
    // "NR ARG1 .. ARG6 SP PC" in a system call, "-1 SP PC" when not, "running" when on a core.
    let fields: Vec<&str> = text.split_whitespace().collect();
    let sp = match fields.len() {
        3.. => fields[fields.len() - 2].strip_prefix("0x"),
        _ => None,
    };
    Some(sp.and_then(|hex| usize::from_str_radix(hex, 16).ok()))
}

/// The process's mappings, from `/proc/self/maps`.
struct Mappings(Vec<Range<usize>>);

impl Mappings {
    fn read() -> Mappings {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let range = |line: &str| {
            let (start, end) = line.split_whitespace().next()?.split_once('-')?;
            let hex = |s| usize::from_str_radix(s, 16).ok();
            Some(hex(start)?..hex(end)?)
        };
        Mappings(text.lines().filter_map(range).collect())
    }

    fn containing(&self, address: usize) -> Option<Range<usize>> {
        self.0.iter().find(|m| m.contains(&address)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots_of(tid: u32) -> usize {
        SLOTS
            .iter()
            .filter(|slot| slot.tid.load(Ordering::Acquire) == tid)
            .count()
    }

    #[test]
    fn a_thread_holds_one_slot_from_its_start_to_its_end() {
        let counts = std::thread::spawn(|| {
            let me = gettid();
            let own = || [0..0, 0..0, 0..0];
            register(own()); // as it starts
            register(own()); // at its first allocation
            let recorded = slots_of(me);
            unregister();
            let ended = slots_of(me);
            register(own()); // an allocation in a thread_local's destructor, after its end
            let again = slots_of(me);
            unregister();
            (recorded, ended, again, slots_of(me))
        })
        .join()
        .unwrap();
        assert_eq!(counts, (1, 0, 1, 0));
    }
}
