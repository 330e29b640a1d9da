//! A record of the previous DWARF walk of a cache slot, so that the next walk can reuse the part
//! of it that provably repeats (hot allocation sites capture the same chain over and over).
//!
//! Why reuse is exact: with one module snapshot, framehop's x86-64 step from a frame is a
//! deterministic function of that frame's `(ip, sp, bp)` and of the values its `read_stack`
//! callback returns (its rules and its DWARF evaluation read no other register, and its rule
//! cache only memoises rules). A [`Memo`] stores, per frame, those three registers and, per
//! step, every `(address, result)` the callback produced, in order. If a walk reaches a frame
//! whose registers equal memo frame `j`'s and every recorded read of the steps from `j` on still
//! gives the recorded result (re-read now, with this walk's stack bounds), then by induction
//! over the reads each step would ask for the same addresses, get the same values and produce
//! the recorded next frame: the memo's frames from `j` on are what unwinding would produce.
//!
//! The memo lives next to the rule cache in its slot (threads keep to their own slot, so it is
//! in effect per thread); a memo made on another thread's stack simply fails verification.

use super::MAX_DEPTH;

/// Reads a memo can hold: 3 per frame on average (a return address, a saved rbp, and room for
/// DWARF expressions). A walk that reads more stops being recorded at that step.
const READS: usize = 3 * MAX_DEPTH;

/// Marks a failed read in [`Memo::addr`]. Successful reads are of aligned addresses, so bit 0 is
/// free; a failed read of an odd address re-checks the even address below it, which can only
/// turn a true match into a miss, never the reverse (an odd address always fails).
const FAILED: u64 = 1;

/// The previous walk: frames `0..len`, the steps between them, and perhaps the failed last step.
pub(super) struct Memo {
    /// Frames recorded (`<= MAX_DEPTH`); 0 = empty.
    len: usize,
    /// The step from frame `len - 1` was recorded and failed: the walk ended there by itself.
    ends: bool,
    /// Recording stopped (read log full, or the module snapshot changed): add nothing more.
    sealed: bool,
    /// Address of the module snapshot all frames were checked and stepped with. Snapshots are
    /// never freed, so equal addresses mean the same snapshot.
    snap: usize,
    /// The depot id of frames `0..len` exactly, or 0 if not known.
    pub(super) id: u32,
    pc: [usize; MAX_DEPTH],
    sp: [usize; MAX_DEPTH],
    fp: [usize; MAX_DEPTH],
    /// The reads of the step from frame `i` are `addr/val[start(i)..step_end[i]]`.
    step_end: [u16; MAX_DEPTH],
    /// Reads logged so far.
    reads: usize,
    addr: [u64; READS],
    val: [u64; READS],
}

impl Memo {
    pub(super) const EMPTY: Memo = Memo {
        len: 0,
        ends: false,
        sealed: false,
        snap: 0,
        id: 0,
        pc: [0; MAX_DEPTH],
        sp: [0; MAX_DEPTH],
        fp: [0; MAX_DEPTH],
        step_end: [0; MAX_DEPTH],
        reads: 0,
        addr: [0; READS],
        val: [0; READS],
    };

    #[inline]
    fn step_start(&self, i: usize) -> usize {
        if i == 0 {
            0
        } else {
            self.step_end[i - 1] as usize
        }
    }

    /// Empties the memo for a walk made with snapshot `snap`.
    #[inline]
    pub(super) fn reset(&mut self, snap: usize) {
        self.len = 0;
        self.ends = false;
        self.sealed = false;
        self.snap = snap;
        self.id = 0;
        self.reads = 0;
    }

    /// Stops recording and forgets everything (the snapshot changed during the walk).
    pub(super) fn invalidate(&mut self) {
        self.reset(0);
        self.sealed = true;
    }

    /// Number of frames recorded.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether frame `j` was unwound from exactly these registers under snapshot `snap`.
    #[inline]
    pub(super) fn frame_is(&self, j: usize, snap: usize, pc: usize, sp: usize, fp: usize) -> bool {
        j < self.len
            && self.snap == snap
            && self.sp[j] == sp
            && self.pc[j] == pc
            && self.fp[j] == fp
    }

    /// The first recorded frame whose sp is not below `sp` (frames' sps strictly increase).
    #[inline]
    pub(super) fn seek(&self, mut j: usize, sp: usize) -> usize {
        while j < self.len && self.sp[j] < sp {
            j += 1;
        }
        j
    }

    #[inline]
    pub(super) fn frame(&self, j: usize) -> (usize, usize, usize) {
        (self.pc[j], self.sp[j], self.fp[j])
    }

    #[inline]
    pub(super) fn pcs(&self, from: usize, n: usize) -> &[usize] {
        &self.pc[from..from + n]
    }

    /// Whether every read of the step from frame `i` still gives its recorded result.
    #[inline]
    fn step_holds(&self, i: usize, read: &impl Fn(u64) -> Result<u64, ()>) -> bool {
        (self.step_start(i)..self.step_end[i] as usize).all(|r| {
            let a = self.addr[r];
            if a & FAILED == 0 {
                read(a) == Ok(self.val[r])
            } else {
                read(a & !FAILED).is_err()
            }
        })
    }

    /// How many frames from `j` (at least 1, at most `max`) provably repeat, given that frame
    /// `j`'s registers matched: frame `j + g` repeats when the step from `j + g - 1` holds.
    #[inline]
    pub(super) fn repeating(
        &self,
        j: usize,
        max: usize,
        read: &impl Fn(u64) -> Result<u64, ()>,
    ) -> usize {
        let max = max.min(self.len - j);
        let mut g = 1;
        while g < max && self.step_holds(j + g - 1, read) {
            g += 1;
        }
        g
    }

    /// Whether the walk provably ends after frame `len - 1` again (its failed last step holds).
    #[inline]
    pub(super) fn end_holds(&self, read: &impl Fn(u64) -> Result<u64, ()>) -> bool {
        self.ends && self.step_holds(self.len - 1, read)
    }

    /// Appends frames `j..j+g` of `src` and the `g - 1` steps between them (all verified),
    /// plus `src`'s failed last step when `ended`.
    pub(super) fn append_from(&mut self, src: &Memo, j: usize, g: usize, ended: bool) {
        if self.sealed {
            return;
        }
        let steps = if ended { g } else { g - 1 };
        let (r0, r1) = (src.step_start(j), src.step_start(j + steps));
        if self.len + g > MAX_DEPTH || self.reads + (r1 - r0) > READS {
            self.sealed = true;
            return;
        }
        let (n, base) = (self.len, self.reads);
        if n > 0 {
            // Close the step from our last frame, which led to `src`'s frame `j`.
            self.step_end[n - 1] = base as u16;
        }
        self.pc[n..n + g].copy_from_slice(&src.pc[j..j + g]);
        self.sp[n..n + g].copy_from_slice(&src.sp[j..j + g]);
        self.fp[n..n + g].copy_from_slice(&src.fp[j..j + g]);
        self.addr[base..base + r1 - r0].copy_from_slice(&src.addr[r0..r1]);
        self.val[base..base + r1 - r0].copy_from_slice(&src.val[r0..r1]);
        for s in 0..steps {
            // Fits in u16: at most READS.
            self.step_end[n + s] = (base + src.step_end[j + s] as usize - r0) as u16;
        }
        self.len += g;
        self.reads += r1 - r0;
        self.ends = ended;
        self.id = 0;
    }

    /// Appends one frame; the step from the previous frame must have been logged since.
    #[inline]
    pub(super) fn push_frame(&mut self, pc: usize, sp: usize, fp: usize) {
        if self.sealed {
            return;
        }
        let n = self.len;
        if n > 0 {
            self.step_end[n - 1] = self.reads as u16;
        }
        self.pc[n] = pc;
        self.sp[n] = sp;
        self.fp[n] = fp;
        self.len = n + 1;
        self.id = 0;
    }

    /// Records that the step from the last frame failed: the walk ended by itself.
    #[inline]
    pub(super) fn push_end(&mut self) {
        if self.sealed || self.len == 0 {
            return;
        }
        self.step_end[self.len - 1] = self.reads as u16;
        self.ends = true;
        self.id = 0;
    }

    /// Logs one read of the current step; seals the memo (dropping the partial step) when full.
    #[inline]
    pub(super) fn log(&mut self, addr: u64, got: Result<u64, ()>) {
        if self.sealed {
            return;
        }
        if self.reads == READS {
            self.sealed = true;
            self.reads = self.step_start(self.len.max(1) - 1);
            return;
        }
        match got {
            Ok(v) => {
                self.addr[self.reads] = addr;
                self.val[self.reads] = v;
            }
            Err(()) => self.addr[self.reads] = addr | FAILED,
        }
        self.reads += 1;
    }

    /// Whether frames `0..n` of the last walk are exactly this memo's frames.
    #[inline]
    pub(super) fn describes(&self, n: usize) -> bool {
        !self.sealed && self.len == n
    }
}

/// Two memos per slot: the one describing the slot's last walk (`front`) and a buffer that the
/// next walk fills while still matching against `front`, then swaps in.
pub(super) struct Memos {
    m: [Memo; 2],
    front: usize,
}

impl Memos {
    pub(super) const EMPTY: Memos = Memos {
        m: [Memo::EMPTY, Memo::EMPTY],
        front: 0,
    };

    /// (front, back).
    #[inline]
    pub(super) fn pair(&mut self) -> (&mut Memo, &mut Memo) {
        let [a, b] = &mut self.m;
        if self.front == 0 {
            (a, b)
        } else {
            (b, a)
        }
    }

    #[inline]
    pub(super) fn swap(&mut self) {
        self.front ^= 1;
    }
}
