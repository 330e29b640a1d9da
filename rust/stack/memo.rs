//! A record of the previous DWARF walk of a cache slot, so that the next walk can reuse the part
//! of it that provably repeats (hot allocation sites capture the same chain over and over).
//!
//! Why reuse is exact: with one module snapshot, framehop's x86-64 step from a frame is a
//! deterministic function of that frame's `(ip, sp, bp)` and of the values its `read_stack`
//! callback returns (its rules and its DWARF evaluation read no other register, and its rule
//! cache only memoises rules). A [`Memo`] stores, per frame, those three registers and the
//! `(address, result)` of every read of the step from it, in order. If a walk reaches a frame
//! whose registers equal memo frame `j`'s and every recorded read of the step from `j` still
//! gives the recorded result (re-read now, with this walk's stack bounds), then by induction
//! over the reads the step would ask for the same addresses, get the same values and produce
//! memo frame `j + 1`; and so on along the memo.
//!
//! One register is spared that equality: rbp, which code built without frame pointers uses as
//! an ordinary register (a loop counter, say), so that it differs from walk to walk in the
//! frames below the first one that saves it, and in the saved copy that a step restores. What a
//! step does with rbp is a property of the rule at its pc, learnt by comparing two walks that
//! step from the same pc and sp and reach the same caller pc and sp ([`Splice::end_step`]):
//! with different incoming rbp values and the same read addresses, the step does not use rbp
//! (`bp_free`); the caller's rbp is the incoming one, one of the reads, or fixed (`bp_out`),
//! whichever explains both walks. framehop's rules compute addresses and registers as a register
//! plus an offset or through reads, so a rule that used rbp would have read elsewhere or reached
//! another caller. A frame whose step is known on both counts is taken over whatever its rbp,
//! with the restoring read's value allowed to differ, and gives its caller the rbp the step
//! would give it.
//!
//! The memo is per thread (4 KiB of its thread-local state). One walk rewrites it in place as it goes (see [`Splice`]): no second buffer, and the
//! common case, a walk that differs from the last one only in some steps at the same depth,
//! moves nothing.

use super::MAX_DEPTH;

/// Reads recorded per step. framehop's x86-64 rules for return addresses read one or two words
/// (return address, saved rbp), and so does its DWARF fallback for usual tables; a step that
/// reads more ends the memo there.
const STEP_READS: usize = 2;

/// [`Frame::reads`] of a step that is not recorded (it read more than [`STEP_READS`] words, or
/// the frame's rbp changed since).
const NOT_RECORDED: u8 = STEP_READS as u8 + 1;

/// Marks a failed read in [`Frame::addr`]. Successful reads are of aligned addresses, so bit 0 is
/// free; a failed read of an odd address re-checks the even address below it, which can only
/// turn a true match into a miss, never the reverse (an odd address always fails).
const FAILED: u64 = 1;

/// Where the step from a frame takes the caller's rbp from (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq)]
enum BpOut {
    Unknown,
    /// The incoming rbp, untouched.
    PassedOn,
    /// The value of this read of the step.
    Read(u8),
    /// Always the same value, whatever the incoming rbp.
    Fixed,
}

/// One frame of a walk: its registers and the reads of the step from it.
#[derive(Clone, Copy)]
struct Frame {
    pc: usize,
    sp: usize,
    fp: usize,
    /// Reads the step made; more than [`STEP_READS`]: the step is not recorded.
    reads: u8,
    /// The step's reads and caller pc and sp do not depend on the incoming rbp (learnt).
    bp_free: bool,
    /// Where the step takes the caller's rbp from (learnt).
    bp_out: BpOut,
    addr: [u64; STEP_READS],
    val: [u64; STEP_READS],
}

impl Frame {
    const EMPTY: Frame = Frame {
        pc: 0,
        sp: 0,
        fp: 0,
        reads: 0,
        bp_free: false,
        bp_out: BpOut::Unknown,
        addr: [0; STEP_READS],
        val: [0; STEP_READS],
    };

    /// Whether every recorded read of the step from this frame still gives its result (so the
    /// step, from the same registers, repeats exactly).
    #[inline]
    fn step_repeats(&self, read: &impl Fn(u64) -> Result<u64, ()>) -> bool {
        let k = self.reads as usize;
        k <= STEP_READS
            && (0..k).all(|r| {
                let a = self.addr[r];
                if a & FAILED == 0 {
                    read(a) == Ok(self.val[r])
                } else {
                    read(a & !FAILED).is_err()
                }
            })
    }

    /// Whether the recorded step from this frame can stand for the step from it with rbp `fp`.
    #[inline]
    fn reusable_with(&self, fp: usize) -> bool {
        fp == self.fp || (self.bp_free && self.bp_out != BpOut::Unknown)
    }

    /// If the recorded step from this frame is the step from it now, with rbp `fp`: the rbp the
    /// caller gets (`caller_fp` is the recorded caller's). Every recorded read must give its
    /// result again, except the one the caller's rbp comes from, which may give another value.
    #[inline]
    fn step_holds(
        &self,
        fp: usize,
        caller_fp: usize,
        read: &impl Fn(u64) -> Result<u64, ()>,
    ) -> Option<usize> {
        if fp == self.fp && self.step_repeats(read) {
            return Some(caller_fp);
        }
        if !self.reusable_with(fp) || self.reads > STEP_READS as u8 {
            return None;
        }
        let mut caller_fp = match self.bp_out {
            BpOut::PassedOn => fp,
            _ => caller_fp,
        };
        for r in 0..self.reads as usize {
            let a = self.addr[r];
            if a & FAILED != 0 {
                if read(a & !FAILED).is_ok() {
                    return None;
                }
                continue;
            }
            let value = read(a).ok()?;
            if self.bp_out == BpOut::Read(r as u8) {
                caller_fp = value as usize;
            } else if value != self.val[r] {
                return None;
            }
        }
        Some(caller_fp)
    }

    /// What the step from this frame, compared with the step `before` from the same pc and sp
    /// (both reaching the same caller pc and sp: `fp` now, `caller_fp_before` then), tells about
    /// its rbp rule; learnt once, kept for the pc.
    fn learn_bp_rule(&mut self, before: &Frame, fp: usize, caller_fp_before: usize) {
        let k = self.reads as usize;
        if k > STEP_READS || k != before.reads as usize || self.addr[..k] != before.addr[..k] {
            return;
        }
        let differing = (0..k)
            .filter(|&r| self.addr[r] & FAILED == 0 && self.val[r] != before.val[r])
            .fold((0, 0), |(count, _), r| (count + 1, r));
        let other_incoming = self.fp != before.fp;
        self.bp_free |= other_incoming;
        let learnt = match differing {
            (0, _) if other_incoming && fp == self.fp && caller_fp_before == before.fp => {
                BpOut::PassedOn
            }
            (0, _) if other_incoming && fp == caller_fp_before => BpOut::Fixed,
            (1, r) if fp as u64 == self.val[r] && caller_fp_before as u64 == before.val[r] => {
                BpOut::Read(r as u8)
            }
            _ => return,
        };
        self.bp_out = learnt;
    }
}

/// The previous walk of a slot: frames `0..len`, the steps between them and, if `ends`, the
/// failed step after the last one.
pub(super) struct Memo {
    len: usize,
    ends: bool,
    /// Address of the module snapshot the frames were checked and stepped with (0: none).
    /// Snapshots are never freed, so equal addresses mean the same snapshot.
    snap: usize,
    /// The depot id of exactly frames `0..len`, or 0 if not known.
    pub(super) id: u32,
    frames: [Frame; MAX_DEPTH],
}

impl Memo {
    pub(super) const EMPTY: Memo = Memo {
        len: 0,
        ends: false,
        snap: 0,
        id: 0,
        frames: [Frame::EMPTY; MAX_DEPTH],
    };

    /// Whether the memo holds exactly the `n` frames the last walk produced.
    #[inline]
    pub(super) fn describes(&self, n: usize) -> bool {
        self.snap != 0 && self.len == n
    }
}

/// One walk's use of a memo. The walk's frames `0..n` are written over the memo's slots as it
/// goes; slots from `n` (and from `j`) up to `old_len` still hold the previous walk and can be
/// matched and taken over.
pub(super) struct Splice<'m> {
    m: &'m mut Memo,
    snap: usize,
    old_len: usize,
    old_ends: bool,
    /// Previous-walk frames below `j` can't match any more (their sp is below the walk's).
    j: usize,
    /// `m.len` when the walk began.
    orig_len: usize,
    /// Every frame so far has the pc the memo had at that position: if the walk also ends at
    /// `orig_len`, its frames are the memo's frames and the memo's id still names them, even if
    /// some registers or reads differed (a saved rbp holding a loop counter, say).
    same_pcs: bool,
    /// Recording stopped (a step with too many reads, or the snapshot changed); `m.len` final.
    sealed: bool,
    /// The previous walk's frame at the position being stepped afresh and the frame after it,
    /// when the previous walk had the same pc and sp there: the step now, compared with it,
    /// may teach the pc's rbp rule ([`Splice::end_step`]).
    compare: Option<(usize, Frame, Frame)>,
    /// Only checking whether the walk repeats the memo ([`Splice::repeat_all`]): the memo is left
    /// as it is.
    checking: bool,
}

impl<'m> Splice<'m> {
    #[inline]
    pub(super) fn new(m: &'m mut Memo, snap: usize) -> Self {
        let (old_len, old_ends) = if m.snap == snap {
            (m.len, m.ends)
        } else {
            (0, false)
        };
        Splice {
            m,
            snap,
            old_len,
            old_ends,
            j: 0,
            orig_len: old_len,
            same_pcs: true,
            sealed: false,
            compare: None,
            checking: false,
        }
    }

    /// At output position `n`, a frame with these registers: if the previous walk had it, takes
    /// over the frames from there that provably repeat (at least this one, at most `depth - n`),
    /// writes their pcs to `out[n..]` and returns how many, and whether the walk provably ends
    /// after them.
    #[inline]
    pub(super) fn take_over(
        &mut self,
        n: usize,
        (pc, sp, fp): (usize, usize, usize),
        depth: usize,
        read: &impl Fn(u64) -> Result<u64, ()>,
        out: &mut [core::mem::MaybeUninit<usize>],
    ) -> Option<(usize, bool)> {
        if self.sealed {
            return None;
        }
        let f = &mut self.m.frames;
        let mut j = self.j.max(n);
        while j < self.old_len && f[j].sp < sp {
            j += 1;
        }
        self.j = j;
        if j >= self.old_len || f[j].sp != sp || f[j].pc != pc || !f[j].reusable_with(fp) {
            return None;
        }
        if j > n {
            // This walk is shallower than the last: move the shared part down to position n.
            f.copy_within(j..self.old_len, n);
            self.old_len -= j - n;
            self.same_pcs = false;
        }
        let max = (depth - n).min(self.old_len - n);
        // Frame n + g - 1 is this walk's, with rbp `fp`; the recorded step from it gives frame
        // n + g, with the rbp it returns, if its reads still give what they gave.
        let mut fp = fp;
        let mut g = 1;
        let stepped = loop {
            if fp == f[n + g - 1].fp {
                // The common case, kept tight: steps that repeat exactly keep the recorded rbp.
                while g < max && f[n + g - 1].step_repeats(read) {
                    g += 1;
                }
                fp = f[n + g - 1].fp;
            }
            if g == max {
                break None;
            }
            let k = n + g - 1;
            let caller_fp = if k + 1 < self.old_len { f[k + 1].fp } else { 0 };
            match f[k].step_holds(fp, caller_fp, read) {
                Some(caller_fp) => {
                    if !self.checking {
                        // Now the recorded step is this walk's: the registers it started from
                        // and the rbp it restored (which the caller gets below).
                        f[k].fp = fp;
                        if let BpOut::Read(r) = f[k].bp_out {
                            f[k].val[r as usize] = caller_fp as u64;
                        }
                    }
                    fp = caller_fp;
                    g += 1;
                }
                None => break Some(k),
            }
        };
        let last = n + g - 1;
        let ended = n + g == self.old_len
            && n + g < depth
            && self.old_ends
            && f[last].step_holds(fp, 0, read).is_some();
        if !self.checking {
            if let (Some(k), true) = (stepped, last + 1 < self.old_len) {
                // The walk steps afresh from frame k; compared with the recorded step, the
                // fresh one may teach the rbp rule.
                self.compare = Some((k, f[k], f[k + 1]));
            }
            if f[last].fp != fp {
                // The last frame is this walk's; unless its step was just proven, the recorded
                // step was from another rbp and no longer counts (a walk that goes on records
                // it afresh).
                f[last].fp = fp;
                if !ended {
                    f[last].reads = NOT_RECORDED;
                }
            }
        }
        for (o, fr) in out[n..n + g].iter_mut().zip(&f[n..n + g]) {
            o.write(fr.pc);
        }
        if !self.checking {
            self.j = n + g;
        }
        Some((g, ended))
    }

    /// The frame count if the walk from `start` provably repeats the memo in full (same
    /// frames, same end, its pcs written to `out`), so that its id still applies.
    #[inline]
    pub(super) fn repeat_all(
        mut self,
        start: super::StartFrame,
        read: &impl Fn(u64) -> Result<u64, ()>,
        out: &mut [core::mem::MaybeUninit<usize>],
    ) -> Option<usize> {
        // Only frame 0 may match: `take_over` must not move frames, as nothing here would
        // record the result.
        if self.old_len == 0 || self.m.frames[0].sp != start.sp {
            return None;
        }
        let depth = out.len();
        self.checking = true;
        let (g, ended) = self.take_over(0, (start.pc, start.sp, start.fp), depth, read, out)?;
        (g == self.orig_len && (g == depth || ended)).then_some(g)
    }

    /// The registers of frame `i`, which this walk wrote or took over.
    #[inline]
    pub(super) fn frame(&self, i: usize) -> (usize, usize, usize) {
        let f = &self.m.frames[i];
        (f.pc, f.sp, f.fp)
    }

    /// Records a frame this walk unwound itself at position `n`.
    #[inline]
    pub(super) fn push_frame(&mut self, n: usize, pc: usize, sp: usize, fp: usize) {
        if self.sealed {
            return;
        }
        // The previous walk's frame at this position and the one after it, if still there.
        let previous = (n >= self.j && n < self.old_len).then(|| self.m.frames[n]);
        self.compare = match previous {
            Some(p) if p.pc == pc && p.sp == sp && n + 1 < self.old_len => {
                Some((n, p, self.m.frames[n + 1]))
            }
            _ => None,
        };
        self.same_pcs &= n < self.orig_len && self.m.frames[n].pc == pc;
        let f = &mut self.m.frames[n];
        // The rbp rule belongs to the pc.
        let (bp_free, bp_out) = match previous {
            Some(p) if p.pc == pc => (p.bp_free, p.bp_out),
            _ => (false, BpOut::Unknown),
        };
        f.bp_free = bp_free;
        f.bp_out = bp_out;
        f.pc = pc;
        f.sp = sp;
        f.fp = fp;
    }

    /// Starts recording the step from frame `i` (replacing what the last walk had there).
    #[inline]
    pub(super) fn begin_step(&mut self, i: usize) {
        if !self.sealed {
            self.m.frames[i].reads = 0;
        }
    }

    /// Records one read of the step from frame `i`.
    #[inline]
    pub(super) fn log(&mut self, i: usize, addr: u64, got: Result<u64, ()>) {
        if self.sealed {
            return;
        }
        let f = &mut self.m.frames[i];
        let r = f.reads as usize;
        if r < STEP_READS {
            match got {
                Ok(v) => {
                    f.addr[r] = addr;
                    f.val[r] = v;
                }
                Err(()) => f.addr[r] = addr | FAILED,
            }
        }
        f.reads = (r + 1).min(NOT_RECORDED as usize) as u8;
    }

    /// The step from frame `i` succeeded, reaching the caller's `(pc, sp, fp)`; if it could not
    /// be recorded the memo ends at `i`.
    #[inline]
    pub(super) fn end_step(&mut self, i: usize, (pc, sp, fp): (usize, usize, usize)) {
        if self.sealed {
            return;
        }
        let f = &mut self.m.frames[i];
        if f.reads as usize > STEP_READS {
            self.seal(i + 1);
            return;
        }
        if let Some((at, before, caller_before)) = self.compare.take() {
            if at == i && caller_before.pc == pc && caller_before.sp == sp {
                f.learn_bp_rule(&before, fp, caller_before.fp);
            }
        }
    }

    fn seal(&mut self, len: usize) {
        self.m.len = len;
        self.m.ends = false;
        self.sealed = true;
        self.m.id = 0;
    }

    /// The module snapshot changed during the walk: what was recorded was checked against the
    /// old one, so keep nothing.
    pub(super) fn invalidate(&mut self) {
        self.seal(0);
        self.snap = 0;
    }

    /// The walk produced `n` frames; `ended`: its step after the last one failed.
    #[inline]
    pub(super) fn finish(self, n: usize, ended: bool) {
        let m = self.m;
        if !self.sealed {
            // A failed step is only known to repeat if all its reads were recorded.
            let ends = ended && m.frames[n - 1].reads as usize <= STEP_READS;
            if !self.same_pcs || n != self.orig_len {
                m.id = 0;
            }
            m.len = n;
            m.ends = ends;
        }
        m.snap = self.snap;
    }
}
