//! `K15_MEMORY_OPTIONS`: a table of keys with defaults and parsers, read once at first use.
//!
//! The first `operator new` can come before `main` and before any static constructor, so the
//! options are parsed lazily, without allocating, into fixed-size fields.

use crate::sys::{self, StackBuffer};
use core::cell::UnsafeCell;
use core::fmt::Write;
use core::sync::atomic::{AtomicU8, Ordering};

/// The most frames a stack capture records (the upper bound of `stack_depth=`); larger depths are clamped to it.
pub const MAX_DEPTH: usize = 64;

/// How the stack capture walks the stack (`unwinder=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnwindMode {
    /// DWARF CFI (`.eh_frame`) with cached rules: complete stacks through code built
    /// without frame pointers. The default.
    #[default]
    Dwarf,
    /// Follow the rbp chain only: a few ns cheaper per frame, but frames are lost (or the
    /// walk stops) in code without frame pointers. Opt-in.
    FramePointer,
}

/// What the scan found a block to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LeakKind {
    /// Not reachable, and no other lost block points to it: the culprit.
    Direct,
    /// Reachable only through lost blocks: freed when its direct leak would have been.
    Indirect,
    /// Reachable from a root: kept on purpose, or not freed before exit.
    Reachable,
}

impl LeakKind {
    pub const ALL: [LeakKind; 3] = [LeakKind::Direct, LeakKind::Indirect, LeakKind::Reachable];

    /// The name in `leak_kinds=`, the JSON and the text.
    pub fn name(self) -> &'static str {
        match self {
            LeakKind::Direct => "direct",
            LeakKind::Indirect => "indirect",
            LeakKind::Reachable => "reachable",
        }
    }

    /// This kind's bit in a `leak_kinds=` set.
    pub const fn bit(self) -> u8 {
        1 << self as u8
    }
}

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
        if value.is_empty() || value.len() >= MAX_PATH || core::str::from_utf8(value).is_err() {
            return false;
        }
        self.bytes[..value.len()].copy_from_slice(value);
        self.len = value.len();
        true
    }

    pub fn as_str(&self) -> &str {
        // `set` takes UTF-8 only.
        core::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

/// Every option of SPEC's table, with its default.
#[derive(Clone, Copy)]
pub struct Options {
    pub log_path: PathOption,
    /// `None`: `log_path` + `.json`.
    pub json_path: Option<PathOption>,
    /// `html_path=`: the report as one HTML page too; `None`: no page.
    pub html_path: Option<PathOption>,
    pub stack_depth: usize,
    pub report: bool,
    pub exitcode: i32,
    pub halt_on_error: bool,
    /// How call stacks are walked: DWARF unwind tables (complete) or frame pointers (faster,
    /// loses frames in code built without them, such as Debian's libstdc++ and Bullet).
    pub unwinder: UnwindMode,
    /// Budget mode: the bytes the program's tracked blocks may hold at once (0 = off).
    pub budget: usize,
    /// Capture the call stack of every `delete` (kept in the freed block), so that a double free
    /// names the first one; `quarantine` turns it on too.
    pub free_stacks: bool,
    /// `break_on=THREAD/SEQ`: the allocation (as the report numbers it) that raises SIGTRAP just
    /// before it returns, so that a debugger stops there; `None`: off.
    pub break_on: Option<(u32, u32)>,
    /// Bytes of freed blocks held back, filled, to catch writes after free (0 = off).
    pub quarantine: usize,
    /// `suppressions=FILE`: leak and error rules (`report::suppress`).
    pub suppressions: Option<PathOption>,
    /// `budgets=FILE`: a byte budget per tag, `TAG SIZE` a line (`tracker::tag_budgets`).
    pub budgets: Option<PathOption>,
    /// `timeline=PATH` (`%p`: the pid): live bytes per tag over time (`tracker::timeline`).
    pub timeline: Option<PathOption>,
    /// `profile=1`: most calls, temporary allocations and the peak's consumers per allocating
    /// stack (`tracker::profile`), in the report's `profile`.
    pub profile: bool,
    /// Whether the text lists reachable blocks (else one line with their total).
    pub show_reachable: bool,
    /// Whether stacks keep the frames below `main` (libc's start-up and `_start`), as
    /// valgrind's `--show-below-main`; off, a stack through `main` ends there.
    pub show_below_main: bool,
    /// The leak kinds `exitcode` counts, as `LeakKind::bit`s.
    pub leak_kinds: u8,
    /// How many direct-leak sites the text lists (0: all).
    pub max_leaks: usize,
    /// Whether the C family (`malloc`, `calloc`, `realloc`, ...) is tracked; off, it goes to
    /// glibc and only `free`s of tracked blocks are checked.
    pub malloc: bool,
    /// `alloc_fns=PATTERN[,PATTERN...]`: the program's own allocation wrappers, globs on whole
    /// function names (as the symbolizer matches them), kept as written.
    pub alloc_fns: Option<PathOption>,
}

impl Options {
    const DEFAULT: Options = Options {
        log_path: PathOption::from_static("k15_leaks.log"),
        json_path: None,
        html_path: None,
        stack_depth: 32,
        report: true,
        exitcode: 0,
        halt_on_error: false,
        unwinder: UnwindMode::Dwarf,
        budget: 0,
        free_stacks: false,
        break_on: None,
        quarantine: 0,
        suppressions: None,
        budgets: None,
        timeline: None,
        profile: false,
        show_reachable: true,
        show_below_main: false,
        leak_kinds: LeakKind::Direct.bit() | LeakKind::Indirect.bit(),
        max_leaks: 0,
        malloc: true,
        alloc_fns: None,
    };

    /// Applies `key=value:key=value`, warning once on stderr for each bad pair (the value
    /// in force is kept: a bad value is never reinterpreted). A `::` is part of a value (C++
    /// names in `alloc_fns=`), never a separator.
    pub fn parse(text: &[u8]) -> Options {
        let mut options = Options::DEFAULT;
        for pair in pairs(text).filter(|p| !p.is_empty()) {
            let (key, value) = match pair.iter().position(|&b| b == b'=') {
                Some(eq) => (&pair[..eq], &pair[eq + 1..]),
                None => (pair, &b""[..]),
            };
            let mut line = StackBuffer::<512>::new();
            let _ = write!(
                line,
                "k15-memory: K15_MEMORY_OPTIONS: {}: ",
                String::from_utf8_lossy(pair)
            );
            match KEYS.iter().find(|k| k.name.as_bytes() == key) {
                Some(k) if (k.apply)(&mut options, value) => continue,
                Some(k) => {
                    let _ = write!(line, "{}, using ", k.expected);
                    (k.show)(&options, &mut line);
                }
                None => {
                    let _ = write!(line, "unknown key (known:");
                    for k in KEYS {
                        let _ = write!(line, " {}", k.name);
                    }
                    let _ = write!(line, "), ignored");
                }
            }
            let _ = writeln!(line);
            line.flush_to_stderr();
        }
        options
    }

    /// Where the JSON report goes: `json_path`, else `log_path` + `.json`.
    pub fn json_path(&self) -> String {
        match &self.json_path {
            Some(path) => path.as_str().to_owned(),
            None => format!("{}.json", self.log_path.as_str()),
        }
    }
}

/// The `key=value` pairs of `text`: split at each `:` that is not part of a `::`.
fn pairs(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    let colon = |i: usize| text.get(i) == Some(&b':');
    let mut start = 0;
    let mut at = 0;
    core::iter::from_fn(move || {
        while start <= text.len() {
            if at == text.len() || (colon(at) && !colon(at + 1) && (at == 0 || !colon(at - 1))) {
                let pair = &text[start..at];
                at += 1;
                start = at;
                return Some(pair);
            }
            at += 1;
        }
        None
    })
}

/// One key of `K15_MEMORY_OPTIONS`: a new key declares its parser and its range here, and
/// nowhere else.
struct Key {
    name: &'static str,
    /// What a valid value is, for the warning (`must be 0..64`).
    expected: &'static str,
    /// Sets the option from `value`; false, changing nothing, when `value` is not valid.
    apply: fn(&mut Options, &[u8]) -> bool,
    /// Writes the value in force, for the warning (`using 32`).
    show: fn(&Options, &mut dyn Write),
}

/// The [`Key`] of a `0`/`1` option setting the `bool` field of the same name.
macro_rules! flag_key {
    ($field:ident) => {
        Key {
            name: stringify!($field),
            expected: "must be 0 or 1",
            apply: |o, v| set_flag(v, |f| o.$field = f),
            show: |o, w| {
                let _ = write!(w, "{}", o.$field as u8);
            },
        }
    };
}

/// Sets an optional path option; false, changing nothing, when `value` is not a valid path.
fn set_path(value: &[u8], option: &mut Option<PathOption>) -> bool {
    let mut path = PathOption::from_static("");
    let valid = path.set(value);
    if valid {
        *option = Some(path);
    }
    valid
}

/// A key for an optional file or list (`suppressions=FILE`): `None` until given.
macro_rules! optional_path_key {
    ($field:ident, $expected:literal) => {
        Key {
            name: stringify!($field),
            expected: $expected,
            apply: |o, v| set_path(v, &mut o.$field),
            show: |o, w| {
                let _ = w.write_str(o.$field.as_ref().map_or("none", |p| p.as_str()));
            },
        }
    };
}

/// The largest `budget=`: 1 TiB (more is a typo, not a budget).
const MAX_BUDGET: usize = 1 << 40;

const KEYS: &[Key] = &[
    Key {
        name: "log_path",
        expected: "must be a UTF-8 path of 1..1023 bytes",
        apply: |o, v| o.log_path.set(v),
        show: |o, w| {
            let _ = w.write_str(o.log_path.as_str());
        },
    },
    Key {
        name: "json_path",
        expected: "must be a UTF-8 path of 1..1023 bytes",
        apply: |o, v| set_path(v, &mut o.json_path),
        show: |o, w| {
            let _ = w.write_str(&o.json_path());
        },
    },
    Key {
        name: "html_path",
        expected: "must be a UTF-8 path of 1..1023 bytes",
        apply: |o, v| set_path(v, &mut o.html_path),
        show: |o, w| {
            let _ = w.write_str(o.html_path.as_ref().map_or("(none)", PathOption::as_str));
        },
    },
    Key {
        name: "stack_depth",
        expected: "must be 0..64",
        apply: |o, v| set_int(v, 0, MAX_DEPTH as i64, |d| o.stack_depth = d as usize),
        show: |o, w| {
            let _ = write!(w, "{}", o.stack_depth);
        },
    },
    flag_key!(report),
    Key {
        name: "exitcode",
        expected: "must be 0..255",
        apply: |o, v| set_int(v, 0, 255, |c| o.exitcode = c as i32),
        show: |o, w| {
            let _ = write!(w, "{}", o.exitcode);
        },
    },
    flag_key!(halt_on_error),
    Key {
        name: "budget",
        expected: "must be 0..1T bytes, with K, M or G (budget=64M)",
        apply: |o, v| match parse_size(v).filter(|b| *b <= MAX_BUDGET) {
            Some(bytes) => {
                o.budget = bytes;
                true
            }
            None => false,
        },
        show: |o, w| {
            let _ = write!(w, "{}", o.budget);
        },
    },
    Key {
        name: "unwinder",
        expected: "must be dwarf or frame_pointer",
        apply: |o, v| {
            o.unwinder = match v {
                b"dwarf" => UnwindMode::Dwarf,
                b"frame_pointer" => UnwindMode::FramePointer,
                _ => return false,
            };
            true
        },
        show: |o, w| {
            let _ = w.write_str(match o.unwinder {
                UnwindMode::Dwarf => "dwarf",
                UnwindMode::FramePointer => "frame_pointer",
            });
        },
    },
    flag_key!(free_stacks),
    flag_key!(malloc),
    flag_key!(profile),
    Key {
        name: "quarantine",
        expected: "must be bytes, with K, M or G (quarantine=16M)",
        apply: |o, v| match parse_size(v).filter(|b| *b <= MAX_BUDGET) {
            Some(bytes) => {
                o.quarantine = bytes;
                true
            }
            None => false,
        },
        show: |o, w| {
            let _ = write!(w, "{}", o.quarantine);
        },
    },
    Key {
        name: "break_on",
        expected: "must be THREAD/SEQ from the report's blocks list (break_on=1/42)",
        apply: |o, v| match parse_pair(v) {
            Some(pair) => {
                o.break_on = Some(pair);
                true
            }
            None => false,
        },
        show: |o, w| {
            let _ = match o.break_on {
                Some((thread, seq)) => write!(w, "{thread}/{seq}"),
                None => w.write_str("none"),
            };
        },
    },
    optional_path_key!(suppressions, "must be a UTF-8 path of 1..1023 bytes"),
    optional_path_key!(budgets, "must be a UTF-8 path of 1..1023 bytes"),
    optional_path_key!(timeline, "must be a UTF-8 path of 1..1023 bytes"),
    optional_path_key!(
        alloc_fns,
        "must be UTF-8 patterns of 1..1023 bytes in all, by commas"
    ),
    flag_key!(show_reachable),
    flag_key!(show_below_main),
    Key {
        name: "leak_kinds",
        expected: "must be direct, indirect, reachable, all or none, by commas",
        apply: |o, v| match parse_leak_kinds(v) {
            Some(bits) => {
                o.leak_kinds = bits;
                true
            }
            None => false,
        },
        show: |o, w| {
            let mut kinds = LeakKind::ALL.iter().filter(|k| o.leak_kinds & k.bit() != 0);
            match kinds.next() {
                None => {
                    let _ = w.write_str("none");
                }
                Some(first) => {
                    let _ = w.write_str(first.name());
                    for kind in kinds {
                        let _ = write!(w, ",{}", kind.name());
                    }
                }
            }
        },
    },
    Key {
        name: "max_leaks",
        expected: "must be 0..4294967295 (0: every site)",
        apply: |o, v| set_int(v, 0, u32::MAX as i64, |n| o.max_leaks = n as usize),
        show: |o, w| {
            let _ = write!(w, "{}", o.max_leaks);
        },
    },
];

/// Sets an integer option from `value` if it is a number in `min..=max`.
fn set_int(value: &[u8], min: i64, max: i64, set: impl FnOnce(i64)) -> bool {
    parse_int(value)
        .filter(|n| (min..=max).contains(n))
        .map(set)
        .is_some()
}

/// Sets a flag option from `0`/`1`/`false`/`true`.
fn set_flag(value: &[u8], set: impl FnOnce(bool)) -> bool {
    let flag = match value {
        b"0" | b"false" => false,
        b"1" | b"true" => true,
        _ => return false,
    };
    set(flag);
    true
}

/// `leak_kinds=direct,indirect`: a set of `LeakKind::bit`s (`all`, `none`).
fn parse_leak_kinds(value: &[u8]) -> Option<u8> {
    let mut bits = 0;
    for name in value.split(|&b| b == b',') {
        bits |= match name {
            b"all" => LeakKind::ALL.iter().fold(0, |all, k| all | k.bit()),
            b"none" => 0,
            _ => LeakKind::ALL
                .iter()
                .find(|k| k.name().as_bytes() == name)?
                .bit(),
        };
    }
    Some(bits)
}

fn parse_int(value: &[u8]) -> Option<i64> {
    core::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// `64M`, `512K`, `2G` or plain bytes.
pub fn parse_size(value: &[u8]) -> Option<usize> {
    let (digits, unit) = match value.last()? {
        b'K' | b'k' => (&value[..value.len() - 1], 1 << 10),
        b'M' | b'm' => (&value[..value.len() - 1], 1 << 20),
        b'G' | b'g' => (&value[..value.len() - 1], 1 << 30),
        _ => (value, 1),
    };
    usize::try_from(parse_int(digits)?).ok()?.checked_mul(unit)
}

/// `1/42`: two positive numbers.
fn parse_pair(value: &[u8]) -> Option<(u32, u32)> {
    let slash = value.iter().position(|&b| b == b'/')?;
    let number = |digits: &[u8]| u32::try_from(parse_int(digits)?).ok().filter(|&n| n > 0);
    Some((number(&value[..slash])?, number(&value[slash + 1..])?))
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
        assert!(o.html_path.is_none(), "no page unless asked for");
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
    fn heap_checking_keys() {
        let o = Options::parse(b"break_on=2/1234:free_stacks=1:quarantine=16M");
        assert_eq!(o.break_on, Some((2, 1234)));
        assert!(o.free_stacks);
        assert_eq!(o.quarantine, 16 << 20);
        assert_eq!(Options::parse(b"quarantine=lots").quarantine, 0);
        for bad in [
            &b"break_on=1"[..],
            b"break_on=0/5",
            b"break_on=1/x",
            b"break_on=/3",
        ] {
            assert_eq!(Options::parse(bad).break_on, None);
        }
    }

    #[test]
    fn alloc_fns_keeps_cpp_names_whole() {
        let o = Options::parse(b"alloc_fns=JPH::*AllocateImpl,JPH::STLAllocator*:malloc=0");
        let patterns = o.alloc_fns.as_ref().map(PathOption::as_str);
        assert_eq!(patterns, Some("JPH::*AllocateImpl,JPH::STLAllocator*"));
        assert!(!o.malloc);
        assert!(Options::parse(b"alloc_fns=").alloc_fns.is_none());
        let pairs: Vec<&[u8]> = pairs(b"a=1:b=x::y::z:c=2").collect();
        assert_eq!(pairs, [&b"a=1"[..], b"b=x::y::z", b"c=2"]);
    }

    #[test]
    fn budget() {
        assert_eq!(Options::parse(b"budget=64M").budget, 64 << 20);
        assert_eq!(Options::parse(b"budget=12345").budget, 12345);
        assert_eq!(Options::parse(b"budget=lots").budget, 0);
    }

    /// Every key's value in force, as the warnings show it.
    fn shown(o: &Options) -> Vec<String> {
        KEYS.iter()
            .map(|k| {
                let mut text = String::new();
                (k.show)(o, &mut text);
                text
            })
            .collect()
    }

    /// A value for a key: numbers at and beyond the ranges' edges, sizes, and random bytes.
    fn garbage(seed: &mut u64) -> Vec<u8> {
        let mut next = || {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed
        };
        const EDGES: &[&str] = &[
            "-1",
            "-2",
            "-64",
            "0",
            "1",
            "64",
            "65",
            "255",
            "256",
            "-0",
            "+7",
            " 3",
            "1e3",
            "0x10",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "18446744073709551616",
            "",
            "64M",
            "-64M",
            "2T",
            "1024G",
            "1025G",
            "64x",
            "x64",
            "64x0",
            "0x64",
            "64x1,",
            ",",
            "dwarf",
            "DWARF",
            "true",
            "yes",
            "frame_pointer ",
        ];
        match next() % 3 {
            0 => EDGES[(next() % EDGES.len() as u64) as usize]
                .as_bytes()
                .to_vec(),
            1 => format!("{}", next() as i64 >> (next() % 64)).into_bytes(),
            _ => (0..next() % 12)
                .map(|_| (next() % 255) as u8 + 1)
                .filter(|&b| b != b':')
                .collect(),
        }
    }

    #[test]
    fn garbage_for_every_key_is_refused_whole_or_taken_as_written() {
        let defaults = shown(&Options::DEFAULT);
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        for key in KEYS {
            for _ in 0..2000 {
                let value = garbage(&mut seed);
                let mut options = Options::DEFAULT;
                let taken = (key.apply)(&mut options, &value);
                let what = format!("{}={}", key.name, String::from_utf8_lossy(&value));
                assert!(options.stack_depth <= MAX_DEPTH, "{what}");
                assert!((0..=255).contains(&options.exitcode), "{what}");
                assert!(options.budget <= MAX_BUDGET, "{what}");
                if !taken {
                    assert_eq!(shown(&options), defaults, "{what} changed an option");
                    continue;
                }
                // Taken: the value in force reads back as itself.
                let index = KEYS.iter().position(|k| k.name == key.name).unwrap();
                let now = shown(&options)[index].clone();
                let mut again = Options::DEFAULT;
                assert!(
                    (key.apply)(&mut again, now.as_bytes()),
                    "{what} shown as {now}"
                );
                assert_eq!(shown(&again)[index], now, "{what}");
            }
        }
    }

    #[test]
    fn a_negative_stack_depth_is_refused_not_wrapped() {
        for value in ["-1", "-2", "-64", "65", "18446744073709551615"] {
            let o = Options::parse(format!("stack_depth={value}").as_bytes());
            assert_eq!(o.stack_depth, 32, "stack_depth={value}");
        }
    }
}
