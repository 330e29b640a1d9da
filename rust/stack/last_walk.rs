//! The thread's last DWARF walk, kept so that a walk that reaches one of its frames again takes over the rest of it when that provably repeats.
//!
//! A step by a compiled rule is a function of its frame's pc, sp and (if the rule uses it) rbp,
//! of the module snapshot (whose rules never change once made) and of the one or two stack
//! words it reads. So when a walk reaches a frame with the pc and sp of a frame of the last walk
//! (and its rbp, where the rest of that walk depends on it), and every word the last walk read
//! from that frame outward reads the same again, the rest of the walk is the last walk's rest:
//! its frames are taken over without unwinding. Consecutive allocations share most of their
//! outer frames (yaml-cpp's test suite: four frames in five), and checking a recorded step is a
//! load and a compare, where making it is a probe of the rule table and a chain of dependent
//! loads. A saved rbp that a step restores but no later step uses (`-O2` code keeps loop
//! counters in rbp) need only read again, whatever its value: compiled rules tell which.
//!
//! Frames below a slow step (a rule compiled on the way, framehop, a module rescan) are never
//! taken over from: their steps were not recorded.
//!
//! Each kept frame also knows its depot node (the stack of it and its callers), so that a walk
//! which took over interns only the frames in front of the ones it took over
//! ([`LastWalk::intern`]), where comparing the whole stack with the last one would visit every
//! frame again.

use core::mem::MaybeUninit;

use super::capture::{Stack, StackWords};
use super::depot::{self, Interned};
use super::rules::{Rule, RuleMemo};
use super::{StackId, MAX_DEPTH};

/// Marks a failed read in a recorded address: reads that succeed are of aligned addresses. A
/// failed read of an odd address checks the even one below it again, which can only make a
/// check fail, never pass wrongly (an odd address never reads).
const FAILED: u64 = 1;
/// Marks a read whose value no later step uses (a restored rbp): it need only read again.
const UNUSED: u64 = 2;

/// [`Frame::flags`]: the step from the frame computed its CFA from rbp.
const USES_BP: u8 = 1;
/// The step from the frame read the caller's rbp (at [`Frame::bp_at`]).
const RESTORES_BP: u8 = 2;
/// The walk from the frame on depends on its rbp.
const BP_MATTERS: u8 = 4;

/// One frame of a walk and where the step from it read the stack. A cache line each: walks
/// index and count frames, and 64 bytes make that shifts.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct Frame {
    pc: usize,
    sp: u64,
    bp: u64,
    /// The address of the caller's return address.
    ra_at: u64,
    /// The address of the caller's saved rbp where its value counts (else 0).
    bp_at: u64,
    /// The lowest address the steps from this frame outward read (the last one's excepted).
    low: u64,
    /// The depot node of the stack made of this frame and its callers (0: not known).
    node: u32,
    flags: u8,
}

impl Frame {
    const EMPTY: Frame = Frame {
        pc: 0,
        sp: 0,
        bp: 0,
        ra_at: 0,
        bp_at: 0,
        low: 0,
        node: 0,
        flags: 0,
    };
}

/// How the frames kept in a [`LastWalk`] relate to the output of the walk that just ended.
#[derive(Clone, Copy)]
enum Outcome {
    /// They are not its output (it was cut at its depth inside frames taken over, or was not
    /// a DWARF walk).
    Unrelated,
    /// They are its output, outermost first; their nodes are not known yet.
    Recorded,
    /// They are its output: `frames[..=k]` taken over (with their nodes), then `fresh` frames
    /// of its own.
    Resumed { fresh: usize, k: usize },
}

pub(super) struct LastWalk {
    /// The snapshot's address (snapshots are never freed, so it names one).
    snap: usize,
    /// The depot root the frames' nodes hang from (a generation's, see `depot`).
    root: u32,
    /// What the last walk left for [`LastWalk::intern`].
    outcome: Outcome,
    /// The last walk's frames, outermost first, so that a walk that takes over its outer part
    /// writes only its own frames in front of it.
    frames: [Frame; MAX_DEPTH],
    len: usize,
    /// `frames[..reusable]` may be taken over from: every step from them outward was compiled.
    reusable: usize,
    /// The walk stopped at its depth: the step from `frames[0]` was not made.
    truncated: bool,
    /// Otherwise the reads of the step from `frames[0]`, which ended the walk.
    end_at: [u64; 2],
    end_val: [u64; 2],
    end_reads: usize,
    /// The walk in progress: its frames so far, innermost first (their pcs are in its output).
    fresh: [Frame; MAX_DEPTH],
    /// The candidates of the walk in progress are `frames[..cursor]`, below `limit`.
    cursor: usize,
    limit: usize,
    /// `fresh[..barrier]` lie below a slow step and cannot be taken over from.
    barrier: usize,
    /// The reads of the step being made.
    step_at: [u64; 2],
    step_val: [u64; 2],
    step_reads: usize,
    /// The rules the thread's walks stepped by lately.
    rules: RuleMemo,
}

impl LastWalk {
    pub(super) const EMPTY: LastWalk = LastWalk {
        snap: 0,
        root: 0,
        outcome: Outcome::Unrelated,
        frames: [Frame::EMPTY; MAX_DEPTH],
        len: 0,
        reusable: 0,
        truncated: true,
        end_at: [0; 2],
        end_val: [0; 2],
        end_reads: 0,
        fresh: [Frame::EMPTY; MAX_DEPTH],
        cursor: 0,
        limit: 0,
        barrier: 0,
        step_at: [0; 2],
        step_val: [0; 2],
        step_reads: 0,
        rules: RuleMemo::EMPTY,
    };

    /// Starts a walk with the snapshot `snap`.
    #[inline]
    pub(super) fn begin(&mut self, snap: usize) {
        self.cursor = self.len;
        self.limit = if snap == self.snap { self.reusable } else { 0 };
        self.barrier = 0;
        self.rules.use_snapshot(snap);
    }

    /// The compiled rule of return address `pc`, if it has one (see [`RuleMemo`]).
    #[inline(always)]
    pub(super) fn cached_rule(&mut self, pc: usize) -> Option<Rule> {
        self.rules.cached(pc)
    }

    /// At frame `i` of the walk in progress, with registers `(pc, sp, bp)`: the walk's frame
    /// count if the last walk's frames from here on repeat on `stack` (the pcs of those are
    /// written to `out` by [`LastWalk::write_taken_over`] or [`LastWalk::intern`], if at all).
    /// Otherwise the frame is noted and the walk goes on.
    #[inline(always)]
    pub(super) fn take_over(
        &mut self,
        i: usize,
        (pc, sp, bp): (usize, u64, u64),
        stack: Stack,
        out: &mut [MaybeUninit<usize>],
    ) -> Option<usize> {
        // Both walks go up the stack: the candidate is the last walk's frame at this sp.
        while self.cursor > 0 && self.frames[self.cursor - 1].sp < sp {
            self.cursor -= 1;
        }
        if self.cursor > 0 && self.cursor <= self.limit {
            let k = self.cursor - 1;
            let f = &self.frames[k];
            if f.sp == sp && f.pc == pc && (f.flags & BP_MATTERS == 0 || f.bp == bp) {
                if let Some(n) = self.splice(i, k, stack, out) {
                    return Some(n);
                }
            }
        }
        self.fresh[i] = Frame {
            pc,
            sp,
            bp,
            ra_at: 0,
            bp_at: 0,
            low: 0,
            node: 0,
            flags: 0,
        };
        None
    }

    /// Takes over `frames[..=k]` behind the `i` frames of the walk in progress if every read of
    /// the steps that gave them gives the same again; the walk's frame count.
    #[inline(never)]
    fn splice(
        &mut self,
        i: usize,
        k: usize,
        stack: Stack,
        out: &mut [MaybeUninit<usize>],
    ) -> Option<usize> {
        let total = i + k + 1;
        if self.truncated && total < out.len() {
            return None; // the last walk stopped short of what this one may hold
        }
        let n = total.min(out.len());
        if let Err(failed) = self.repeats(i, k, n, stack, out) {
            // Every candidate from `failed` outward would check the same step again.
            self.limit = failed;
            return None;
        }
        if total <= MAX_DEPTH && (i > 0 || k + 1 < self.len) {
            self.keep(k + 1, i, out);
        } // else the last walk stays: a record is only ever used once its reads check again
        self.outcome = if n == total && total <= MAX_DEPTH {
            // Their pcs are written only if asked for (`write_taken_over`): interning the walk
            // needs its own frames alone.
            Outcome::Resumed { fresh: i, k }
        } else {
            // Cut inside the frames taken over: not a path from the root.
            self.write_pcs(k, &mut out[i..n]);
            Outcome::Unrelated
        };
        Some(n)
    }

    /// Whether the steps which gave `frames[k]` and its callers (and the last walk's end, if this
    /// walk ends there too) read the same again on `stack`, for a walk that has `i` frames of its
    /// own and holds `n`: if not, `Err` with the index of the frame whose step reads otherwise.
    /// Frames beyond `n` are not checked: a walk that stops at its depth never makes their steps.
    fn repeats(
        &self,
        i: usize,
        k: usize,
        n: usize,
        stack: Stack,
        out: &[MaybeUninit<usize>],
    ) -> Result<(), usize> {
        if !stack.holds_from(self.frames[k].low) {
            return Err(k + 1);
        }
        let outermost = k + i + 1 - n;
        let chain = &self.frames[outermost..=k];
        let steps = chain[1..].iter().zip(chain).rev();
        for (t, (f, caller)) in steps.enumerate() {
            // SAFETY: every read of the steps from `frames[k]` outward but the last one's lies at
            // or above `frames[k].low`, which the stack holds, and read before on this thread.
            let same = unsafe {
                stack.read_again(f.ra_at) == caller.pc as u64
                    && (f.bp_at == 0 || stack.read_again(f.bp_at) == caller.bp)
            };
            if !same {
                return Err(k - t);
            }
        }
        let ends_here = outermost == 0 && n < out.len();
        let end_same = !ends_here
            || self.end_at[..self.end_reads]
                .iter()
                .zip(&self.end_val[..self.end_reads])
                .all(|(&a, &v)| match a & (FAILED | UNUSED) {
                    0 => stack.read(a) == Ok(v),
                    FAILED => stack.read(a & !FAILED).is_err(),
                    _ => stack.read(a & !UNUSED).is_ok(),
                });
        if !end_same {
            return Err(0);
        }
        Ok(())
    }

    /// Writes the pcs of `frames[k]` and its callers, innermost first, into `out` (as many as
    /// it holds).
    fn write_pcs(&self, k: usize, out: &mut [MaybeUninit<usize>]) {
        for (o, f) in out.iter_mut().zip(self.frames[..=k].iter().rev()) {
            o.write(f.pc);
        }
    }

    /// Completes `out` after a walk that took over the last walk's frames: their pcs, which
    /// [`LastWalk::splice`] left unwritten.
    pub(super) fn write_taken_over(&self, out: &mut [MaybeUninit<usize>]) {
        if let Outcome::Resumed { fresh, k } = self.outcome {
            self.write_pcs(k, &mut out[fresh..]);
        }
    }

    /// The step from frame `i` by `rule` is being made: [`LastWalk::note_read`] records its reads.
    #[inline(always)]
    pub(super) fn note_step(&mut self, i: usize, rule: Rule) {
        let mut flags = 0;
        if rule.uses_bp() {
            flags |= USES_BP;
        }
        if rule.restores_bp() {
            flags |= RESTORES_BP;
        }
        self.fresh[i].flags = flags;
        self.step_reads = 0;
    }

    /// One read of the step being made from frame `i`.
    #[inline(always)]
    pub(super) fn note_read(&mut self, i: usize, addr: u64, got: Result<u64, ()>) {
        let r = self.step_reads;
        if r == 0 {
            self.fresh[i].ra_at = addr;
        } else {
            self.fresh[i].bp_at = addr;
        }
        (self.step_at[r & 1], self.step_val[r & 1]) = match got {
            Ok(v) => (addr, v),
            Err(()) => (addr | FAILED, 0),
        };
        self.step_reads = r + 1;
    }

    /// Frame `i` was stepped by a slow step, which is not recorded, and the walk goes on with
    /// the snapshot `snap` (a rescan may have replaced it).
    #[inline(always)]
    pub(super) fn note_slow_step(&mut self, i: usize, snap: usize) {
        self.barrier = i + 1;
        if snap != self.snap {
            self.limit = 0;
        }
        self.rules.use_snapshot(snap);
    }

    /// The walk ended with `n` frames in `out` (the last step's reads are the ones noted last).
    #[inline]
    pub(super) fn end(&mut self, snap: usize, out: &[MaybeUninit<usize>], n: usize) {
        self.snap = snap;
        self.truncated = n == out.len();
        self.end_reads = self.step_reads.min(2);
        self.end_at = self.step_at;
        self.end_val = self.step_val;
        if self.end_reads == 2 && self.end_at[1] & FAILED == 0 {
            // The caller's rbp of the last step: no step follows to use it.
            self.end_at[1] |= UNUSED;
        }
        self.keep(0, n, out);
        self.outcome = Outcome::Recorded;
    }

    /// The walks to come run on another stack than the kept frames (a fiber's the program
    /// named): none of them may be taken over, as their words may lie beyond that stack.
    pub(super) fn forget_frames(&mut self) {
        self.len = 0;
        self.reusable = 0;
    }

    /// A walk that may not reach [`LastWalk::end`] or a take-over (the rbp walk) is starting.
    pub(super) fn forget_outcome(&mut self) {
        self.outcome = Outcome::Unrelated;
    }

    /// After a walk of `n` frames into `out`: their depot id through [`LastWalk::intern`] if
    /// `interned` is given, else `out` completed with the frames taken over and no id.
    pub(super) fn finish(
        &mut self,
        interned: Option<&mut Interned>,
        out: &mut [MaybeUninit<usize>],
        n: usize,
    ) -> StackId {
        match interned {
            Some(interned) => self.intern(interned, out, n),
            None => {
                self.write_taken_over(out);
                StackId(0)
            }
        }
    }

    /// The depot id of the `n` frames in `out` that the walk which just ended gave. A walk
    /// that took over starts from the node of the frames it took over and interns only its own
    /// frames; any other goes through `interned`. The kept frames learn their nodes either way.
    #[inline(always)]
    pub(super) fn intern(
        &mut self,
        interned: &mut Interned,
        out: &mut [MaybeUninit<usize>],
        n: usize,
    ) -> StackId {
        // Taken over from its first frame (a loop's allocations): the last walk's id, without a
        // call (its prologue and epilogue were a tenth of churn's capture).
        if let Outcome::Resumed { fresh: 0, k } = self.outcome {
            let node = self.frames[k].node;
            if node != 0 && self.root == depot::generation_root().0 {
                self.outcome = Outcome::Unrelated;
                return StackId(node);
            }
        }
        self.intern_own_frames(interned, out, n)
    }

    /// [`LastWalk::intern`] where the walk has frames of its own, or nothing to start from.
    #[inline(never)]
    fn intern_own_frames(
        &mut self,
        interned: &mut Interned,
        out: &mut [MaybeUninit<usize>],
        n: usize,
    ) -> StackId {
        if let Outcome::Resumed { fresh, k } = self.outcome {
            let base = self.frames[k].node;
            if base != 0 && self.root == depot::generation_root().0 {
                self.outcome = Outcome::Unrelated;
                // SAFETY: the walk initialised its own frames, `out[..fresh]`.
                let own =
                    unsafe { core::slice::from_raw_parts(out.as_ptr().cast::<usize>(), fresh) };
                let mut id = StackId(base);
                for (j, &ra) in own.iter().enumerate().rev() {
                    id = interned.child(id, ra);
                    self.frames[k + fresh - j].node = id.0;
                    if id.0 == 0 {
                        break; // the depot is full; the frames in front keep node 0
                    }
                }
                return id;
            }
        }
        self.write_taken_over(out);
        let outcome = core::mem::replace(&mut self.outcome, Outcome::Unrelated);
        // SAFETY: the walk initialised `out[..n]` but the frames it took over, written just now.
        let frames = unsafe { core::slice::from_raw_parts(out.as_ptr().cast::<usize>(), n) };
        let id = interned.intern(frames);
        if !matches!(outcome, Outcome::Unrelated) {
            let (nodes, root) = interned.nodes();
            if nodes.len() == n {
                for (f, &node) in self.frames[..n].iter_mut().zip(nodes) {
                    f.node = node;
                }
                self.root = root;
            }
        }
        id
    }

    /// The walk in progress becomes the last walk: its `i` frames in front of `frames[..outer]`.
    fn keep(&mut self, outer: usize, i: usize, out: &[MaybeUninit<usize>]) {
        // What a frame needs of its caller: whether its rbp counts, and its `low` (none for the
        // outermost frame, whose step ended the walk and is checked read by read).
        let (mut caller_bp_matters, mut caller_low) = match outer.checked_sub(1) {
            Some(c) => (
                self.frames[c].flags & BP_MATTERS != 0,
                Some(self.frames[c].low),
            ),
            None => (false, None),
        };
        for (t, (f, o)) in self.fresh[..i].iter().zip(&out[..i]).enumerate().rev() {
            let restores = f.flags & RESTORES_BP != 0;
            let bp_matters = f.flags & USES_BP != 0 || (!restores && caller_bp_matters);
            let low = caller_low.map_or(u64::MAX, |low| {
                low.min(f.ra_at)
                    .min(if restores { f.bp_at } else { u64::MAX })
            });
            self.frames[outer + i - 1 - t] = Frame {
                // SAFETY: the walk initialised `out[..i]`.
                pc: unsafe { o.assume_init() },
                flags: f.flags | if bp_matters { BP_MATTERS } else { 0 },
                low,
                // A restored rbp that no later step uses need only be read, which `low` covers.
                bp_at: if restores && caller_bp_matters {
                    f.bp_at
                } else {
                    0
                },
                ..*f
            };
            (caller_bp_matters, caller_low) = (bp_matters, Some(low));
        }
        self.len = outer + i;
        self.reusable = self.len.saturating_sub(self.barrier);
    }
}
