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
//! framehop, like addresses without an FDE and everything once the row arena is full. Both
//! maps grow with the program: at a fixed size, every return address past it searched
//! `.eh_frame_hdr` on every step, and every FDE past it was compiled into the arena again on
//! every miss (the arena's resident memory grew with each pass over such code). Past 3 million
//! return addresses, new ones find their FDE's compiled rows on every step.
//!
//! Rules are keyed by address, and an address means the same code only while its module stays
//! mapped: the one table ([`RULES`]) outlives module snapshots, and a rescan forgets the rules
//! in the range of every module that went ([`Rules::forget_code`]).

use core::ops::Range;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::sys::{map_unreserved, publish_once, within_limit};

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EhFrameOffset, EndianSlice, FrameDescriptionEntry,
    LittleEndian, RegisterRule, UnwindContext, UnwindSection, X86_64,
};

/// Slots of the map by return address, log2: 64 KiB at first, 64 MiB (3 million addresses) at
/// most. Hashed keys touch every page of a table long before it fills (Bullet's scenes had
/// 868 KiB of a 1 MiB first table resident), so the table starts small and grows fourfold as
/// it fills (yaml-cpp's test suite meets 25,000 return addresses: two copies).
const PC_BITS: (u32, u32) = (12, 22);
/// Slots of the map by FDE, log2: 16 KiB at first (yaml-cpp's suite meets 2,600 FDEs, and grows
/// it once), 16 MiB at most.
const FDE_BITS: (u32, u32) = (10, 20);
/// Slots probed before giving up on a key.
const MAX_PROBES: usize = 32;

/// gimli's CFI evaluation context, one per unwinder slot (created outside the hot path).
pub(crate) type CfiContext = UnwindContext<usize, CompactCfi>;

/// Room for what compiled rules need of CFI, inline: x86-64 code states at most the six
/// callee-saved registers and the return address, where gimli's default storage keeps 192
/// rules a row (6 KiB, which it copies whole each time it clones or moves a row: a third of
/// the extra cache-line writes of yaml-cpp's suite). CFI that needs more rules or a deeper
/// remember-state stack fails to evaluate here and is left to framehop ([`Rules::rows_of`]).
pub(crate) struct CompactCfi;

impl gimli::UnwindContextStorage<usize> for CompactCfi {
    type Rules = [(gimli::Register, RegisterRule<usize>); 24];
    type Stack = [gimli::UnwindTableRow<usize, Self>; 4];
}

/// A packed rule (0 = none yet): bit 0 set; bit 1: step with framehop instead; bit 4: no caller
/// (the end of the stack); bit 5: a guess for code no FDE covers; bit 2: the CFA
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
    const NO_CFI: u64 = 32;

    /// Step this address with framehop (its own DWARF evaluation and frame-pointer guesses).
    pub(crate) const FRAMEHOP_STEP: Rule = Rule(Self::PRESENT | Self::FRAMEHOP);
    /// The outermost frame (`_start`, `clone`): its CFI leaves the return address undefined.
    pub(crate) const END_OF_STACK: Rule = Rule(Self::PRESENT | Self::END);
    /// Code no FDE covers (hand-written assembly: `makecontext`'s `__start_context`, a fiber
    /// library's trampoline): the frame-pointer guess framehop makes there, CFA `rbp + 16`,
    /// the return address at `CFA - 8`, the caller's rbp at `CFA - 16`; marked apart from the
    /// same rule stated by CFI (every `-O0` function's body). Compiled, so that such
    /// a frame (the outermost of every fiber) neither takes the slow path nor keeps the walks
    /// through it from being taken over.
    pub(crate) const FRAME_POINTER: Rule = Rule(
        Self::PRESENT
            | Self::NO_CFI
            | Self::CFA_RBP
            | Self::BP_SAVED
            | ((-1i8 as u8 as u64) << 8)
            | ((-2i8 as u8 as u64) << 16)
            | (16 << 32),
    );

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

    /// [`search_table`] over this module's `.eh_frame_hdr`.
    fn search(&self, probe: u64) -> Option<(u64, u64)> {
        search_table(self.bytes().0, self.eh_frame_hdr.0 as u64, probe)
    }

    /// The FDE for `probe`: the one [`Sections::search`] found (`found`), else gimli's search
    /// of the table (which reads layouts `search_table` does not).
    fn fde(
        &self,
        found: Option<(u64, u64)>,
        probe: u64,
    ) -> Option<FrameDescriptionEntry<EndianSlice<'static, LittleEndian>>> {
        let (hdr_bytes, eh_frame_bytes) = self.bytes();
        let bases = self.bases();
        let eh_frame = EhFrame::new(eh_frame_bytes, LittleEndian);
        match found {
            Some((_, fde_at)) => {
                let offset = usize::try_from(fde_at.checked_sub(self.eh_frame.0 as u64)?).ok()?;
                eh_frame
                    .fde_from_offset(&bases, EhFrameOffset(offset), EhFrame::cie_from_offset)
                    .ok()
            }
            None => EhFrameHdr::new(hdr_bytes, LittleEndian)
                .parse(&bases, 8)
                .ok()?
                .table()?
                .fde_for_address(&eh_frame, &bases, probe, EhFrame::cie_from_offset)
                .ok(),
        }
    }

    /// The code the FDE starting exactly at `start` covers, if one does.
    pub(crate) fn function_starting_at(&self, start: u64) -> Option<Range<u64>> {
        if self.eh_frame_hdr.1 == 0 || self.eh_frame.1 == 0 {
            return None;
        }
        let fde = self.fde(self.search(start), start)?;
        if fde.initial_address() != start {
            return None;
        }
        Some(start..start.checked_add(fde.len())?)
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
    /// The rows mapped (0 until the thread that mapped them says).
    capacity: AtomicUsize,
    used: AtomicUsize,
}

/// Rows [`Rules::compile`] evaluates an FDE into before it claims them in the arena.
const COMPILE_BUFFER: usize = 64;

/// Rows the arena holds at most: 64 MiB of address space (a 32nd of an address-space limit at
/// most), pages touched as FDEs are compiled.
const ARENA_ROWS: usize = 1 << 22;

impl RowArena {
    /// Claims `len` rows: their index and themselves; `None` when the arena is full.
    #[allow(clippy::mut_from_ref)] // each claim hands out rows no other claim overlaps
    fn claim(&self, len: usize) -> Option<(usize, &mut [[u64; 2]])> {
        let mut p = self.rows.load(Ordering::Acquire);
        if p.is_null() {
            let rows = within_limit(ARENA_ROWS * 16, 32) / 16;
            let mine = map_unreserved(rows * 16).cast::<[u64; 2]>();
            if mine.is_null() {
                return None;
            }
            p = publish_once(&self.rows, mine, rows * 16);
            if p == mine {
                self.capacity.store(rows, Ordering::Release);
            }
        }
        // Until the mapping thread stores it, 0: a claim meanwhile fails, as in a full arena.
        let capacity = self.capacity.load(Ordering::Acquire);
        let at = self.used.fetch_add(len, Ordering::Relaxed);
        if at + len > capacity {
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

/// Slots of a thread's [`RuleMemo`], log2: 4 KiB.
const MEMO_BITS: u32 = 8;

/// The rules a thread stepped by lately, in front of [`RULES`]: a probe of the shared table
/// at a random slot of a megabyte or more missed the cache on most fresh frames of yaml-cpp's
/// suite (two in five of the walk's own time), while the return addresses a thread's walks step
/// from repeat (the callers of `new` above all). Direct-mapped, keyed by return address; as a
/// rescan may forget rules, the memo holds those of one snapshot and empties at another.
pub(crate) struct RuleMemo {
    /// The snapshot (its address) the memo's rules were looked up under.
    snap: usize,
    /// (return address, rule); a return address of 0 marks an empty slot.
    slots: [[u64; 2]; 1 << MEMO_BITS],
}

impl RuleMemo {
    pub(crate) const EMPTY: RuleMemo = RuleMemo {
        snap: 0,
        slots: [[0; 2]; 1 << MEMO_BITS],
    };

    /// The walks from now on use the snapshot `snap`.
    #[inline]
    pub(crate) fn use_snapshot(&mut self, snap: usize) {
        if snap != self.snap {
            self.slots = [[0; 2]; 1 << MEMO_BITS];
            self.snap = snap;
        }
    }

    /// [`Rules::cached`] through the memo.
    #[inline(always)]
    pub(crate) fn cached(&mut self, pc: usize) -> Option<Rule> {
        let slot = &mut self.slots
            [(pc as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) as usize >> (64 - MEMO_BITS)];
        if slot[0] == pc as u64 {
            return Some(Rule(slot[1]));
        }
        let rule = RULES.cached(pc)?;
        *slot = [pc as u64, rule.0];
        Some(rule)
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
    by_pc: WordMap,
    by_fde: WordMap,
    rows: RowArena,
}

impl Rules {
    const fn new() -> Self {
        Rules {
            by_pc: WordMap::new(PC_BITS.0, PC_BITS.1),
            by_fde: WordMap::new(FDE_BITS.0, FDE_BITS.1),
            rows: RowArena {
                rows: AtomicPtr::new(ptr::null_mut()),
                capacity: AtomicUsize::new(0),
                used: AtomicUsize::new(0),
            },
        }
    }

    /// In a forked child: a map that a thread of the parent was growing can grow again (that
    /// thread is gone, and its copy was never published).
    pub(crate) fn after_fork_in_child(&self) {
        self.by_pc.forget_grower();
        self.by_fde.forget_grower();
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
        // A return address points after the call: the call itself is at `pc - 1`.
        let probe = pc as u64 - 1;
        let found = s.search(probe);
        let compiled = |start| {
            self.by_fde.get(start).map(|packed| {
                self.rows
                    .get((packed >> 32) as usize, packed as u32 as usize)
            })
        };
        let rows = match found.and_then(|(start, _)| compiled(start)) {
            Some(rows) => rows,
            None => {
                let fde = s.fde(found, probe)?;
                match compiled(fde.initial_address()) {
                    Some(rows) => rows,
                    None => {
                        let eh_frame = EhFrame::new(s.bytes().1, LittleEndian);
                        self.compile(&fde, &eh_frame, &s.bases(), ctx)?
                    }
                }
            }
        };
        let i = rows.partition_point(|r| r[0] <= probe).checked_sub(1)?;
        // The last row marks the FDE's end: an address past it lies in no FDE.
        Some(match rows[i][1] {
            0 => Rule::FRAME_POINTER,
            rule => Rule(rule),
        })
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
    /// From a row gimli cannot evaluate on, the FDE is framehop's: the row before it ends where
    /// it did, rather than stand for the rest.
    fn rows_of(
        fde: &FrameDescriptionEntry<EndianSlice<'_, LittleEndian>>,
        eh_frame: &EhFrame<EndianSlice<'_, LittleEndian>>,
        bases: &BaseAddresses,
        ctx: &mut CfiContext,
        out: &mut [[u64; 2]],
    ) -> Option<Result<usize, usize>> {
        let mut table = fde.rows(eh_frame, bases, ctx).ok()?;
        let (mut n, mut count) = (0, 1);
        let mut push = |start: u64, rule: Rule| {
            count += 1;
            if n > 0 && out.get(n - 1).is_some_and(|last| last[1] == rule.0) {
                return;
            }
            if let Some(slot) = out.get_mut(n) {
                *slot = [start, rule.0];
            }
            n += 1;
        };
        let mut evaluated_to = fde.initial_address();
        loop {
            match table.next_row() {
                Ok(Some(row)) => {
                    push(
                        row.start_address(),
                        rule_of_row(row).unwrap_or(Rule::FRAMEHOP_STEP),
                    );
                    evaluated_to = row.end_address();
                }
                Ok(None) => break,
                Err(_) => {
                    push(evaluated_to, Rule::FRAMEHOP_STEP);
                    break;
                }
            }
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
    let (entries, _) = hdr.get(12..12 + count.checked_mul(8)?)?.as_chunks::<8>();
    let at = |offset: [u8; 4]| hdr_address.wrapping_add(i32::from_le_bytes(offset) as i64 as u64);
    let start = |e: &[u8; 8]| at([e[0], e[1], e[2], e[3]]);
    // The entry sought is the last that starts at or below the probe.
    let e = &entries[entries
        .partition_point(|e| start(e) <= probe)
        .checked_sub(1)?];
    Some((start(e), at([e[4], e[5], e[6], e[7]])))
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
/// pairs in a `MAP_NORESERVE` table. An entry is claimed by a CAS of its key and then given its
/// value; a reader that finds the key before the value treats it as absent.
///
/// It is a cache of pure functions (a rule depends only on code that stays mapped), so an
/// entry may always be lost: a lookup that misses computes the value again. That makes growing
/// simple. Past 3/4 full, the inserting thread that takes `growing` copies the entries into a
/// table four times larger and publishes it; inserts made meanwhile into the old table are lost,
/// and its pages go back to the OS (a reader still probing them reads zeros: a miss). Old
/// tables stay mapped, as readers may hold them. A [`WordMap::forget`] that runs while entries
/// are copied may miss the copies, so a copy made across one is emptied after it is published.
struct WordMap {
    /// The current table: its address with the shift of its hashes in the low bits (see
    /// [`Table`]); 0 before the first lookup maps one.
    table: AtomicUsize,
    /// Entries of the current table (approximately: inserts lost to a copy still count).
    entries: AtomicUsize,
    growing: AtomicBool,
    /// Forgets so far: a copy that saw this change must forget everything it copied.
    forgets: AtomicUsize,
    /// Log2 of the first table's size and of the largest table's.
    first_bits: u32,
    last_bits: u32,
}

#[cfg(test)]
std::thread_local! {
    /// Run once by the calling thread's next copy just before it publishes its table, or by
    /// its next forget just before it scans (tests only): the races between the two, made
    /// to happen.
    static INTERLEAVE: core::cell::Cell<Option<fn(&WordMap)>> = const { core::cell::Cell::new(None) };
}

#[cfg(test)]
fn interleave(map: &WordMap) {
    if let Some(run) = INTERLEAVE.take() {
        run(map);
    }
}

/// Low bits of [`WordMap::table`] that hold how far a hash is shifted to index the table: 64
/// less its size's log2 (the hot probe needs the shift, and a mask made from it).
const SHIFT_BITS: usize = 63;

/// One table of a [`WordMap`]: `1 << bits` slots.
#[derive(Clone, Copy)]
struct Table {
    word: usize,
}

impl Table {
    /// The table of `1 << bits` slots mapped at `at`.
    fn new(at: *mut u8, bits: u32) -> Table {
        Table {
            word: at as usize | (64 - bits) as usize,
        }
    }

    fn shift(self) -> u32 {
        (self.word & SHIFT_BITS) as u32
    }

    fn bits(self) -> u32 {
        64 - self.shift()
    }

    fn slots(self) -> &'static [[AtomicU64; 2]] {
        // SAFETY: a published table word is the address of a mapping of `1 << bits` zeroed
        // pairs that is never unmapped, and every access to it is atomic.
        unsafe {
            core::slice::from_raw_parts(
                (self.word & !SHIFT_BITS) as *const [AtomicU64; 2],
                1 << self.bits(),
            )
        }
    }

    fn start(self, key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift()) as usize
    }

    fn next(self, i: usize) -> usize {
        (i + 1) & (usize::MAX >> self.shift())
    }

    /// Entries past which the map grows, or new keys are left out (probe chains stay short).
    fn full(self) -> usize {
        (1 << self.bits()) / 4 * 3
    }

    /// Claims a slot for `key -> value`: true if a new entry was made.
    fn insert(self, key: u64, value: u64) -> bool {
        let slots = self.slots();
        let mut i = self.start(key);
        for _ in 0..MAX_PROBES {
            let [k, v] = &slots[i];
            match k.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    v.store(value, Ordering::Release);
                    return true;
                }
                Err(found) if found == key => {
                    // Claimed by a concurrent insert (which stores the same rule) or forgotten.
                    let _ = v.compare_exchange(0, value, Ordering::AcqRel, Ordering::Relaxed);
                    return false;
                }
                Err(_) => i = self.next(i),
            }
        }
        false
    }
}

impl WordMap {
    /// A map of `1 << first_bits` slots at first, growing to `1 << last_bits` at most.
    const fn new(first_bits: u32, last_bits: u32) -> Self {
        WordMap {
            table: AtomicUsize::new(0),
            entries: AtomicUsize::new(0),
            growing: AtomicBool::new(false),
            forgets: AtomicUsize::new(0),
            first_bits,
            last_bits,
        }
    }

    #[inline(always)]
    fn current(&self) -> Option<Table> {
        match self.table.load(Ordering::Acquire) {
            0 => self.first_table(),
            word => Some(Table { word }),
        }
    }

    /// Maps the first table unless another thread did; `None` when mapping failed.
    #[cold]
    #[inline(never)]
    fn first_table(&self) -> Option<Table> {
        let bytes = 16usize << self.first_bits;
        let mine = map_unreserved(bytes);
        if mine.is_null() {
            return None;
        }
        let word = Table::new(mine, self.first_bits).word;
        match self
            .table
            .compare_exchange(0, word, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Some(Table { word }),
            Err(theirs) => {
                // SAFETY: our own mapping of `bytes` bytes, never published.
                unsafe { crate::sys::unmap_pages(mine.cast(), bytes) };
                Some(Table { word: theirs })
            }
        }
    }

    #[inline(always)]
    fn get(&self, key: u64) -> Option<u64> {
        let table = self.current()?;
        let slots = table.slots();
        let mut i = table.start(key);
        for _ in 0..MAX_PROBES {
            let [k, value] = &slots[i];
            match k.load(Ordering::Acquire) {
                0 => return None,
                found if found == key => {
                    let v = value.load(Ordering::Acquire);
                    return (v != 0).then_some(v);
                }
                _ => i = table.next(i),
            }
        }
        None
    }

    /// Empties the values of the keys `doomed` picks: their entries stay (probe chains run
    /// through them) and read as absent until [`WordMap::insert`] gives them a value again.
    fn forget(&self, doomed: impl Fn(u64) -> bool) {
        loop {
            let word = self.table.load(Ordering::SeqCst);
            if word == 0 {
                return;
            }
            #[cfg(test)]
            interleave(self);
            for [k, value] in (Table { word }).slots() {
                let key = k.load(Ordering::Acquire);
                if key != 0 && doomed(key) {
                    value.store(0, Ordering::Release);
                }
            }
            // Counted once the table is clean: a copy begun before the count may hold what was
            // just forgotten, and empties itself when it sees the count change; a table
            // published meanwhile is cleaned in the next round.
            self.forgets.fetch_add(1, Ordering::SeqCst);
            if self.table.load(Ordering::SeqCst) == word {
                return;
            }
        }
    }

    /// Adds `key -> value` unless the key has a value already or the map is full: later
    /// lookups find `value`, another thread's value for the same key, or nothing (a lost entry,
    /// computed again). A forgotten key gets its value back.
    fn insert(&self, key: u64, value: u64) {
        let Some(mut table) = self.current() else {
            return;
        };
        if self.entries.load(Ordering::Relaxed) >= table.full() {
            match self.grow(table) {
                Some(larger) => table = larger,
                None => return,
            }
        }
        if table.insert(key, value) {
            self.entries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Moves the entries of `old` into a table four times larger and publishes it; `None` when
    /// the map is as large as it gets, another thread grows it, or mapping failed.
    #[cold]
    #[inline(never)]
    fn grow(&self, old: Table) -> Option<Table> {
        if old.bits() + 2 > self.last_bits
            || self
                .growing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return None;
        }
        let larger = self.copy_into_larger(old);
        self.growing.store(false, Ordering::Release);
        larger
    }

    /// Lets the map grow again after the thread that was growing it vanished (in a forked
    /// child: its copy was never published).
    fn forget_grower(&self) {
        self.growing.store(false, Ordering::Release);
    }

    /// [`WordMap::grow`] once `growing` is held.
    fn copy_into_larger(&self, old: Table) -> Option<Table> {
        if self.table.load(Ordering::SeqCst) != old.word {
            return None; // grown since the caller looked
        }
        let bits = old.bits() + 2;
        let mapped = map_unreserved(16 << bits);
        if mapped.is_null() {
            return None;
        }
        let larger = Table::new(mapped, bits);
        let forgets = self.forgets.load(Ordering::SeqCst);
        let mut copied = 0;
        for [k, v] in old.slots() {
            let (key, value) = (k.load(Ordering::Acquire), v.load(Ordering::Acquire));
            if key != 0 && value != 0 && larger.insert(key, value) {
                copied += 1;
            }
        }
        self.entries.store(copied, Ordering::Relaxed);
        #[cfg(test)]
        interleave(self);
        self.table.store(larger.word, Ordering::SeqCst);
        if self.forgets.load(Ordering::SeqCst) != forgets {
            for [_, value] in larger.slots() {
                value.store(0, Ordering::Release);
            }
        }
        let old_slots = old.slots();
        // SAFETY: the old table is no longer published: a thread still probing it reads zeros
        // (a miss), and one still inserting there writes an entry nobody needs.
        unsafe { crate::sys::return_pages(old_slots.as_ptr() as *mut u8, old_slots.len() * 16) };
        Some(larger)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A map of its own for a test: tables are never unmapped, and a leaked map keeps them
    /// reachable for the threads that use it.
    fn leaked_map(first_bits: u32, last_bits: u32) -> &'static WordMap {
        Box::leak(Box::new(WordMap::new(first_bits, last_bits)))
    }

    #[test]
    fn the_frame_pointer_guess_steps_as_the_rule_cfi_states_but_is_told_apart() {
        let stated = Rule::new(true, 16, -8, Some(-16)).unwrap();
        assert_ne!(stated, Rule::FRAME_POINTER);
        assert_eq!(stated.0, Rule::FRAME_POINTER.0 & !Rule::NO_CFI);
        let stack = [0x7000u64, 0x401234]; // saved rbp, return address at rbp 0x1000
        let read = &mut |a: u64| Ok(stack[(a as usize - 0x1000) / 8]);
        assert_eq!(
            Rule::FRAME_POINTER.step(0x0f00, 0x1000, read),
            Some((0x401234, 0x1010, 0x7000))
        );
    }

    #[test]
    fn the_memo_serves_the_tables_rules_and_drops_them_at_another_snapshot() {
        // Not code: no walk steps from it, and its rule is forgotten again below.
        let pc = 0x7eee_0000_0010usize;
        let rule = Rule::new(false, 16, -8, None).unwrap();
        RULES.by_pc.insert(pc as u64, rule.0);
        let mut memo = Box::new(RuleMemo::EMPTY);
        memo.use_snapshot(1);
        assert_eq!(memo.cached(pc), Some(rule));
        assert_eq!(memo.cached(pc + 1), None);
        // A rescan forgets the rules of a module gone before it publishes a new snapshot.
        RULES.forget_code(core::slice::from_ref(&(pc..pc + 1)));
        memo.use_snapshot(1);
        assert_eq!(
            memo.cached(pc),
            Some(rule),
            "one snapshot: the memo holds its rules"
        );
        memo.use_snapshot(2);
        assert_eq!(
            memo.cached(pc),
            None,
            "a forgotten rule outlived its snapshot"
        );
    }

    #[test]
    fn a_map_grows_and_keeps_its_entries() {
        let map = leaked_map(8, 16);
        let keys = 1..=20_000u64;
        for k in keys.clone() {
            map.insert(k * 64, k);
        }
        assert_eq!(map.current().unwrap().bits(), 16);
        // One thread alone loses no entry to a copy; a probe chain past its limit may.
        let found = keys.clone().filter(|&k| map.get(k * 64) == Some(k)).count();
        assert!(found >= 19_900, "{found} of 20000");
        assert!(keys.clone().all(|k| map.get(k * 64).is_none_or(|v| v == k)));
    }

    #[test]
    fn a_map_stops_growing_at_its_largest_size() {
        let map = leaked_map(6, 10);
        for k in 1..=10_000u64 {
            map.insert(k, k);
        }
        let table = map.current().unwrap();
        assert_eq!(table.bits(), 10);
        let held = (1..=10_000u64).filter(|&k| map.get(k).is_some()).count();
        assert!(held <= table.full() && held >= table.full() - 16, "{held}");
    }

    /// A map with odd keys (to be forgotten) and even ones, which the next insert grows.
    fn map_about_to_grow() -> &'static WordMap {
        let map = leaked_map(8, 12);
        let mut k = 1;
        while map.entries.load(Ordering::Relaxed) < map.current().unwrap().full() {
            map.insert(k, 7);
            k += 1;
        }
        map
    }

    fn forget_odd_keys(map: &WordMap) {
        map.forget(|k| k % 2 == 1);
    }

    fn no_odd_key_has_a_value(map: &WordMap) {
        let table = map.current().unwrap();
        assert_eq!(table.bits(), 10, "the map grew once");
        for [k, v] in table.slots() {
            let key = k.load(Ordering::Relaxed);
            assert!(key % 2 == 0 || v.load(Ordering::Relaxed) == 0, "{key}");
        }
    }

    /// A child forked while a thread of the parent grew the map: it grows when the next insert
    /// finds it full, once told that the grower is gone.
    #[test]
    fn a_map_that_a_vanished_thread_was_growing_grows_again() {
        let map = map_about_to_grow();
        map.growing.store(true, Ordering::Release); // the parent's thread, mid-copy at the fork
        map.insert(1 << 40, 9);
        assert_eq!(map.current().unwrap().bits(), 8, "no second copy at once");
        map.forget_grower();
        map.insert(1 << 41, 9);
        assert_eq!(map.current().unwrap().bits(), 10);
        assert_eq!(map.get(1 << 41), Some(9));
    }

    /// A forget made after a copy read the entries and before it is published: the copy
    /// forgets everything, as it cannot tell what it missed.
    #[test]
    fn a_forget_during_a_copy_is_not_undone_by_the_copy() {
        let map = map_about_to_grow();
        INTERLEAVE.set(Some(forget_odd_keys));
        map.insert(1 << 40, 9);
        assert!(INTERLEAVE.take().is_none(), "the copy ran the forget");
        no_odd_key_has_a_value(map);
    }

    /// A copy published while a forget scans the old table: the forget scans the new one too.
    #[test]
    fn a_forget_that_outlasts_a_copy_forgets_in_the_copy_too() {
        let map = map_about_to_grow();
        INTERLEAVE.set(Some(|map| map.insert(1 << 40, 9)));
        forget_odd_keys(map);
        assert!(INTERLEAVE.take().is_none(), "the forget ran the copy");
        no_odd_key_has_a_value(map);
    }

    /// Walks stay those of the referee once the rules by return address moved into a larger
    /// table (filled here with addresses no code has). Each walk runs on a thread of its own,
    /// so that it takes over nothing from an earlier walk and looks up the rule of every frame.
    #[test]
    fn walks_agree_with_the_referee_after_the_rule_table_grows() {
        let walk_in_a_new_thread = || {
            std::thread::spawn(|| {
                let (mut ours, mut theirs) = (Vec::new(), Vec::new());
                super::super::tests::referee_outer(&mut ours, &mut theirs);
                let start = theirs
                    .iter()
                    .position(|&a| a == ours[0])
                    .expect("first frame");
                let common = ours.len().min(theirs.len() - start);
                assert!(common >= 3, "{ours:x?}");
                assert_eq!(&ours[..common], &theirs[start..start + common]);
            })
            .join()
            .unwrap()
        };
        walk_in_a_new_thread();
        let before = RULES.by_pc.current().unwrap().bits();
        let no_code = 0xffff_8000_0000_0000u64;
        let mut k = 0;
        while RULES.by_pc.current().unwrap().bits() == before {
            RULES.by_pc.insert(no_code + k * 16, Rule::FRAMEHOP_STEP.0);
            k += 1;
        }
        walk_in_a_new_thread();
        walk_in_a_new_thread();
    }

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
