//! The thread's last DWARF walk, kept so that a capture that provably repeats it is answered without unwinding.
//!
//! A walk made of compiled-rule steps only is a function of its start (pc and sp, and rbp if a
//! step used it before a step restored it from the stack), of the module snapshot (whose rules
//! never change once made) and of the stack words its steps read. [`LastWalk`] keeps those
//! reads: a capture from the same start whose reads all give the same values again has the same
//! frames. A saved rbp that a step restores but no later step uses (code built without frame
//! pointers keeps loop counters and pointers in rbp) need not be the same: only that its read
//! succeeds, which it does, being the same in-bounds address as before. Checking them is a row of independent loads, where a walk's steps wait on each other
//! (each step's reads depend on the one before), which is what a hot allocation site that
//! captures the same chain over and over saves. A walk with a slow step (a rule compiled on the
//! way, framehop, a module rescan) is not kept, and neither is one from another call site than
//! the walk before it: keeping costs a few stores per step, and on code whose consecutive
//! allocations come from different sites (yaml-cpp's test suite: 1.5% of walks repeated) it
//! would be paid for nothing.

use core::mem::MaybeUninit;

use super::{StartFrame, MAX_DEPTH};

/// A compiled step reads the return address and at most the saved rbp.
const MAX_READS: usize = 2 * MAX_DEPTH;

/// Marks a failed read in [`LastWalk::addr`]: reads that succeed are of aligned addresses. A
/// failed read of an odd address checks the even one below it again, which can only make a
/// repeat fail, never pass wrongly (an odd address never reads).
const FAILED: u64 = 1;

/// Marks a read in [`LastWalk::addr`] whose value no later step used (a restored rbp).
const UNUSED: u64 = 2;

pub(super) struct LastWalk {
    /// Whether the fields below describe a whole walk of compiled steps.
    kept: bool,
    /// The snapshot's address (snapshots are never freed, so it names one).
    snap: usize,
    start: (usize, usize, usize),
    /// Whether some step depended on the start's rbp.
    bp_used: bool,
    /// The read the current rbp came from, plus one (0: the start's rbp).
    bp_read: usize,
    depth: usize,
    len: usize,
    reads: usize,
    addr: [u64; MAX_READS],
    val: [u64; MAX_READS],
    frames: [usize; MAX_DEPTH],
}

impl LastWalk {
    pub(super) const EMPTY: LastWalk = LastWalk {
        kept: false,
        snap: 0,
        start: (0, 0, 0),
        bp_used: false,
        bp_read: 0,
        depth: 0,
        len: 0,
        reads: 0,
        addr: [0; MAX_READS],
        val: [0; MAX_READS],
        frames: [0; MAX_DEPTH],
    };

    /// The frame count, with the frames in `out`, if a walk from `start` with `snap` would repeat
    /// the kept one (`read` reads the stack as the walk would).
    #[inline]
    pub(super) fn repeat(
        &self,
        snap: usize,
        start: StartFrame,
        read: impl Fn(u64) -> Result<u64, ()>,
        out: &mut [MaybeUninit<usize>],
    ) -> Option<usize> {
        let (pc, sp, bp) = self.start;
        if !self.kept
            || self.snap != snap
            || (pc, sp) != (start.pc, start.sp)
            || (self.bp_used && bp != start.fp)
            || self.depth != out.len()
        {
            return None;
        }
        let same = self.addr[..self.reads]
            .iter()
            .zip(&self.val[..self.reads])
            .all(|(&a, &v)| match a & (FAILED | UNUSED) {
                0 => read(a) == Ok(v),
                FAILED => read(a & !FAILED).is_err(),
                _ => true,
            });
        if !same {
            return None;
        }
        for (o, &f) in out.iter_mut().zip(&self.frames[..self.len]) {
            o.write(f);
        }
        Some(self.len)
    }

    /// Whether to keep the walk from `start`: only if it starts where the walk before it did.
    #[inline]
    pub(super) fn worth_keeping(&mut self, start: StartFrame) -> bool {
        if self.start.0 == start.pc {
            return true;
        }
        self.kept = false;
        self.start.0 = start.pc;
        false
    }

    /// Starts keeping the walk from `start`.
    #[inline]
    pub(super) fn begin(&mut self, snap: usize, start: StartFrame, depth: usize) {
        self.kept = true;
        self.snap = snap;
        self.start = (start.pc, start.sp, start.fp);
        self.bp_used = false;
        self.bp_read = 0;
        self.depth = depth;
        self.reads = 0;
    }

    /// One read of a compiled step.
    #[inline(always)]
    pub(super) fn note_read(&mut self, addr: u64, got: Result<u64, ()>) {
        let r = self.reads;
        if r == MAX_READS {
            self.kept = false;
            return;
        }
        (self.addr[r], self.val[r]) = match got {
            Ok(v) => (addr, v),
            Err(()) => (addr | FAILED, 0),
        };
        self.reads = r + 1;
    }

    /// A step used the current rbp: the read it came from (or the start's) counts.
    #[inline(always)]
    pub(super) fn note_bp_used(&mut self) {
        match self.bp_read {
            0 => self.bp_used = true,
            r => self.addr[r - 1] &= !UNUSED,
        }
    }

    /// The step just made gave the caller the rbp of its last read, which counts only if a
    /// later step uses it.
    #[inline(always)]
    pub(super) fn note_bp_restored(&mut self) {
        let r = self.reads;
        if r > 0 && self.addr[r - 1] & FAILED == 0 {
            self.addr[r - 1] |= UNUSED;
            self.bp_read = r;
        }
    }

    /// The walk took a slow step: it is not kept.
    #[inline(always)]
    pub(super) fn drop_walk(&mut self) {
        self.kept = false;
    }

    /// The walk's frames, once it is over.
    #[inline]
    pub(super) fn end(&mut self, out: &[MaybeUninit<usize>], n: usize) {
        for (f, o) in self.frames.iter_mut().zip(&out[..n]) {
            // SAFETY: the walk initialised `out[..n]`.
            *f = unsafe { o.assume_init() };
        }
        self.len = n;
    }
}
