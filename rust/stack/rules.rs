//! Unwind rules compiled from `.eh_frame` once per FDE into lock-free tables, so that a walk steps without parsing CFI.
//!
//! framehop keeps the rules it evaluated in a 509-entry direct-mapped cache per slot; real code
//! calls `new` from thousands of return addresses, so that cache misses and every miss parses
//! CFI again (binary search of `.eh_frame_hdr`, the CIE and the FDE's instructions up to the
//! address: 17% of all instructions of yaml-cpp's test suite under the tracker). Here the first
//! miss in an FDE runs its CFI program once and keeps every row as what an x86-64 step needs,
//! packed in one word (CFA = rsp or rbp plus an offset, return address and saved rbp at offsets
//! from the CFA: the model of the Linux kernel's ORC entries); the row of each return address is
//! then published in a table shared by every thread, so that every later step from that address
//! is a probe and one or two reads. Rows that need more (CFA or register expressions, registers
//! other than rsp and rbp, as in stack-realigning prologues) are marked as such and stepped by
//! framehop, like addresses without an FDE and everything once the row arena is full. Past
//! [`PC_SLOTS`] * 3/4 return addresses, new ones find their FDE's compiled rows on every step.
//!
//! Rules are keyed by address, and an address means the same code only while its module stays
//! mapped: the one table ([`RULES`]) outlives module snapshots, and a rescan forgets the rules
//! in the range of every module that went ([`Rules::forget_code`]).

use core::ops::Range;
use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::sys::map_once;

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EhFrameOffset, EndianSlice, FrameDescriptionEntry,
    LittleEndian, RegisterRule, UnwindContext, UnwindSection, X86_64,
};

/// Slots of the map by return address: 1 MiB of address space, pages touched as keys arrive
/// (yaml-cpp's test suite meets 25,000 return addresses).
const PC_SLOTS: usize = 1 << 16;
/// Slots of the map by FDE: 256 KiB (yaml-cpp's suite meets 2,600 FDEs, which touch every page
/// of a map this size, so a larger one costs resident memory for nothing).
const FDE_SLOTS: usize = 1 << 14;
/// Slots probed before giving up on a key.
const MAX_PROBES: usize = 32;

/// gimli's CFI evaluation context, one per unwinder slot (created outside the hot path).
pub(crate) type CfiContext = UnwindContext<usize>;

/// A packed rule (0 = none yet): bit 0 set; bit 1: step with framehop instead; bit 4: no caller
/// (the end of the stack); bit 2: the CFA
/// is rbp-based (else rsp-based); bit 3: the caller's rbp is saved at `cfa + bp_off` (else rbp
/// is unchanged); bits 8..16 `ra_off / 8` and 16..24 `bp_off / 8` as `i8`; bits 32..64 the CFA
/// offset as `i32`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Rule(u64);

impl Rule {
    const PRESENT: u64 = 1;
    const FRAMEHOP: u64 = 2;
    const CFA_RBP: u64 = 4;
    const BP_SAVED: u64 = 8;

    const END: u64 = 16;

    /// Step this address with framehop (its own DWARF evaluation and frame-pointer guesses).
    pub(crate) const FRAMEHOP_STEP: Rule = Rule(Self::PRESENT | Self::FRAMEHOP);
    /// The outermost frame (`_start`, `clone`): its CFI leaves the return address undefined.
    pub(crate) const END_OF_STACK: Rule = Rule(Self::PRESENT | Self::END);

    pub(crate) fn new(
        cfa_rbp: bool,
        cfa_off: i64,
        ra_off: i64,
        bp_off: Option<i64>,
    ) -> Option<Rule> {
        let by8 = |off: i64| -> Option<u64> {
            (off % 8 == 0)
                .then(|| i8::try_from(off / 8).ok())
                .flatten()
                .map(|v| u64::from(v as u8))
        };
        let mut bits = Self::PRESENT | by8(ra_off)? << 8;
        if cfa_rbp {
            bits |= Self::CFA_RBP;
        }
        if let Some(off) = bp_off {
            bits |= Self::BP_SAVED | by8(off)? << 16;
        }
        bits |= u64::from(i32::try_from(cfa_off).ok()? as u32) << 32;
        Some(Rule(bits))
    }

    /// Whether the step reads rbp (its CFA is rbp-based).
    #[inline(always)]
    pub(crate) fn uses_bp(self) -> bool {
        self.0 & Self::CFA_RBP != 0
    }

    /// Whether the step gives the caller an rbp read from the stack (else rbp passes through).
    #[inline(always)]
    pub(crate) fn restores_bp(self) -> bool {
        self.0 & Self::BP_SAVED != 0
    }

    /// One step from a frame with registers `(sp, bp)`: the caller's `(return address, sp,
    /// bp)`, reading the stack through `read` (return address first, then the saved rbp).
    /// `None` for a [`Rule::FRAMEHOP_STEP`] or a failed read.
    #[inline]
    pub(crate) fn step(
        self,
        sp: u64,
        bp: u64,
        read: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> Option<(u64, u64, u64)> {
        if self.0 & (Self::FRAMEHOP | Self::END) != 0 {
            return None;
        }
        let base = if self.0 & Self::CFA_RBP != 0 { bp } else { sp };
        let cfa = base.wrapping_add((self.0 >> 32) as i32 as i64 as u64);
        let at = |shift: u32| cfa.wrapping_add(((self.0 >> shift) as u8 as i8 as i64 * 8) as u64);
        let ra = read(at(8)).ok()?;
        let caller_bp = if self.0 & Self::BP_SAVED != 0 {
            read(at(16)).ok()?
        } else {
            bp
        };
        Some((ra, cfa, caller_bp))
    }
}

/// A module's unwind sections, as mapped in this process.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sections {
    pub(crate) code_start: usize,
    /// `(address, length)`; length 0 when the module has no `.eh_frame_hdr`.
    pub(crate) eh_frame_hdr: (usize, usize),
    pub(crate) eh_frame: (usize, usize),
}

impl Sections {
    /// The bytes of `.eh_frame_hdr` and of `.eh_frame`.
    fn bytes(&self) -> (&'static [u8], &'static [u8]) {
        let bytes = |(addr, len): (usize, usize)| {
            // SAFETY: both ranges lie in mapped read-only segments of a loaded module (see
            // modules.rs, which found them and documents the dlclose limit).
            unsafe { core::slice::from_raw_parts(addr as *const u8, len) }
        };
        (bytes(self.eh_frame_hdr), bytes(self.eh_frame))
    }

    /// The bases gimli reads the sections' encoded pointers against.
    fn bases(&self) -> BaseAddresses {
        BaseAddresses::default()
            .set_eh_frame_hdr(self.eh_frame_hdr.0 as u64)
            .set_eh_frame(self.eh_frame.0 as u64)
            .set_text(self.code_start as u64)
    }
}

/// Where the compiled rows of every FDE met so far live: `(start address, rule)` pairs,
/// appended with an atomic bump and never moved, so a published range stays valid.
struct RowArena {
    rows: AtomicPtr<[u64; 2]>,
    used: AtomicUsize,
}

/// Rows [`Rules::compile`] evaluates an FDE into before it claims them in the arena.
const COMPILE_BUFFER: usize = 64;

/// Rows the arena holds at most: 64 MiB of address space, pages touched as FDEs are compiled.
const ARENA_ROWS: usize = 1 << 22;

impl RowArena {
    /// Claims `len` rows: their index and themselves; `None` when the arena is full.
    #[allow(clippy::mut_from_ref)] // each claim hands out rows no other claim overlaps
    fn claim(&self, len: usize) -> Option<(usize, &mut [[u64; 2]])> {
        let mut p = self.rows.load(Ordering::Acquire);
        if p.is_null() {
            p = map_once(&self.rows, ARENA_ROWS * 16);
            if p.is_null() {
                return None;
            }
        }
        let at = self.used.fetch_add(len, Ordering::Relaxed);
        if at + len > ARENA_ROWS {
            return None;
        }
        // SAFETY: `[at, at + len)` lies inside the mapping and was claimed by this thread alone.
        Some((at, unsafe {
            core::slice::from_raw_parts_mut(p.add(at), len)
        }))
    }

    /// A published range of rows.
    fn get(&self, at: usize, len: usize) -> &[[u64; 2]] {
        let p = self.rows.load(Ordering::Acquire);
        // SAFETY: `(at, len)` was published (Release) after those rows were written, and the
        // arena is never unmapped or rewritten.
        unsafe { core::slice::from_raw_parts(p.add(at), len) }
    }
}

/// The rules of every module loaded: return address -> rule, and FDE start -> its compiled
/// rows, so that each FDE's CFI is evaluated once in all. One set for the process, kept across
/// module [`Snapshot`](super::modules::Snapshot)s: a module that stays keeps its rules, and
/// those of a module that goes are forgotten ([`Rules::forget_code`]) before a snapshot
/// without it is published, so that code mapped there later is never stepped by them. (A set
/// per snapshot cost every `dlopen`/`dlclose` the pages its first walks touched: 224 KiB a
/// plugin reload.)
pub(crate) static RULES: Rules = Rules::new();

pub(crate) struct Rules {
    by_pc: WordMap<PC_SLOTS>,
    by_fde: WordMap<FDE_SLOTS>,
    rows: RowArena,
}

impl Rules {
    const fn new() -> Self {
        Rules {
            by_pc: WordMap::new(),
            by_fde: WordMap::new(),
            rows: RowArena {
                rows: AtomicPtr::new(ptr::null_mut()),
                used: AtomicUsize::new(0),
            },
        }
    }

    /// Forgets the rules of return addresses and FDEs in `code` (the ranges of modules gone):
    /// later lookups there miss and compile again from whatever is mapped then.
    pub(crate) fn forget_code(&self, code: &[Range<usize>]) {
        let inside = |key: u64| code.iter().any(|r| r.contains(&(key as usize)));
        self.by_pc.forget(inside);
        self.by_fde.forget(inside);
    }

    /// The rule already compiled for return address `pc`, if any: the hot step's one probe.
    #[inline(always)]
    pub(crate) fn cached(&self, pc: usize) -> Option<Rule> {
        self.by_pc.get(pc as u64).map(Rule)
    }

    /// The rule for return address `pc` of a module with `sections`; `ctx` evaluates CFI on a
    /// miss.
    #[inline]
    pub(crate) fn get(
        &self,
        pc: usize,
        sections: impl FnOnce() -> Option<Sections>,
        ctx: &mut CfiContext,
    ) -> Rule {
        match self.by_pc.get(pc as u64) {
            Some(rule) => Rule(rule),
            None => self.miss(pc, sections, ctx),
        }
    }

    #[cold]
    #[inline(never)]
    fn miss(
        &self,
        pc: usize,
        sections: impl FnOnce() -> Option<Sections>,
        ctx: &mut CfiContext,
    ) -> Rule {
        let rule = sections()
            .and_then(|s| self.rule_of(pc, &s, ctx))
            .unwrap_or(Rule::FRAMEHOP_STEP);
        self.by_pc.insert(pc as u64, rule.0);
        rule
    }

    fn rule_of(&self, pc: usize, s: &Sections, ctx: &mut CfiContext) -> Option<Rule> {
        if s.eh_frame_hdr.1 == 0 || s.eh_frame.1 == 0 {
            return None;
        }
        let (hdr_bytes, eh_frame_bytes) = s.bytes();
        let bases = s.bases();
        let eh_frame = EhFrame::new(eh_frame_bytes, LittleEndian);
        // A return address points after the call: the call itself is at `pc - 1`.
        let probe = pc as u64 - 1;
        let found = search_table(hdr_bytes, s.eh_frame_hdr.0 as u64, probe);
        let compiled = |start| {
            self.by_fde.get(start).map(|packed| {
                self.rows
                    .get((packed >> 32) as usize, packed as u32 as usize)
            })
        };
        let rows = match found.and_then(|(start, _)| compiled(start)) {
            Some(rows) => rows,
            None => {
                let fde = match found {
                    Some((_, fde_at)) => {
                        let offset =
                            usize::try_from(fde_at.checked_sub(s.eh_frame.0 as u64)?).ok()?;
                        eh_frame
                            .fde_from_offset(
                                &bases,
                                EhFrameOffset(offset),
                                EhFrame::cie_from_offset,
                            )
                            .ok()?
                    }
                    None => EhFrameHdr::new(hdr_bytes, LittleEndian)
                        .parse(&bases, 8)
                        .ok()?
                        .table()?
                        .fde_for_address(&eh_frame, &bases, probe, EhFrame::cie_from_offset)
                        .ok()?,
                };
                match compiled(fde.initial_address()) {
                    Some(rows) => rows,
                    None => self.compile(&fde, &eh_frame, &bases, ctx)?,
                }
            }
        };
        let i = rows.partition_point(|r| r[0] <= probe).checked_sub(1)?;
        // The last row marks the FDE's end: an address past it has no rule here.
        (rows[i][1] != 0).then_some(Rule(rows[i][1]))
    }

    /// Compiles every row of `fde` into the arena, then a row with no rule at its end, and
    /// publishes them by the FDE's start.
    fn compile(
        &self,
        fde: &FrameDescriptionEntry<EndianSlice<'_, LittleEndian>>,
        eh_frame: &EhFrame<EndianSlice<'_, LittleEndian>>,
        bases: &BaseAddresses,
        ctx: &mut CfiContext,
    ) -> Option<&[[u64; 2]]> {
        // The CFI is evaluated once, into this buffer: nearly every FDE has a few rows (those
        // with more are evaluated again, straight into the arena).
        let mut buffer = [[0u64; 2]; COMPILE_BUFFER];
        let (at, out) = match Self::rows_of(fde, eh_frame, bases, ctx, &mut buffer)? {
            Ok(n) => {
                let (at, out) = self.rows.claim(n)?;
                out.copy_from_slice(&buffer[..n]);
                (at, out)
            }
            Err(count) => {
                let (at, out) = self.rows.claim(count)?;
                let n = Self::rows_of(fde, eh_frame, bases, ctx, out)?.ok()?;
                (at, &mut out[..n])
            }
        };
        self.by_fde
            .insert(fde.initial_address(), (at as u64) << 32 | out.len() as u64);
        Some(out)
    }

    /// Writes `fde`'s rows to `out` (rows that differ only in registers a step never reads are
    /// one row here) and a row with no rule at the FDE's end: `Ok` with their number, or `Err`
    /// with the number of rows (and end row) before merging if `out` is too short for them.
    fn rows_of(
        fde: &FrameDescriptionEntry<EndianSlice<'_, LittleEndian>>,
        eh_frame: &EhFrame<EndianSlice<'_, LittleEndian>>,
        bases: &BaseAddresses,
        ctx: &mut CfiContext,
        out: &mut [[u64; 2]],
    ) -> Option<Result<usize, usize>> {
        let mut table = fde.rows(eh_frame, bases, ctx).ok()?;
        let (mut n, mut count) = (0, 1);
        while let Ok(Some(row)) = table.next_row() {
            count += 1;
            let rule = rule_of_row(row).unwrap_or(Rule::FRAMEHOP_STEP);
            if n > 0 && out.get(n - 1).is_some_and(|last| last[1] == rule.0) {
                continue;
            }
            if let Some(slot) = out.get_mut(n) {
                *slot = [row.start_address(), rule.0];
            }
            n += 1;
        }
        if n >= out.len() {
            return Some(Err(count));
        }
        out[n] = [fde.initial_address().wrapping_add(fde.len()), 0];
        Some(Ok(n + 1))
    }
}

/// The `.eh_frame_hdr` search table's entry for `probe`: the start of the last function that
/// starts at or below it and the address of its FDE, read directly from the table in the one
/// layout GNU toolchains write (a sorted array of 4-byte offsets from the header, found in a
/// few compares where gimli's generic reader decodes every pointer it visits). `None` for any
/// other layout (gimli then searches) or an address below the first function.
fn search_table(hdr: &[u8], hdr_address: u64, probe: u64) -> Option<(u64, u64)> {
    const UDATA4: u8 = 0x03;
    const SDATA4: u8 = 0x0b;
    const DATAREL_SDATA4: u8 = 0x3b;
    let word = |at: usize| -> Option<[u8; 4]> { hdr.get(at..at + 4)?.try_into().ok() };
    let [1, frame_ptr, UDATA4, DATAREL_SDATA4] = word(0)? else {
        return None;
    };
    if frame_ptr & 0x0f != UDATA4 && frame_ptr & 0x0f != SDATA4 {
        return None;
    }
    let count = u32::from_le_bytes(word(8)?) as usize;
    let table = hdr.get(12..12 + count.checked_mul(8)?)?;
    let entry = |i: usize| {
        let at = |k: usize| {
            let offset = i32::from_le_bytes([table[k], table[k + 1], table[k + 2], table[k + 3]]);
            hdr_address.wrapping_add(offset as i64 as u64)
        };
        (at(8 * i), at(8 * i + 4))
    };
    let (mut lo, mut hi) = (0, count); // the entry sought is the last below `hi` that starts <= probe
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if entry(mid).0 <= probe {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo.checked_sub(1).map(entry)
}

/// What a step needs from one row of CFI, if it is expressible as a [`Rule`].
fn rule_of_row<S: gimli::UnwindContextStorage<usize>>(
    row: &gimli::UnwindTableRow<usize, S>,
) -> Option<Rule> {
    let (cfa_rbp, cfa_off) = match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RSP => {
            (false, offset)
        }
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RBP => {
            (true, offset)
        }
        _ => return None,
    };
    let ra_off = match row.register(X86_64::RA) {
        Some(RegisterRule::Offset(off)) => off,
        Some(RegisterRule::Undefined) => return Some(Rule::END_OF_STACK),
        _ => return None,
    };
    let bp_off = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue | RegisterRule::Undefined) => None,
        Some(RegisterRule::Offset(off)) => Some(off),
        Some(_) => return None,
    };
    Rule::new(cfa_rbp, cfa_off, ra_off, bp_off)
}

/// A lock-free map of nonzero words to nonzero words: open addressing over `[key, value]`
/// pairs in one `MAP_NORESERVE` mapping. An entry is claimed by a CAS of its key and then
/// given its value; a reader that finds the key before the value treats it as absent. `SLOTS`
/// is a power of two.
struct WordMap<const SLOTS: usize> {
    slots: AtomicPtr<[AtomicU64; 2]>,
    entries: AtomicUsize,
}

impl<const SLOTS: usize> WordMap<SLOTS> {
    /// Past this many entries new keys are left out (probe chains stay short).
    const MAX_ENTRIES: usize = SLOTS / 4 * 3;

    const fn new() -> Self {
        WordMap {
            slots: AtomicPtr::new(ptr::null_mut()),
            entries: AtomicUsize::new(0),
        }
    }

    #[inline(always)]
    fn slots(&self) -> Option<&[[AtomicU64; 2]]> {
        let mut p = self.slots.load(Ordering::Acquire);
        if p.is_null() {
            p = map_once(&self.slots, SLOTS * 16);
        }
        // SAFETY: a non-null pointer is a mapping of SLOTS zero-initialised pairs that is never
        // unmapped, and every access to it is atomic.
        (!p.is_null()).then(|| unsafe { core::slice::from_raw_parts(p, SLOTS) })
    }

    fn start(key: u64) -> usize {
        key.wrapping_mul(0x9e37_79b9_7f4a_7c15) as usize >> (64 - SLOTS.trailing_zeros())
    }

    #[inline(always)]
    fn get(&self, key: u64) -> Option<u64> {
        let slots = self.slots()?;
        let mut i = Self::start(key);
        for _ in 0..MAX_PROBES {
            let [k, value] = &slots[i];
            match k.load(Ordering::Acquire) {
                0 => return None,
                found if found == key => {
                    let v = value.load(Ordering::Acquire);
                    return (v != 0).then_some(v);
                }
                _ => i = (i + 1) % SLOTS,
            }
        }
        None
    }

    /// Empties the values of the keys `doomed` picks: their entries stay (probe chains run
    /// through them) and read as absent until [`WordMap::insert`] gives them a value again.
    fn forget(&self, doomed: impl Fn(u64) -> bool) {
        let p = self.slots.load(Ordering::Acquire);
        if p.is_null() {
            return;
        }
        // SAFETY: as in `slots`.
        let slots = unsafe { core::slice::from_raw_parts(p, SLOTS) };
        for [k, value] in slots {
            let key = k.load(Ordering::Acquire);
            if key != 0 && doomed(key) {
                value.store(0, Ordering::Release);
            }
        }
    }

    /// Adds `key -> value` unless the key has a value already or the map is full: either way
    /// later lookups find `value` or another thread's value for the same key. A forgotten key
    /// gets its value back.
    fn insert(&self, key: u64, value: u64) {
        let Some(slots) = self.slots() else {
            return;
        };
        if self.entries.load(Ordering::Relaxed) >= Self::MAX_ENTRIES {
            return;
        }
        let mut i = Self::start(key);
        for _ in 0..MAX_PROBES {
            let [k, v] = &slots[i];
            match k.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.entries.fetch_add(1, Ordering::Relaxed);
                    v.store(value, Ordering::Release);
                    return;
                }
                Err(found) if found == key => {
                    // Claimed by a concurrent insert (which stores the same rule) or forgotten.
                    let _ = v.compare_exchange(0, value, Ordering::AcqRel, Ordering::Relaxed);
                    return;
                }
                Err(_) => i = (i + 1) % SLOTS,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct search of `.eh_frame_hdr` finds the FDE gimli's finds, for addresses all over
    /// the code of this test program and of libc (and none where gimli finds none).
    #[test]
    fn the_direct_table_search_finds_gimlis_fde() {
        let snap = super::super::modules::current_or_scan().expect("modules");
        let here = the_direct_table_search_finds_gimlis_fde as *const () as usize;
        let libc_fn = libc::malloc as *const () as usize;
        let mut searched = 0;
        for pc in [here, libc_fn] {
            let code = snap.module_of(pc).expect("a known module");
            let s = snap.sections_of(pc).expect("its sections");
            let (hdr_bytes, eh_frame_bytes) = s.bytes();
            let bases = s.bases();
            let hdr = EhFrameHdr::new(hdr_bytes, LittleEndian)
                .parse(&bases, 8)
                .unwrap();
            let eh_frame = EhFrame::new(eh_frame_bytes, LittleEndian);
            let step = (code.len() / 20_000).max(1);
            for probe in (code.start as u64 - 64..code.end as u64 + 64).step_by(step) {
                let theirs = hdr
                    .table()
                    .unwrap()
                    .fde_for_address(&eh_frame, &bases, probe, EhFrame::cie_from_offset)
                    .ok();
                // None only below the first function, where gimli finds no FDE either.
                let Some(ours) = search_table(hdr_bytes, s.eh_frame_hdr.0 as u64, probe) else {
                    assert!(theirs.is_none(), "{probe:#x}");
                    continue;
                };
                let offset = (ours.1 - s.eh_frame.0 as u64) as usize;
                let fde = eh_frame
                    .fde_from_offset(&bases, EhFrameOffset(offset), EhFrame::cie_from_offset)
                    .unwrap();
                assert_eq!(fde.initial_address(), ours.0, "{probe:#x}");
                match theirs {
                    Some(theirs) => assert_eq!(theirs.offset(), offset, "{probe:#x}"),
                    None => assert!(!fde.contains(probe), "{probe:#x}"),
                }
                searched += 1;
            }
        }
        assert!(searched > 30_000);
    }
}
