//! The process's other threads, so that a report scans what they hold, as valgrind and
//! LeakSanitizer do: each one's stack from where it stands now (its `thread_local`s lie above,
//! at the top of its stack's mapping), leaving out the tracker's own state in it.
//!
//! Where a thread stands is asked of the kernel (`/proc/self/task/TID/syscall`: the stack
//! pointer of a thread blocked in a system call or waiting to run); a thread running on another
//! core at that moment gives none, and its whole stack mapping is read if the record of threads
//! knows it: those the program started (recorded as they start, `cpp/threads.cpp`) and those
//! that allocated, with where the tracker's state lies in each.

use core::ops::Range;
use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// Threads alive at once that the record keeps (one more goes unscanned).
const CAPACITY: usize = 4096;
/// The tracker's own state in a thread: its stack walk, its guard and its heap lists.
const OWN_RANGES: usize = 3;
/// A slot being written.
const WRITING: u32 = u32::MAX;

struct Slot {
    /// The thread's id (0: free).
    tid: AtomicU32,
    /// An address on the thread's stack: its stack's mapping, where the kernel gives no stack
    /// pointer.
    on_stack: AtomicUsize,
    /// [`OWN_RANGES`] ranges, start and end.
    own: [AtomicUsize; 2 * OWN_RANGES],
}

static SLOTS: [Slot; CAPACITY] = [const {
    Slot {
        tid: AtomicU32::new(0),
        on_stack: AtomicUsize::new(0),
        own: [const { AtomicUsize::new(0) }; 2 * OWN_RANGES],
    }
}; CAPACITY];

/// The record's own bytes, which hold stack addresses: not the program's pointers.
pub fn record_range() -> Range<usize> {
    crate::sys::bytes_of(&SLOTS)
}

fn gettid() -> u32 {
    // SAFETY: gettid takes nothing and cannot fail.
    unsafe { libc::gettid() as u32 }
}

std::thread_local! {
    /// The calling thread's slot, plus one (0: it holds none).
    static MINE: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// The calling thread, when it starts (the program's `pthread_create`) or at its first
/// allocation, whichever comes first: `own` is the tracker's state in it.
pub fn register(own: [Range<usize>; OWN_RANGES]) {
    if MINE.try_with(core::cell::Cell::get) != Ok(0) {
        return; // in the record already
    }
    let on_stack = core::ptr::from_ref(&own) as usize;
    let Some(index) = SLOTS.iter().position(|slot| {
        slot.tid.load(Ordering::Relaxed) == 0
            && slot
                .tid
                .compare_exchange(0, WRITING, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }) else {
        return;
    };
    let slot = &SLOTS[index];
    slot.on_stack.store(on_stack, Ordering::Relaxed);
    for (i, range) in own.iter().enumerate() {
        slot.own[2 * i].store(range.start, Ordering::Relaxed);
        slot.own[2 * i + 1].store(range.end, Ordering::Relaxed);
    }
    slot.tid.store(gettid(), Ordering::Release);
    let _ = MINE.try_with(|mine| mine.set(index + 1));
}

/// The calling thread is exiting.
pub fn unregister() {
    if let Ok(Some(index)) = MINE.try_with(|mine| mine.replace(0).checked_sub(1)) {
        SLOTS[index].tid.store(0, Ordering::Release);
    }
}

/// In a forked child: only the forking thread came along, under a new id.
pub fn forget_others() {
    let mine = MINE
        .try_with(core::cell::Cell::get)
        .unwrap_or(0)
        .checked_sub(1);
    for (index, slot) in SLOTS.iter().enumerate() {
        let tid = if Some(index) == mine { gettid() } else { 0 };
        slot.tid.store(tid, Ordering::Release);
    }
}

/// What a report reads of the other threads: the live part of each one's stack, and the
/// tracker's own state in them, to leave out.
pub struct OtherThreads {
    pub stacks: Vec<Range<usize>>,
    pub own_state: Vec<Range<usize>>,
}

/// The process's other threads now (`/proc/self/task`): those in the record with what it
/// knows of them, and the others, which are scanned where the kernel says they stand (one
/// running then, which the record does not know, is not).
pub fn others() -> OtherThreads {
    let me = gettid();
    let mut found = OtherThreads {
        stacks: Vec::new(),
        own_state: Vec::new(),
    };
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return found;
    };
    let tids = tasks.filter_map(|task| task.ok()?.file_name().to_str()?.parse::<u32>().ok());
    let maps = Mappings::read();
    for tid in tids.filter(|&tid| tid != me) {
        let Some(standing) = stack_pointer_of(tid) else {
            continue; // gone meanwhile
        };
        let slot = SLOTS
            .iter()
            .find(|slot| slot.tid.load(Ordering::Acquire) == tid);
        let on_stack = slot.map_or(0, |slot| slot.on_stack.load(Ordering::Relaxed));
        let stack = match standing.and_then(|sp| Some((sp, maps.containing(sp)?))) {
            Some((sp, mapping)) => sp..mapping.end,
            None => maps.containing(on_stack).unwrap_or(0..0),
        };
        found.stacks.push(stack);
        if let Some(slot) = slot {
            let own = slot.own.each_ref().map(|word| word.load(Ordering::Relaxed));
            found
                .own_state
                .extend(own.chunks(2).map(|range| range[0]..range[1]));
        }
    }
    found
}

/// Where thread `tid` stands: `None` if it is gone, `Some(None)` if the kernel gives no stack
/// pointer (it is running now).
fn stack_pointer_of(tid: u32) -> Option<Option<usize>> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok()?;
    // "NR ARG1 .. ARG6 SP PC" in a system call, "-1 SP PC" when not, "running" when on a core.
    let fields: Vec<&str> = text.split_whitespace().collect();
    let sp = match fields.len() {
        3.. => fields[fields.len() - 2].strip_prefix("0x"),
        _ => None,
    };
    Some(sp.and_then(|hex| usize::from_str_radix(hex, 16).ok()))
}

/// The process's mappings, from `/proc/self/maps`.
struct Mappings(Vec<Range<usize>>);

impl Mappings {
    fn read() -> Mappings {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let range = |line: &str| {
            let (start, end) = line.split_whitespace().next()?.split_once('-')?;
            let hex = |s| usize::from_str_radix(s, 16).ok();
            Some(hex(start)?..hex(end)?)
        };
        Mappings(text.lines().filter_map(range).collect())
    }

    fn containing(&self, address: usize) -> Option<Range<usize>> {
        self.0.iter().find(|m| m.contains(&address)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots_of(tid: u32) -> usize {
        SLOTS
            .iter()
            .filter(|slot| slot.tid.load(Ordering::Acquire) == tid)
            .count()
    }

    #[test]
    fn a_thread_holds_one_slot_from_its_start_to_its_end() {
        let counts = std::thread::spawn(|| {
            let me = gettid();
            let own = || [0..0, 0..0, 0..0];
            register(own()); // as it starts
            register(own()); // at its first allocation
            let recorded = slots_of(me);
            unregister();
            let ended = slots_of(me);
            register(own()); // an allocation in a thread_local's destructor, after its end
            let again = slots_of(me);
            unregister();
            (recorded, ended, again, slots_of(me))
        })
        .join()
        .unwrap();
        assert_eq!(counts, (1, 0, 1, 0));
    }
}
