//! Checkpoints over every tracked block (`checkpoint()`, `leaks_since()`): which blocks still live were allocated after a checkpoint, found from each thread's allocation numbers.
//!
//! A block header keeps its thread and its number on that thread (`seq`), which grows with each
//! allocation of the thread. A checkpoint walks the live blocks once, with the world stopped,
//! and keeps for each thread the highest number among them. A block live later was allocated
//! after the checkpoint exactly when its thread had no live block then or its number is higher:
//! a block allocated before that is still live was live at the checkpoint too, so its number is
//! at most that highest one. A checkpoint costs one walk of the live blocks (the heap checked on
//! the way, as `check_heap()` does) and 8 bytes per thread that held blocks; nothing is added to
//! an allocation.

use super::guard;
use super::header::BlockHeader;
use super::integrity::{self, FoundBy};
use super::live_list::StoppedWorld;
use super::BlockKind;
use crate::stack::StackId;
use std::collections::HashMap;
use std::sync::Mutex;

/// Checkpoints kept: `leaks_since` of an older one covers the engine allocators only.
const KEPT: usize = 1024;

/// One checkpoint: its epoch (the engine allocators', `engine::checkpoint`) and, by thread
/// number, the highest allocation number among the thread's live blocks then.
struct Taken {
    epoch: u32,
    highest: HashMap<u32, u32>,
}

static TAKEN: Mutex<Vec<Taken>> = Mutex::new(Vec::new());

/// Held by `fork` (see `tracker::fork`): a child forked while another thread read the
/// checkpoints would wait for them forever in its first `leaks_since`.
pub(crate) fn lock_for_fork() -> std::sync::MutexGuard<'static, impl Sized> {
    TAKEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Tracked blocks of one allocation function allocated since a checkpoint and still live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FamilyLeaks {
    /// `new`, `new[]`, `malloc`, ... (`errors::family`).
    pub family: &'static str,
    pub blocks: u64,
    pub bytes: u64,
}

/// Calls `visit` for every live tracked block, with the world stopped; problems the heap check
/// finds on the way are reported. Call inside the tracker.
fn walk_live_blocks(mut visit: impl FnMut(&BlockHeader)) {
    let mut problems = Vec::new();
    {
        let world = StoppedWorld::stop(guard::thread_number());
        integrity::check_live_blocks(&world, FoundBy::CheckHeap, &mut problems, |header| {
            // SAFETY: a live header, which stays so while the world is stopped.
            visit(unsafe { &*header })
        });
    }
    integrity::report_all(problems, StackId(0), BlockKind::New);
}

/// Takes the checkpoint of `epoch` (the engine allocators' new epoch). Call inside the tracker.
pub fn take(epoch: u32) {
    let mut highest: HashMap<u32, u32> = HashMap::new();
    walk_live_blocks(|h| {
        let seq = highest.entry(h.thread()).or_default();
        *seq = (*seq).max(h.seq());
    });
    let Ok(mut taken) = TAKEN.lock() else {
        return;
    };
    if taken.len() == KEPT {
        taken.remove(0);
    }
    taken.push(Taken { epoch, highest });
}

/// The tracked blocks allocated after the checkpoint of `epoch` and live now, by allocation
/// function in order of first appearance; `None` for no checkpoint kept (`Checkpoint{0}`, one
/// made by hand, or one of the oldest). Call inside the tracker.
pub fn live_since(epoch: u32) -> Option<Vec<FamilyLeaks>> {
    let highest = {
        let taken = TAKEN.lock().ok()?;
        let at = taken.iter().position(|t| t.epoch == epoch)?;
        taken[at].highest.clone()
    };
    let mut families: Vec<FamilyLeaks> = Vec::new();
    walk_live_blocks(|h| {
        if highest.get(&h.thread()).is_some_and(|&seq| h.seq() <= seq) {
            return;
        }
        let family = super::errors::family(h.kind());
        let at = match families.iter().position(|f| f.family == family) {
            Some(at) => at,
            None => {
                families.push(FamilyLeaks {
                    family,
                    blocks: 0,
                    bytes: 0,
                });
                families.len() - 1
            }
        };
        families[at].blocks += 1;
        families[at].bytes += h.size() as u64;
    });
    Some(families)
}
