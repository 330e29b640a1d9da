//! Where a process writes its report: `%p` expanded, a forked child beside its parent, and which of a run's processes (under `LD_PRELOAD`) keeps the configured paths.
//!
//! Under `LD_PRELOAD` every process of a command writes a report: a launcher around the program
//! (`/usr/bin/time`, a shell script, ctest) and every process the program spawns (`system`, a
//! shader compiler, `/bin/true`). The configured paths keep the report of the run's busiest
//! process ([`Weight`]): the game's, not its launcher's or its helpers', whichever ends first. A
//! process that outweighs the report it finds there from this run moves that report beside it
//! (its pid appended) and takes the paths; otherwise it writes beside them. The choice and the
//! move happen under a lock on the report's directory, so two processes ending at once do not
//! both take the paths. A report from before the run began ([`join_the_run`]) is an earlier
//! run's, and is overwritten.

use super::Report;
use crate::options::Options;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;

/// How much a report matters to the reader of the configured paths, in order: how many
/// allocations its process made (a game makes millions, its launcher and the helpers it spawns a
/// few hundred; a shell that ran jobs in the background leaks hundreds of blocks of its own),
/// then whether it has findings (leaked blocks or memory errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Weight {
    allocations: u64,
    findings: bool,
}

impl Weight {
    pub fn of(report: &Report) -> Weight {
        Weight {
            findings: report.leaked().blocks > 0 || report.error_count > 0,
            allocations: report.stats.total_allocations,
        }
    }

    /// From a text report's last line (`SUMMARY: k15-memory: 0 bytes leaked in 0 blocks; 0
    /// memory errors; 350200 allocations in total, peak 6020499 bytes.`).
    fn of_summary(line: &str) -> Option<Weight> {
        let (_, counts) = line
            .strip_prefix("SUMMARY: k15-memory: ")?
            .split_once(" leaked in ")?;
        let mut numbers = counts
            .split("; ")
            .map(|part| part.split(' ').next()?.parse::<u64>().ok());
        let (blocks, errors, allocations) = (numbers.next()??, numbers.next()??, numbers.next()??);
        Some(Weight {
            findings: blocks + errors > 0,
            allocations,
        })
    }
}

/// Where this process's report goes, and the lock that keeps the choice until it is written.
pub struct Destination {
    pub text: String,
    pub json: String,
    /// The HTML page's path, with `html_path=`.
    pub html: Option<String>,
    /// What the stderr line adds when the paths are not simply the configured ones (empty, or
    /// a parenthesis with a leading space).
    pub note: String,
    _lock: Option<DirectoryLock>,
}

/// The paths for a report of `weight` ([`Destination`]); the lock is held until it is dropped,
/// after the report is written.
pub fn choose(options: &Options, weight: Weight) -> Destination {
    let text = crate::sys::from_launch_dir(options.log_path.as_str());
    let json = crate::sys::from_launch_dir(&options.json_path());
    let html = options
        .html_path
        .as_ref()
        .map(|path| crate::sys::from_launch_dir(path.as_str()));
    let pid = std::process::id();
    let beside = |lock, note| Destination {
        text: format!("{text}.{pid}"),
        json: format!("{json}.{pid}"),
        html: html.as_deref().map(|h| {
            if h.contains("%p") {
                with_pid(h)
            } else {
                format!("{h}.{pid}")
            }
        }),
        note,
        _lock: lock,
    };
    if text.contains("%p") {
        return Destination {
            text: with_pid(&text),
            json: with_pid(&json),
            html: html.as_deref().map(with_pid),
            note: String::new(),
            _lock: None,
        };
    }
    if crate::tracker::fork::is_forked_child() {
        return beside(None, String::new()); // its parent writes there
    }
    let lock = DirectoryLock::take(&text);
    let mut note = String::new();
    if written_during_this_run(&text) {
        match other_report(&text) {
            // This process's own report midway: written over.
            Some((other, _)) if other == pid => {}
            Some((other, theirs)) if weight > theirs => {
                let moved = format!("{text}.{other}");
                if std::fs::rename(&text, &moved).is_err() {
                    return beside(lock, format!(" ({text} could not be moved aside)"));
                }
                // Its JSON and page follow it if they are there; either may not be (a page
                // whose path has `%p` is its own already).
                let _ = std::fs::rename(&json, format!("{json}.{other}"));
                if let Some(h) = html.as_deref().filter(|h| !h.contains("%p")) {
                    let _ = std::fs::rename(h, format!("{h}.{other}"));
                }
                note = format!(
                    " (the report of pid {other}, another process of this run, is now {moved})"
                );
            }
            _ => {
                return beside(
                    lock,
                    format!(
                        " ({} was written by another process of this run)",
                        options.log_path.as_str()
                    ),
                )
            }
        }
    }
    Destination {
        text,
        json,
        html: html.as_deref().map(with_pid),
        note,
        _lock: lock,
    }
}

/// `path` with every `%p` replaced by the pid.
pub fn with_pid(path: &str) -> String {
    path.replace("%p", &std::process::id().to_string())
}

/// The pid and [`Weight`] of the text report at `path`, from its header and last line; `None`
/// if it has neither (another program's file, or a report cut short).
fn other_report(path: &str) -> Option<(u32, Weight)> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut head = [0u8; 512];
    let read = file.read(&mut head).ok()?;
    let head = String::from_utf8_lossy(&head[..read]);
    let (_, after) = head.split_once("==k15-memory== pid ")?;
    let pid = after.split(' ').next()?.parse().ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(1024))).ok()?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).ok()?;
    let tail = String::from_utf8_lossy(&tail);
    Some((pid, Weight::of_summary(tail.lines().last()?)?))
}

/// The environment variable that tells a run's processes when the run began: the first tracked
/// process sets it (nanoseconds since the epoch) and every process it starts inherits it, so
/// that each knows a report written since then for one of the run, and an older one for an
/// earlier run's.
const RUN_VARIABLE: &str = "K15_MEMORY_RUN";

/// When this process's run began (nanoseconds since the epoch), from [`join_the_run`].
static RUN_START: std::sync::OnceLock<u128> = std::sync::OnceLock::new();

/// Notes when this process's run began: inherited through [`RUN_VARIABLE`], or now, when this
/// process starts the run (it then sets the variable for the processes it starts). Called once
/// at start-up, before `main`.
pub fn join_the_run() {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos())
    };
    let inherited = std::env::var(RUN_VARIABLE)
        .ok()
        .and_then(|value| value.parse::<u128>().ok());
    let start = inherited.unwrap_or_else(now);
    if inherited.is_none() {
        // The environment's own copies are the tracker's (untracked: they are no block of the
        // program's), and any allocator frees them.
        let _inside = crate::tracker::guard::Inside::enter();
        // SAFETY: before `main`, where no other thread reads the environment.
        unsafe { std::env::set_var(RUN_VARIABLE, start.to_string()) };
    }
    let _ = RUN_START.set(start);
}

/// Whether `path` was written during this process's run (by another process of it, then): its
/// modification time against the run's start ([`join_the_run`]; without it, this process's
/// start in `/proc/self/stat`, known to a clock tick, a report written within that tick of it
/// counting as older).
fn written_during_this_run(path: &str) -> bool {
    let Ok(modified) = std::fs::metadata(path).and_then(|m| m.modified()) else {
        return false;
    };
    let started = match RUN_START.get() {
        Some(&nanos) => {
            std::time::UNIX_EPOCH
                + std::time::Duration::from_nanos(nanos.min(u64::MAX.into()) as u64)
        }
        None => match process_start() {
            Some(started) => started,
            None => return false,
        },
    };
    modified > started
}

/// When this process started, from `/proc/self/stat` and the boot time, rounded up to the next
/// clock tick (10 ms).
fn process_start() -> Option<std::time::SystemTime> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Field 22, `starttime`, is the 20th after the command's closing parenthesis.
    let start_ticks = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19)?.parse::<u64>().ok())?;
    // SAFETY: sysconf takes a plain value.
    let ticks_per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&t| t > 0)?;
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the local it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    let since_boot = std::time::Duration::new(now.tv_sec as u64, now.tv_nsec as u32);
    let boot = std::time::SystemTime::now() - since_boot;
    Some(boot + std::time::Duration::from_millis((start_ticks + 1) * 1000 / ticks_per_second))
}

/// An exclusive `flock` on the directory of a report, held while a process chooses its paths
/// and writes there.
struct DirectoryLock {
    open: std::fs::File,
}

impl Drop for DirectoryLock {
    /// Unlocked, not only closed: a child forked meanwhile holds a copy of the descriptor.
    fn drop(&mut self) {
        // SAFETY: flock on a descriptor this lock owns.
        unsafe { libc::flock(self.open.as_raw_fd(), libc::LOCK_UN) };
    }
}

impl DirectoryLock {
    /// How long a process waits for the lock (another process writing a large report) before it
    /// goes on without it: a forked child that inherited the lock's descriptor keeps it for as
    /// long as it runs.
    const PATIENCE_MS: u32 = 2000;

    fn take(report: &str) -> Option<DirectoryLock> {
        let dir = match std::path::Path::new(report).parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => std::path::Path::new("."),
        };
        let dir = std::fs::File::open(dir).ok()?;
        for _ in 0..Self::PATIENCE_MS / 10 {
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Some(DirectoryLock { open: dir });
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::Weight;

    #[test]
    fn a_summary_line_gives_its_weight() {
        let clean = "SUMMARY: k15-memory: 0 bytes leaked in 0 blocks; 0 memory errors; 350200 \
                     allocations in total, peak 6020499 bytes.";
        let leaky = "SUMMARY: k15-memory: 4242 bytes leaked in 1 block; 0 memory errors; 2 \
                     allocations in total, peak 4242 bytes.";
        let erring = "SUMMARY: k15-memory: 0 bytes leaked in 0 blocks; 1 memory error; 1 \
                      allocation in total, peak 8 bytes.";
        let (clean, leaky, erring) = (
            Weight::of_summary(clean).unwrap(),
            Weight::of_summary(leaky).unwrap(),
            Weight::of_summary(erring).unwrap(),
        );
        assert_eq!((clean.findings, clean.allocations), (false, 350_200));
        assert!(clean > leaky && clean > erring && leaky > erring);
        assert_eq!(Weight::of_summary("SUMMARY: k15-memory: cut sh"), None);
        assert_eq!(Weight::of_summary("some other file"), None);
    }
}
