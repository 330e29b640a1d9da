//! Frames (`frame_mark()`): at each mark, the allocations, frees and bytes allocated of the
//! frame that ended, per tag and for the whole process, folded into the steady-state figures
//! engine programmers ask for: per frame, the mean, the most and the frame it happened in.
//!
//! A frame is what happens between two marks: frame 1 runs from the first mark to the second
//! (before the first mark is start-up, no frame). A mark reads the counters the allocation path
//! keeps anyway (`tags`, `live_list`): frames cost the allocation path nothing, and a mark
//! reads every shard's counters of every tag, allocating nothing. Frees queued for another
//! thread's shard count in the frame they are applied in.

use super::live_list;
use super::tags::{self, TagId, MAX_TAGS};
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// One count's figures over the frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerFrame {
    pub total: u64,
    pub max: u64,
    /// The first frame with the most (0 before any frame ended).
    pub max_frame: u64,
}

impl PerFrame {
    const NONE: PerFrame = PerFrame {
        total: 0,
        max: 0,
        max_frame: 0,
    };

    fn add(&mut self, frame: u64, count: u64) {
        self.total += count;
        if count > self.max || self.max_frame == 0 {
            self.max = count;
            self.max_frame = frame;
        }
    }

    /// The mean over `frames` frames (0 for none).
    pub fn mean(&self, frames: u64) -> f64 {
        match frames {
            0 => 0.0,
            n => self.total as f64 / n as f64,
        }
    }
}

/// What a tag (or the whole process) did per frame. The process's `bytes` stay 0: it keeps no
/// count of bytes allocated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameFigures {
    pub allocations: PerFrame,
    pub frees: PerFrame,
    pub bytes: PerFrame,
}

const NO_FIGURES: FrameFigures = FrameFigures {
    allocations: PerFrame::NONE,
    frees: PerFrame::NONE,
    bytes: PerFrame::NONE,
};

/// The counters as the last mark read them: allocations, frees, bytes allocated.
type Seen = [u64; 3];

/// Index 0 is the whole process (no tag has id 0).
struct Frames {
    marks: u64,
    seen: [Seen; MAX_TAGS],
    figures: [FrameFigures; MAX_TAGS],
}

static FRAMES: Mutex<Frames> = Mutex::new(Frames {
    marks: 0,
    seen: [[0; 3]; MAX_TAGS],
    figures: [NO_FIGURES; MAX_TAGS],
});

/// Held by `fork` (see `tracker::fork`): a child forked while another thread marked a frame
/// would wait forever at its first mark or report.
pub(crate) fn lock_for_fork() -> std::sync::MutexGuard<'static, impl Sized> {
    FRAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The marks so far, without the lock: the frame under way (0: start-up), for `profile`'s peak.
static MARKS: AtomicU64 = AtomicU64::new(0);

/// The frame under way: the marks so far (0 before the first).
pub fn marks_so_far() -> u64 {
    MARKS.load(Ordering::Relaxed)
}

/// `frame_mark()`: ends the frame under way (the first mark ends start-up).
pub fn mark() {
    // The timeline's sample is written here.
    let _held = crate::sys::CancellationHeld::hold();
    // Inside the tracker while the locks are held (and let go of after them): a signal handler
    // that lands here and forks gets an unprepared fork, as from an interrupted allocation,
    // rather than waiting in `fork`'s prepare for a lock this very thread holds (it waited
    // forever). Nothing here allocates, so nothing goes untracked.
    // A handler's mark inside an interrupted one is left out past the tracker's patience.
    let interrupted = super::guard::inside();
    let _inside = super::guard::Inside::enter();
    let Some(mut frames) = live_list::lock_unless_interrupted(interrupted, &FRAMES) else {
        return;
    };
    frames.marks += 1;
    MARKS.store(frames.marks, Ordering::Relaxed);
    let ended = frames.marks - 1;
    let process = live_list::totals();
    frames.record(0, [process.allocations, process.frees, 0], ended);
    for id in tags::ids() {
        let s = tags::sums(id);
        frames.record(id, [s.allocations, s.frees, s.total_bytes], ended);
    }
    // With the frames' lock held: marks of other threads numbered after this one are written
    // after it (let go of before, a later mark's sample came first: 394 before 392 and 393).
    // The timeline's lock is taken after this one, as `fork` takes them.
    super::timeline::at_frame_mark(frames.marks);
}

impl Frames {
    /// Takes `now` as index `at`'s counters, and what they grew by since the last mark as frame
    /// `ended`'s (none when 0: start-up).
    fn record(&mut self, at: TagId, now: Seen, ended: u64) {
        let at = at as usize;
        let before = core::mem::replace(&mut self.seen[at], now);
        if ended == 0 {
            return;
        }
        let figures = &mut self.figures[at];
        for (per_frame, i) in [
            (&mut figures.allocations, 0),
            (&mut figures.frees, 1),
            (&mut figures.bytes, 2),
        ] {
            per_frame.add(ended, now[i].saturating_sub(before[i]));
        }
    }
}

/// The frames so far: how many marks, the whole process's figures and each tag's (by id).
#[derive(Clone, Debug, Default)]
pub struct FrameReport {
    pub marks: u64,
    pub process: FrameFigures,
    pub tags: Vec<FrameFigures>,
}

impl FrameReport {
    /// Frames that ended: one fewer than the marks.
    pub fn frames(&self) -> u64 {
        self.marks.saturating_sub(1)
    }

    /// The figures of tag `id` (none for a tag seen after the snapshot).
    pub fn of(&self, id: TagId) -> FrameFigures {
        self.tags.get(id as usize).copied().unwrap_or_default()
    }
}

/// The frames so far (for the report); none when the frames' lock stays held past the tracker's
/// patience: by the very thread whose mark a signal handler interrupted to call `exit` or write
/// a report (which waited for it forever).
pub fn report() -> FrameReport {
    let Some(frames) = live_list::lock_within(&FRAMES) else {
        return FrameReport::default();
    };
    let tags = tags::ids().end as usize;
    FrameReport {
        marks: frames.marks,
        process: frames.figures[0],
        tags: frames.figures[..tags].to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::PerFrame;

    #[test]
    fn the_first_frame_with_the_most_is_kept() {
        let mut per_frame = PerFrame::default();
        for (frame, count) in [(1, 3), (2, 7), (3, 7), (4, 0)] {
            per_frame.add(frame, count);
        }
        assert_eq!(
            (per_frame.total, per_frame.max, per_frame.max_frame),
            (17, 7, 2)
        );
        assert_eq!(per_frame.mean(4), 4.25);
    }
}
