//! Suspends the process's other threads for a leak scan, as the Boehm collector does: each one
//! is sent [`suspend_signal`], whose handler records where the thread stands (its general
//! registers, the stack pointer among them) and waits until the scan lets every thread go on.
//!
//! The scan then reads one moment: no thread moves a block from a register into a table, or
//! unmaps memory, while the blocks and the roots are read. A thread that blocks the signal
//! (`pthread_sigmask`), is exiting, or does not answer within [`PATIENCE`] is left running and
//! named in [`Suspension::running`]. The program's own handler for the signal, if it set one,
//! is never replaced: then no thread is suspended.
//!
//! The handler runs with every signal blocked, touches only atomics and makes only system calls
//! (`gettid`, `futex`), so it may land anywhere: inside glibc, inside the tracker. A blocked
//! system call the signal interrupts is restarted (`SA_RESTART`), but those the kernel never
//! restarts (`nanosleep`, `pause`, `epoll_wait`) return `EINTR` to the program, as under the
//! Boehm collector.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Threads one suspension can hold; the rest stay running.
const CAPACITY: usize = 4096;
/// Words of `mcontext_t`'s general registers (x86-64: 23).
pub const REGISTER_WORDS: usize = 23;
/// How long the suspending thread waits for all the others to answer: a thread that is
/// runnable answers as soon as it gets a core, within milliseconds even on a loaded machine.
const PATIENCE: Duration = Duration::from_millis(500);
/// After this long, a thread that has not answered is asked whether it blocks the signal or is
/// gone, rather than waited for.
const FIRST_LOOK: Duration = Duration::from_millis(5);

/// A record's states.
const FREE: u32 = 0;
/// The signal was sent; the thread's handler has not answered.
const ASKED: u32 = 1;
/// The thread's handler is writing its registers.
const ANSWERING: u32 = 2;
/// The thread is suspended: its registers are written.
const SUSPENDED: u32 = 3;
/// The thread did not answer: it runs on, and a late handler returns at once.
const GIVEN_UP: u32 = 4;

struct Record {
    tid: AtomicU32,
    state: AtomicU32,
    /// The [`ROUND`] the thread waits to end.
    round: AtomicU32,
    registers: [AtomicUsize; REGISTER_WORDS],
}

static RECORDS: [Record; CAPACITY] = [const {
    Record {
        tid: AtomicU32::new(0),
        state: AtomicU32::new(FREE),
        round: AtomicU32::new(0),
        registers: [const { AtomicUsize::new(0) }; REGISTER_WORDS],
    }
}; CAPACITY];
thread_local! {
    /// Whether the calling thread holds the others suspended (a [`Suspension`] of its own).
    static SUSPENDING: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Whether the calling thread holds the other threads suspended: a lock one of them holds stays
/// held until it lets them go, so it waits for none (`raw`'s share of the mappings' lock).
pub fn holds_others_suspended() -> bool {
    SUSPENDING.with(core::cell::Cell::get)
}

/// Records in use this round: a handler looks no further.
static IN_USE: AtomicUsize = AtomicUsize::new(0);
/// The futex suspended threads wait on: it changes when they may go on.
static ROUND: AtomicU32 = AtomicU32::new(0);
/// Whether the handler is installed.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The signal: a real-time one near the top (glibc keeps the first ones; the Boehm collector's
/// `SIGPWR` is also Mono's, which many games carry).
pub fn suspend_signal() -> c_int {
    libc::SIGRTMAX() - 3
}

/// Where the record's own words lie: they hold registers, not the program's pointers (the
/// registers are scanned through [`Suspension::threads`]).
pub fn records_range() -> core::ops::Range<usize> {
    crate::sys::bytes_of(&RECORDS)
}

/// A thread held by a [`Suspension`].
pub struct SuspendedThread {
    pub tid: u32,
    pub registers: [usize; REGISTER_WORDS],
}

impl SuspendedThread {
    /// The stack pointer when the signal landed.
    pub fn stack_pointer(&self) -> usize {
        self.registers[libc::REG_RSP as usize]
    }
}

/// The process's other threads, suspended until this is dropped.
pub struct Suspension {
    pub threads: Vec<SuspendedThread>,
    /// Threads still running: they block the signal, did not answer in time, or the program
    /// handles the signal itself.
    pub running: Vec<u32>,
    asked: usize,
}

fn gettid() -> u32 {
    // SAFETY: gettid takes nothing and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// The process's threads now (`/proc/self/task`), thread `me` excluded.
pub fn other_threads(me: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| task.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&tid| tid != me)
        .collect()
}

/// Sends the signal to thread `tid` of this process; false when it is gone.
fn signal(tid: u32, signal: c_int) -> bool {
    // SAFETY: tgkill takes plain values.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid as libc::pid_t, signal) == 0 }
}

/// Whether thread `tid` blocks (or ignores) the suspend signal, by `/proc`'s `SigBlk`.
fn blocks_signal(tid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"));
    let mask = status.ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("SigBlk:"))?;
        u64::from_str_radix(line["SigBlk:".len()..].trim(), 16).ok()
    });
    mask.is_none_or(|mask| mask & (1 << (suspend_signal() - 1)) != 0)
}

/// Installs the handler unless the program handles the signal itself; whether it is ours.
fn install_handler() -> bool {
    if INSTALLED.load(Ordering::Acquire) {
        return true;
    }
    // SAFETY: sigaction reads and writes locals of its types; the handler is async-signal-safe.
    unsafe {
        let mut current = core::mem::MaybeUninit::<libc::sigaction>::zeroed();
        if libc::sigaction(suspend_signal(), core::ptr::null(), current.as_mut_ptr()) != 0 {
            return false;
        }
        let current = current.assume_init();
        if current.sa_sigaction != libc::SIG_DFL && current.sa_sigaction != libc::SIG_IGN {
            return false; // the program's own
        }
        let mut action = core::mem::MaybeUninit::<libc::sigaction>::zeroed().assume_init();
        let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = on_suspend_signal;
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigfillset(&mut action.sa_mask);
        if libc::sigaction(suspend_signal(), &action, core::ptr::null_mut()) != 0 {
            return false;
        }
    }
    INSTALLED.store(true, Ordering::Release);
    true
}

/// The handler: records the thread's registers and waits for the round to end.
extern "C" fn on_suspend_signal(_signal: c_int, _info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: errno is the thread's own; restored before returning.
    let errno = unsafe { *libc::__errno_location() };
    let me = gettid();
    let in_use = IN_USE.load(Ordering::Acquire).min(CAPACITY);
    if let Some(record) = RECORDS[..in_use]
        .iter()
        .find(|r| r.tid.load(Ordering::Acquire) == me)
    {
        let answering = record
            .state
            .compare_exchange(ASKED, ANSWERING, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if answering && record.tid.load(Ordering::Acquire) != me {
            // The record serves another thread since it was found (a later round).
            record.state.store(ASKED, Ordering::Release);
        } else if answering {
            let round = record.round.load(Ordering::Acquire);
            // SAFETY: the kernel passes the interrupted context to an SA_SIGINFO handler.
            let registers = unsafe { &(*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
            for (word, &value) in record.registers.iter().zip(registers) {
                word.store(value as usize, Ordering::Relaxed);
            }
            record.state.store(SUSPENDED, Ordering::Release);
            while ROUND.load(Ordering::Acquire) == round {
                futex(&ROUND, libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, round);
            }
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn futex(word: &AtomicU32, op: c_int, value: u32) {
    // SAFETY: a futex call on a live atomic; no timeout, no second word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            value,
            core::ptr::null::<libc::timespec>(),
        );
    }
}

impl Suspension {
    /// No thread suspended (a report inside another stop of the world, which may be suspending
    /// threads itself): every other thread is read as it runs.
    pub fn none() -> Suspension {
        Suspension {
            threads: Vec::new(),
            running: Vec::new(),
            asked: 0,
        }
    }

    /// Whether every other thread of the process was suspended (or has exited): none runs.
    pub fn holds_every_other(&self) -> bool {
        self.asked > 0 && self.running.is_empty()
    }

    /// The suspended thread `tid`, if it is.
    pub fn thread(&self, tid: u32) -> Option<&SuspendedThread> {
        self.threads.iter().find(|t| t.tid == tid)
    }

    /// Suspends every other thread of the process that answers (see the module doc). One at a
    /// time: the caller holds the stopped world (`live_list::StoppedWorld`), which only one
    /// thread does.
    pub fn suspend_others() -> Suspension {
        let me = gettid();
        let mut suspension = Suspension::none();
        if !install_handler() {
            suspension.running = other_threads(me);
            return suspension;
        }
        SUSPENDING.with(|suspending| suspending.set(true));
        let round = ROUND.load(Ordering::Relaxed);
        let started = Instant::now();
        // Threads started meanwhile by one not yet suspended: asked in a later pass.
        for _pass in 0..3 {
            let new: Vec<u32> = other_threads(me)
                .into_iter()
                .filter(|tid| {
                    !RECORDS[..suspension.asked]
                        .iter()
                        .any(|r| r.tid.load(Ordering::Relaxed) == *tid)
                        && !suspension.running.contains(tid)
                })
                .collect();
            if new.is_empty() {
                break;
            }
            let first = suspension.asked;
            for tid in new {
                if suspension.asked == CAPACITY || blocks_signal(tid) {
                    // Not signalled: a blocked real-time signal would stay queued.
                    suspension.running.push(tid);
                    continue;
                }
                let record = &RECORDS[suspension.asked];
                record.tid.store(tid, Ordering::Relaxed);
                record.round.store(round, Ordering::Relaxed);
                record.state.store(ASKED, Ordering::Release);
                suspension.asked += 1;
                IN_USE.store(suspension.asked, Ordering::Release);
                if !signal(tid, suspend_signal()) {
                    give_up(record);
                }
            }
            wait_for_answers(&RECORDS[first..suspension.asked], started);
        }
        for record in &RECORDS[..suspension.asked] {
            let tid = record.tid.load(Ordering::Relaxed);
            if record.state.load(Ordering::Acquire) == SUSPENDED {
                suspension.threads.push(SuspendedThread {
                    tid,
                    registers: record
                        .registers
                        .each_ref()
                        .map(|w| w.load(Ordering::Relaxed)),
                });
            } else if signal(tid, 0) {
                suspension.running.push(tid);
            }
        }
        suspension
    }
}

/// Marks a record's thread as not suspended, unless its handler is answering (then waits for
/// it: it is running on a core, writing registers).
fn give_up(record: &Record) {
    loop {
        match record
            .state
            .compare_exchange(ASKED, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) | Err(SUSPENDED | GIVEN_UP) => return,
            Err(_) => std::thread::yield_now(),
        }
    }
}

/// Waits until each record's thread answered, is gone, blocks the signal, or [`PATIENCE`]
/// (counted from `started`) is spent.
fn wait_for_answers(records: &[Record], started: Instant) {
    let mut looked = false;
    loop {
        let waiting: Vec<&Record> = records
            .iter()
            .filter(|r| r.state.load(Ordering::Acquire) < SUSPENDED)
            .collect();
        if waiting.is_empty() {
            return;
        }
        let waited = started.elapsed();
        if waited >= PATIENCE {
            waiting.into_iter().for_each(give_up);
            return;
        }
        if waited >= FIRST_LOOK && !looked {
            looked = true;
            for record in waiting {
                let tid = record.tid.load(Ordering::Relaxed);
                if !signal(tid, 0) || blocks_signal(tid) {
                    give_up(record);
                }
            }
            continue;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

impl Drop for Suspension {
    /// Lets every suspended thread go on; the records serve again.
    fn drop(&mut self) {
        SUSPENDING.with(|suspending| suspending.set(false));
        if self.asked == 0 {
            return;
        }
        for record in &RECORDS[..self.asked] {
            give_up(record); // a late handler returns at once
        }
        ROUND.fetch_add(1, Ordering::Release);
        futex(
            &ROUND,
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX as u32,
        );
        IN_USE.store(0, Ordering::Release);
        for record in &RECORDS[..self.asked] {
            record.tid.store(0, Ordering::Relaxed);
            record.state.store(FREE, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn suspended_threads_stop_counting_until_let_go_and_give_their_stack_pointer() {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        static STOP: AtomicBool = AtomicBool::new(false);
        let worker = std::thread::spawn(|| {
            while !STOP.load(Ordering::Relaxed) {
                COUNT.fetch_add(1, Ordering::Relaxed);
            }
            let here = 0u8;
            core::ptr::addr_of!(here) as usize
        });
        while COUNT.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        let suspension = Suspension::suspend_others();
        assert!(!suspension.threads.is_empty(), "{:?}", suspension.running);
        let before = COUNT.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(COUNT.load(Ordering::Relaxed), before, "a thread ran on");
        let sps: Vec<usize> = suspension
            .threads
            .iter()
            .map(|t| t.stack_pointer())
            .collect();
        drop(suspension);
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            COUNT.load(Ordering::Relaxed) > before,
            "a thread stayed suspended"
        );
        STOP.store(true, Ordering::Relaxed);
        let on_stack = worker.join().unwrap();
        assert!(
            sps.iter().any(|&sp| sp.abs_diff(on_stack) < 64 * 1024),
            "{sps:x?} against {on_stack:x}"
        );
    }
}
