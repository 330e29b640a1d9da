//! `K15_MEMORY_OPTIONS`: a table of keys with defaults and parsers, read once at first use.
//!
//! The first `operator new` can come before `main` and before any static constructor, so the
//! options are parsed lazily, without allocating, into fixed-size fields.

use crate::engine::ClassSpec;
use crate::stack::UnwindMode;
use crate::sys::{self, StackBuffer};
use core::cell::UnsafeCell;
use core::fmt::Write;
use core::sync::atomic::{AtomicU8, Ordering};

pub const ENV_VAR: &core::ffi::CStr = c"K15_MEMORY_OPTIONS";
const MAX_PATH: usize = 1024;

/// A path option kept in a fixed buffer (no allocation at parse time).
#[derive(Clone, Copy)]
pub struct PathOption {
    bytes: [u8; MAX_PATH],
    len: usize,
}

impl PathOption {
    const fn from_static(s: &str) -> Self {
        let mut bytes = [0u8; MAX_PATH];
        let src = s.as_bytes();
        let mut i = 0;
        while i < src.len() {
            bytes[i] = src[i];
            i += 1;
        }
        PathOption {
            bytes,
            len: src.len(),
        }
    }

    fn set(&mut self, value: &[u8]) -> bool {
        if value.is_empty() || value.len() >= MAX_PATH {
            return false;
        }
        self.bytes[..value.len()].copy_from_slice(value);
        self.len = value.len();
        true
    }

    pub fn as_str(&self) -> &str {
        core::str::from_utf8(&self.bytes[..self.len]).unwrap_or("k15_leaks.log")
    }
}

/// Every option of SPEC's table, with its default.
#[derive(Clone, Copy)]
pub struct Options {
    pub log_path: PathOption,
    /// `None`: `log_path` + `.json`.
    pub json_path: Option<PathOption>,
    pub stack_depth: usize,
    pub report: bool,
    pub exitcode: i32,
    pub halt_on_error: bool,
    /// How call stacks are walked: DWARF unwind tables (complete) or frame pointers (faster,
    /// loses frames in code built without them, such as Debian's libstdc++ and Bullet).
    pub unwinder: UnwindMode,
    /// Budget mode: bytes taken once at start-up that every tracked block is carved from
    /// (0 = off, blocks come from malloc).
    pub budget: usize,
    /// The budget's pool size classes; empty = derived from the budget.
    pub pool_classes: PoolClasses,
    /// Whether the C family (`malloc`, `calloc`, `realloc`, ...) is tracked; off, it goes to
    /// glibc and only `free`s of tracked blocks are checked.
    pub malloc: bool,
}

/// `pool_classes=64x1000,256x500`: block size x block count per class (':' separates options).
#[derive(Clone, Copy)]
pub struct PoolClasses {
    specs: [ClassSpec; MAX_POOL_CLASSES],
    len: usize,
}

const MAX_POOL_CLASSES: usize = 64;

impl PoolClasses {
    const EMPTY: PoolClasses = PoolClasses {
        specs: [ClassSpec {
            block_size: 0,
            block_count: 0,
        }; MAX_POOL_CLASSES],
        len: 0,
    };

    pub fn as_slice(&self) -> &[ClassSpec] {
        &self.specs[..self.len]
    }

    fn parse(value: &[u8]) -> Option<PoolClasses> {
        let mut classes = PoolClasses::EMPTY;
        for class in value.split(|&b| b == b',') {
            let x = class.iter().position(|&b| b == b'x')?;
            let block_size = usize::try_from(parse_int(&class[..x])?).ok()?;
            let block_count = usize::try_from(parse_int(&class[x + 1..])?).ok()?;
            if classes.len == MAX_POOL_CLASSES || block_size == 0 || block_count == 0 {
                return None;
            }
            classes.specs[classes.len] = ClassSpec {
                block_size,
                block_count,
            };
            classes.len += 1;
        }
        Some(classes)
    }
}

impl Options {
    const DEFAULT: Options = Options {
        log_path: PathOption::from_static("k15_leaks.log"),
        json_path: None,
        stack_depth: 32,
        report: true,
        exitcode: 0,
        halt_on_error: false,
        unwinder: UnwindMode::Dwarf,
        budget: 0,
        pool_classes: PoolClasses::EMPTY,
        malloc: false, // true once the report tells blocks reachable at exit from lost ones
    };

    /// Applies `key=value:key=value`, warning once on stderr for each bad pair.
    pub fn parse(text: &[u8]) -> Options {
        let mut options = Options::DEFAULT;
        for pair in text.split(|&b| b == b':').filter(|p| !p.is_empty()) {
            let (key, value) = match pair.iter().position(|&b| b == b'=') {
                Some(eq) => (&pair[..eq], &pair[eq + 1..]),
                None => (pair, &b""[..]),
            };
            if let Err(problem) = options.apply(key, value) {
                let mut line = StackBuffer::<512>::new();
                let _ = writeln!(
                    line,
                    "k15-memory: K15_MEMORY_OPTIONS: {problem} in '{}', ignored",
                    String::from_utf8_lossy(pair)
                );
                line.flush_to_stderr();
            }
        }
        options
    }

    fn apply(&mut self, key: &[u8], value: &[u8]) -> Result<(), &'static str> {
        match key {
            b"log_path" => self.log_path.set(value).then_some(()).ok_or("bad path"),
            b"json_path" => {
                let mut path = PathOption::from_static("");
                path.set(value).then_some(()).ok_or("bad path")?;
                self.json_path = Some(path);
                Ok(())
            }
            b"stack_depth" => {
                let depth = parse_int(value).filter(|d| *d <= crate::stack::MAX_DEPTH as i64);
                self.stack_depth = depth.ok_or("bad value (0..=64 expected)")? as usize;
                Ok(())
            }
            b"report" => parse_flag(value).map(|v| self.report = v),
            b"exitcode" => {
                let code = parse_int(value).filter(|c| (0..=255).contains(c));
                self.exitcode = code.ok_or("bad value (0..=255 expected)")? as i32;
                Ok(())
            }
            b"halt_on_error" => parse_flag(value).map(|v| self.halt_on_error = v),
            b"malloc" => parse_flag(value).map(|v| self.malloc = v),
            b"budget" => {
                self.budget =
                    parse_size(value).ok_or("bad value (bytes, with K, M or G: budget=64M)")?;
                Ok(())
            }
            b"pool_classes" => {
                self.pool_classes = PoolClasses::parse(value)
                    .ok_or("bad value (sizes x counts: pool_classes=64x1000,256x500)")?;
                Ok(())
            }
            b"unwinder" => {
                self.unwinder = match value {
                    b"dwarf" => UnwindMode::Dwarf,
                    b"frame_pointer" => UnwindMode::FramePointer,
                    _ => return Err("bad value (dwarf or frame_pointer expected)"),
                };
                Ok(())
            }
            _ => Err("unknown key"),
        }
    }

    /// Where the JSON report goes: `json_path`, else `log_path` + `.json`.
    pub fn json_path(&self) -> String {
        match &self.json_path {
            Some(path) => path.as_str().to_owned(),
            None => format!("{}.json", self.log_path.as_str()),
        }
    }
}

fn parse_int(value: &[u8]) -> Option<i64> {
    core::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// `64M`, `512K`, `2G` or plain bytes.
fn parse_size(value: &[u8]) -> Option<usize> {
    let (digits, unit) = match value.last()? {
        b'K' | b'k' => (&value[..value.len() - 1], 1 << 10),
        b'M' | b'm' => (&value[..value.len() - 1], 1 << 20),
        b'G' | b'g' => (&value[..value.len() - 1], 1 << 30),
        _ => (value, 1),
    };
    usize::try_from(parse_int(digits)?).ok()?.checked_mul(unit)
}

fn parse_flag(value: &[u8]) -> Result<bool, &'static str> {
    match value {
        b"0" | b"false" => Ok(false),
        b"1" | b"true" => Ok(true),
        _ => Err("bad value (0 or 1 expected)"),
    }
}

const UNREAD: u8 = 0;
const READING: u8 = 1;
const READY: u8 = 2;

struct OptionsCell {
    state: AtomicU8,
    value: UnsafeCell<Options>,
}

// SAFETY: `value` is written once, by the thread that moves `state` from UNREAD to READING, and
// read only after `state` is READY (release/acquire).
unsafe impl Sync for OptionsCell {}

static OPTIONS: OptionsCell = OptionsCell {
    state: AtomicU8::new(UNREAD),
    value: UnsafeCell::new(Options::DEFAULT),
};

/// The process's options, parsed from the environment at the first call.
#[inline]
pub fn get() -> &'static Options {
    if OPTIONS.state.load(Ordering::Acquire) != READY {
        read_once();
    }
    // SAFETY: READY was observed with acquire (here or in read_once), so the write is visible
    // and no one writes again.
    unsafe { &*OPTIONS.value.get() }
}

#[cold]
#[inline(never)]
fn read_once() {
    if OPTIONS
        .state
        .compare_exchange(UNREAD, READING, Ordering::Acquire, Ordering::Acquire)
        .is_ok()
    {
        let parsed = Options::parse(sys::env_var(ENV_VAR).unwrap_or(b""));
        // SAFETY: this thread won the UNREAD -> READING race; nobody reads before READY.
        unsafe { *OPTIONS.value.get() = parsed };
        OPTIONS.state.store(READY, Ordering::Release);
    } else {
        while OPTIONS.state.load(Ordering::Acquire) != READY {
            core::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_spec() {
        let o = Options::parse(b"");
        assert_eq!(o.log_path.as_str(), "k15_leaks.log");
        assert_eq!(o.json_path(), "k15_leaks.log.json");
        assert_eq!(o.stack_depth, 32);
        assert!(o.report && !o.halt_on_error);
        assert_eq!(o.exitcode, 0);
    }

    #[test]
    fn malloc_is_a_flag() {
        assert!(Options::parse(b"malloc=1").malloc);
        assert!(!Options::parse(b"malloc=1:malloc=0").malloc);
        assert_eq!(
            Options::parse(b"malloc=yes").malloc,
            Options::DEFAULT.malloc,
            "a bad value leaves the default"
        );
    }

    #[test]
    fn keys_are_applied_and_bad_pairs_ignored() {
        let o = Options::parse(
            b"log_path=/tmp/x.log:stack_depth=0:bogus=1:exitcode=300:exitcode=23:report=maybe",
        );
        assert_eq!(o.log_path.as_str(), "/tmp/x.log");
        assert_eq!(o.json_path(), "/tmp/x.log.json");
        assert_eq!(o.stack_depth, 0);
        assert_eq!(o.exitcode, 23);
        assert!(o.report);
    }

    #[test]
    fn budget_and_pool_classes() {
        let o = Options::parse(b"budget=64M:pool_classes=64x1000,256x500");
        assert_eq!(o.budget, 64 << 20);
        let classes: Vec<(usize, usize)> = o
            .pool_classes
            .as_slice()
            .iter()
            .map(|c| (c.block_size, c.block_count))
            .collect();
        assert_eq!(classes, [(64, 1000), (256, 500)]);
        assert_eq!(Options::parse(b"budget=12345").budget, 12345);
        let bad = Options::parse(b"budget=lots:pool_classes=64");
        assert_eq!(bad.budget, 0);
        assert!(bad.pool_classes.as_slice().is_empty());
    }
}
