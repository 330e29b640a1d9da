//! `timeline=PATH`: live bytes per tag and the process's RSS over time, streamed as Chrome trace event JSON.
//!
//! A sample is taken at every `frame_mark()`, and every 10 ms by a timer thread of the
//! tracker's until the program marks its first frame. Nothing is done per allocation: a sample
//! reads the counters the allocation path keeps anyway (`tags::sums`, `live_list::totals`).
//!
//! The file is valid JSON after every write, so that whatever ends the process (a return from
//! `main`, `exit` from a signal handler, a fatal signal, `_exit` in a forked child) leaves a file
//! a reader opens: each sample is written in one `pwrite`, with the closing `]}` after it, at
//! the offset where the last sample's `]}` began. Nothing is held in memory but one sample.

use super::fork::{self, ForkPhase};
use super::guard::Inside;
use super::{live_list, tags};
use crate::sys::StackBuffer;
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often the timer thread samples while the program marks no frames.
const TIMER_PERIOD: Duration = Duration::from_millis(10);

/// What closes the file after every sample (overwritten by the next one).
const TRAILER: &str = "\n],\"displayTimeUnit\":\"ms\"}\n";

/// One sample's events: 255 tags with 16 KiB of names, each name byte escaped to at most six.
const SAMPLE_BYTES: usize = 128 * 1024;

struct Timeline {
    /// The file, -1 when off (not asked for, not opened, or a forked child without `%p`).
    fd: i32,
    /// Where the next event goes: the offset of the trailer.
    end: i64,
    /// The origin of `ts` (kept by a forked child, so that both files share one clock).
    started: Option<Instant>,
    pid: u32,
}

static TIMELINE: Mutex<Timeline> = Mutex::new(Timeline {
    fd: -1,
    end: 0,
    started: None,
    pid: 0,
});

/// One sample's events, locked only by a holder of [`TIMELINE`]. A static of its own, all zero,
/// so that it lies in `.bss` and costs no resident page in a process that writes no timeline:
/// in `TIMELINE` (whose `fd` and `started` are not zero) it put 128 KiB into `.data`, which a
/// program's first reads there map 64 KiB at a time.
static EVENTS: Mutex<StackBuffer<SAMPLE_BYTES>> = Mutex::new(StackBuffer::new());

/// Where the timeline's text waits to be written, which a leak scan skips.
pub fn events_range() -> core::ops::Range<usize> {
    crate::sys::bytes_of(&EVENTS)
}

fn events() -> MutexGuard<'static, StackBuffer<SAMPLE_BYTES>> {
    EVENTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Set at the first frame mark (the timer thread stops) and at exit.
static TIMER_STOPPED: AtomicBool = AtomicBool::new(false);

/// The timer thread's `pthread_t`, 0 when there is none to join (never started, joined, or a
/// forked child's: the thread is not in the child).
static TIMER_THREAD: AtomicUsize = AtomicUsize::new(0);

/// How long the exit waits for the timer thread to end (it wakes every 10 ms).
const TIMER_JOIN_LIMIT: Duration = Duration::from_millis(100);

/// Opens the timeline if `timeline=` asks for one and starts the timer thread. Called once, at
/// start-up (`process::start_up`), outside any allocation.
pub fn start() {
    let Some(path) = &crate::options::get().timeline else {
        return;
    };
    let _inside = Inside::enter();
    fork::take_part(ForkPhase::Last, |guards| {
        guards.push(Box::new(lock()));
    });
    let Ok(mut timeline) = TIMELINE.lock() else {
        return;
    };
    timeline.started = Some(Instant::now());
    if !timeline.open(path.as_str()) {
        return;
    }
    timeline.sample(None);
    drop(timeline);
    // A bare pthread, not `std::thread`: std's spawned threads allocate (their spawn hooks)
    // before running the closure, outside the tracker, and the user's report would list them.
    let mut timer = core::mem::MaybeUninit::<libc::pthread_t>::uninit();
    // SAFETY: `sample_until_the_first_frame` takes no argument and lives for the whole process;
    // the thread is joined at exit (`at_exit`).
    let failed = unsafe {
        libc::pthread_create(
            timer.as_mut_ptr(),
            core::ptr::null(),
            sample_until_the_first_frame,
            core::ptr::null_mut(),
        )
    };
    if failed == 0 {
        // SAFETY: pthread_create succeeded, so it wrote the thread's id.
        TIMER_THREAD.store(unsafe { timer.assume_init() } as usize, Ordering::Release);
    } else {
        crate::sys::write_fd(
            2,
            b"k15-memory: timeline: no timer thread: samples at frame marks only\n",
        );
    }
}

/// Waits (a bounded time) for the timer thread to end: the exit frees the C and C++ runtimes'
/// caches only when the program's threads are gone (`malloc::release_runtime_caches`), and the
/// timer thread must not count as one of them.
fn join_the_timer() {
    let timer = TIMER_THREAD.swap(0, Ordering::AcqRel);
    if timer == 0 {
        return;
    }
    let mut now = core::mem::MaybeUninit::<libc::timespec>::uninit();
    // SAFETY: clock_gettime writes `now`; the thread id is the timer's, joined once (swapped
    // out above). A timer blocked on the timeline's lock held by the thread a signal handler
    // interrupted is left behind after the limit.
    unsafe {
        libc::clock_gettime(libc::CLOCK_REALTIME, now.as_mut_ptr());
        let mut until = now.assume_init();
        until.tv_nsec += TIMER_JOIN_LIMIT.as_nanos() as libc::c_long;
        until.tv_sec += until.tv_nsec / 1_000_000_000;
        until.tv_nsec %= 1_000_000_000;
        libc::pthread_timedjoin_np(timer as libc::pthread_t, core::ptr::null_mut(), &until);
    }
}

fn lock() -> MutexGuard<'static, Timeline> {
    TIMELINE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The timer thread: its own allocations are the tracker's (untracked) for its whole life.
extern "C" fn sample_until_the_first_frame(_: *mut libc::c_void) -> *mut libc::c_void {
    let _inside = Inside::enter();
    // The program's signals (a SIGTERM whose handler calls `exit`) go to the program's threads.
    let mut all = core::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigfillset initializes `all`; pthread_sigmask changes this thread's mask only.
    unsafe {
        libc::sigfillset(all.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_BLOCK, all.as_ptr(), core::ptr::null_mut());
    }
    loop {
        std::thread::sleep(TIMER_PERIOD);
        if TIMER_STOPPED.load(Ordering::Relaxed) {
            return core::ptr::null_mut();
        }
        lock().sample(None);
    }
}

/// A frame mark: `marks` marks so far (the first ends start-up).
pub fn at_frame_mark(marks: u64) {
    TIMER_STOPPED.store(true, Ordering::Relaxed);
    lock().sample(Some(marks));
}

/// The last sample, at exit (before the report is collected).
pub fn at_exit() {
    TIMER_STOPPED.store(true, Ordering::Relaxed);
    join_the_timer();
    // A signal handler's `exit` may have interrupted a sample on this very thread.
    if let Ok(mut timeline) = TIMELINE.try_lock() {
        timeline.sample(None);
    }
}

/// In a forked child, after a fork that held the timeline's lock (`prepared`): the child
/// writes its own file where the path has `%p`, else none (the parent's file is the parent's).
/// The timer thread is not in the child: it samples at its frame marks and at exit.
pub fn in_forked_child(prepared: bool) {
    TIMER_THREAD.store(0, Ordering::Relaxed);
    let Ok(mut timeline) = TIMELINE.try_lock() else {
        return; // unprepared, and another thread of the parent held it: left as it is
    };
    if timeline.fd < 0 {
        return;
    }
    // SAFETY: the child's own copy of the descriptor, used by nobody else in the child.
    unsafe { libc::close(timeline.fd) };
    timeline.fd = -1;
    let path = crate::options::get().timeline.as_ref().map(|p| p.as_str());
    if let Some(path) = path.filter(|p| prepared && p.contains("%p")) {
        let _inside = Inside::enter();
        if timeline.open(path) {
            timeline.sample(None);
        }
    }
}

impl Timeline {
    /// Creates the file at `template` (`%p`: this process's pid) with its header; false, with
    /// a line on stderr, if it cannot be.
    fn open(&mut self, template: &str) -> bool {
        self.pid = std::process::id();
        let path = crate::sys::from_launch_dir(&template.replace("%p", &self.pid.to_string()));
        let Ok(c_path) = std::ffi::CString::new(path.as_str()) else {
            return false;
        };
        // SAFETY: a NUL-terminated path; the descriptor is kept in `self.fd` and closed by a
        // forked child only.
        let fd = unsafe {
            libc::open(
                c_path.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
                0o644,
            )
        };
        if fd < 0 {
            let why = std::io::Error::last_os_error();
            crate::sys::write_fd(
                2,
                format!("k15-memory: timeline={template}: cannot create {path}: {why}\n")
                    .as_bytes(),
            );
            return false;
        }
        self.fd = fd;
        self.end = 0;
        let mut events = events();
        events.clear();
        let _ = write!(
            events,
            "{{\"traceEvents\":[\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":\"k15-memory timeline\"}}}}",
            self.pid
        );
        self.append(&mut events);
        true
    }

    /// Writes the counters now (and the frame mark, for `Some(marks)`), while the file is open.
    fn sample(&mut self, marks: Option<u64>) {
        if self.fd < 0 {
            return;
        }
        let ts = self.started.map_or(0, |s| s.elapsed().as_micros() as u64);
        let pid = self.pid;
        let process = live_list::totals();
        let mut events = events();
        events.clear();
        if let Some(marks) = marks {
            let _ = write!(
                events,
                ",\n{{\"name\":\"frame_mark\",\"ph\":\"i\",\"s\":\"g\",\"ts\":{ts},\"pid\":{pid},\"tid\":0,\"args\":{{\"marks\":{marks}}}}}"
            );
        }
        let _ = write!(
            events,
            ",\n{{\"name\":\"process\",\"ph\":\"C\",\"ts\":{ts},\"pid\":{pid},\"tid\":0,\"args\":{{\"live_bytes\":{},\"rss_bytes\":{}}}}}",
            process.live_bytes,
            resident_bytes()
        );
        let ids = tags::ids();
        if !ids.is_empty() {
            let _ = write!(
                events,
                ",\n{{\"name\":\"live bytes by tag\",\"ph\":\"C\",\"ts\":{ts},\"pid\":{pid},\"tid\":0,\"args\":{{"
            );
            for (n, id) in ids.enumerate() {
                let _ = events.write_str(if n == 0 { "\"" } else { ",\"" });
                write_json_escaped(&mut *events, tags::name_of(id));
                let _ = write!(events, "\":{}", tags::sums(id).live_bytes);
            }
            let _ = events.write_str("}}");
        }
        self.append(&mut events);
    }

    /// Writes the events gathered, and the trailer after them, in one `pwrite`.
    fn append(&mut self, events: &mut StackBuffer<SAMPLE_BYTES>) {
        let before_trailer = events.as_bytes().len() as i64;
        let _ = events.write_str(TRAILER);
        if events.truncated() {
            return; // cannot happen (see SAMPLE_BYTES); a cut sample would break the file
        }
        let bytes = events.as_bytes();
        // SAFETY: a live buffer of `bytes.len()` bytes; `self.fd` is this process's own file.
        let written = unsafe {
            libc::pwrite(
                self.fd,
                bytes.as_ptr() as *const libc::c_void,
                bytes.len(),
                self.end,
            )
        };
        if written == bytes.len() as isize {
            self.end += before_trailer;
            return;
        }
        // A full disk, `/dev/full`, a file cut short under it: said once, and the timeline
        // stops there, valid as it was written so far.
        let why = if written < 0 {
            std::io::Error::last_os_error().to_string()
        } else {
            format!("{written} of {} bytes written", bytes.len())
        };
        crate::sys::write_fd(
            2,
            format!("k15-memory: timeline: cannot write its samples ({why}): it stops here\n")
                .as_bytes(),
        );
        // SAFETY: this process's own descriptor, used by nobody else.
        unsafe { libc::close(self.fd) };
        self.fd = -1;
    }
}

/// The process's resident set in bytes (`/proc/self/statm`'s second field), 0 if unreadable.
fn resident_bytes() -> u64 {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/statm".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return 0;
    }
    let mut text = [0u8; 128];
    // SAFETY: reads at most `text.len()` bytes into `text`; then closes the descriptor opened
    // above.
    let read = unsafe {
        let read = libc::read(fd, text.as_mut_ptr() as *mut libc::c_void, text.len());
        libc::close(fd);
        read
    };
    let text = &text[..read.max(0) as usize];
    let pages = core::str::from_utf8(text)
        .ok()
        .and_then(|t| t.split_ascii_whitespace().nth(1))
        .and_then(|p| p.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    pages * page
}

/// `name` as the inside of a JSON string (tag names are the program's: any bytes).
fn write_json_escaped<W: Write>(out: &mut W, name: &[u8]) {
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            let _ = match c {
                '"' => out.write_str("\\\""),
                '\\' => out.write_str("\\\\"),
                c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32),
                c => out.write_char(c),
            };
        }
        if !chunk.invalid().is_empty() {
            let _ = out.write_str("\\ufffd");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::write_json_escaped;

    #[test]
    fn tag_names_are_escaped_into_json_strings() {
        let mut out = String::new();
        write_json_escaped(&mut out, b"Render/\"Main\"\\\n\xff");
        let parsed: String = serde_json::from_str(&format!("\"{out}\"")).unwrap();
        assert_eq!(parsed, "Render/\"Main\"\\\n\u{fffd}");
    }
}
