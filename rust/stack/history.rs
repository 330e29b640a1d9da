//! The history of mapped modules (path, build id, load range, when loaded and unloaded), kept
//! beside the stack ids it dates: the symbolizer's map of modules is built from it.
//!
//! [`note_changes`] rescans `dl_iterate_phdr` when the module set has changed (the stack
//! walker's rescans: at tracker start, after every `dlopen`/`dlclose` through
//! `cpp/modules.cpp`, when a walk meets an unknown module) and at report time, never on the
//! allocation path. "When" is the stack depot's watermark: stack ids grow
//! with time, so a stack whose id lies in a module's `[loaded, unloaded)` window was captured
//! while that module was mapped. A frame in a module since `dlclose`d, or in a range another
//! library was later mapped over, is symbolized against the module that was there; the module's
//! file is kept open, so a file replaced on disk (hot reload) still gives its old debug info.
//! Loads of the same file (same path and build id) share one open file, so that a plugin loaded
//! and unloaded in a loop does not use up the process's file descriptors; past
//! [`MAX_UNLOADED_FILES`] files held for unloaded modules only, the oldest are closed (frames
//! in them then show their module and address only).

use std::collections::HashSet;
use std::ffi::{c_int, c_void, CStr};
use std::fs::File;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// One mapping of an ELF object, from its load to its unload.
pub(crate) struct Record {
    pub(crate) name: String,
    /// The file it was loaded from, open since (`None` for the vdso, or once closed to keep
    /// within [`MAX_UNLOADED_FILES`]); shared by loads of the same file.
    pub(crate) file: Option<Arc<File>>,
    pub(crate) build_id: Vec<u8>,
    /// The executable: read through /proc/self/exe, which opens it even when its path has
    /// since been deleted or replaced.
    pub(crate) is_main: bool,
    pub(crate) bias: usize,
    pub(crate) segments: Vec<Range<usize>>,
    /// Depot watermarks: stack ids in `loaded..unloaded` were captured while it was mapped.
    pub(crate) loaded: u32,
    pub(crate) unloaded: u32,
}

static HISTORY: Mutex<Vec<Record>> = Mutex::new(Vec::new());

/// Set in a forked child until the child itself changes the module set: the history is then
/// the parent's at the fork (held across it), and no rescan calls `dl_iterate_phdr`, which in a
/// child waits forever for the loader's lock if a thread of the parent was inside `dlopen` or
/// `dlclose` at the fork.
static HISTORY_AS_FORKED: AtomicBool = AtomicBool::new(false);

/// In a forked child: the history stands as it was at the fork (see [`HISTORY_AS_FORKED`]).
pub(crate) fn note_forked_child() {
    HISTORY_AS_FORKED.store(true, Ordering::Relaxed);
}

/// The process itself changed its module set (`dlopen`, `dlclose`): rescans are due again.
pub(crate) fn note_module_set_changed() {
    HISTORY_AS_FORKED.store(false, Ordering::Relaxed);
}

/// The history's lock, held by `fork` (see `process::fork`): a child's report reads the history.
pub(crate) fn lock_for_fork() -> std::sync::MutexGuard<'static, impl Sized> {
    HISTORY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Rescans the loaded modules: those gone are marked unloaded now, new ones loaded now. Like
/// every slow path of this layer it allocates, so it is called inside the tracker (the history
/// is the tracker's memory, not the program's).
pub fn note_changes() {
    if HISTORY_AS_FORKED.load(Ordering::Relaxed) {
        return;
    }
    let mut seen: Vec<Record> = Vec::new();
    // SAFETY: the callback matches what dl_iterate_phdr expects; `seen` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(add_module), (&raw mut seen).cast::<c_void>()) };
    let now = super::depot::watermark();
    let mut history = HISTORY.lock().unwrap_or_else(PoisonError::into_inner);
    for old in history.iter_mut().filter(|r| r.unloaded == u32::MAX) {
        let same =
            |r: &Record| r.name == old.name && r.bias == old.bias && r.build_id == old.build_id;
        if !seen.iter().any(same) {
            old.unloaded = now;
        }
    }
    for mut new in seen {
        let known = history.iter().any(|r| {
            r.unloaded == u32::MAX
                && r.name == new.name
                && r.bias == new.bias
                && r.build_id == new.build_id
        });
        if !known {
            new.loaded = now;
            new.file = earlier_load(&history, &new).or_else(|| {
                let path = if new.is_main {
                    "/proc/self/exe"
                } else {
                    new.name.as_str()
                };
                File::open(path).ok().map(Arc::new)
            });
            history.push(new);
        }
    }
    close_oldest_unloaded(&mut history);
}

/// Files held open for modules that are all unloaded, at most: a plugin rebuilt and reloaded
/// more often than this in one run loses the debug info of its oldest builds.
const MAX_UNLOADED_FILES: usize = 256;

/// The file an earlier load of the same file (same path and build id) keeps open.
fn earlier_load(history: &[Record], new: &Record) -> Option<Arc<File>> {
    if new.build_id.is_empty() {
        return None; // without a build id, the file at the path may have been replaced
    }
    history
        .iter()
        .filter(|r| r.name == new.name && r.build_id == new.build_id)
        .find_map(|r| r.file.clone())
}

/// Closes the oldest of the files held only for unloaded modules beyond [`MAX_UNLOADED_FILES`]
/// (a file that a mapped module shares stays open).
fn close_oldest_unloaded(history: &mut [Record]) {
    // Common case, checked without building sets: fewer open files than the limit in all.
    if history.iter().filter(|r| r.file.is_some()).count() <= MAX_UNLOADED_FILES {
        return;
    }
    let file_of = |r: &Record| r.file.as_ref().map(Arc::as_ptr);
    let mapped: HashSet<*const File> = history
        .iter()
        .filter(|r| r.unloaded == u32::MAX)
        .filter_map(file_of)
        .collect();
    // Oldest first, as the history is.
    let mut unloaded_only: Vec<*const File> = Vec::new();
    let mut seen = HashSet::new();
    for file in history.iter().filter_map(file_of) {
        if !mapped.contains(&file) && seen.insert(file) {
            unloaded_only.push(file);
        }
    }
    let excess = unloaded_only.len().saturating_sub(MAX_UNLOADED_FILES);
    if excess == 0 {
        return;
    }
    let closing: HashSet<*const File> = unloaded_only[..excess].iter().copied().collect();
    for record in history.iter_mut() {
        if file_of(record).is_some_and(|f| closing.contains(&f)) {
            record.file = None;
        }
    }
}

/// The history brought up to date, locked for reading (called inside the tracker).
pub(crate) fn up_to_date() -> std::sync::MutexGuard<'static, Vec<Record>> {
    note_changes();
    HISTORY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `dl_iterate_phdr` callback: records one module. Allocates (under the tracker's reentrancy
/// guard) but never panics across the C frame.
unsafe extern "C" fn add_module(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info for the duration of the call, and `data`
    // is the `&mut Vec<Record>` given by `note_changes`.
    let (info, seen) = unsafe { (&*info, &mut *data.cast::<Vec<Record>>()) };
    let loader_name = if info.dlpi_name.is_null() {
        &[][..]
    } else {
        // SAFETY: a non-null dlpi_name is a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
    };
    let is_main = seen.is_empty() && loader_name.is_empty();
    let name = if is_main {
        // The main program comes first with an empty name (backtrace-rs
        // libs_dl_iterate_phdr.rs `infer_current_exe`).
        std::fs::read_link("/proc/self/exe")
            .map(|path| path.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "/proc/self/exe".to_owned())
    } else {
        String::from_utf8_lossy(loader_name).into_owned()
    };
    if name.is_empty() {
        return 0;
    }
    let bias = info.dlpi_addr as usize;
    let phdrs = if info.dlpi_phdr.is_null() {
        &[][..]
    } else {
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers of the mapped object.
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
    };
    let mut record = Record {
        name,
        file: None,
        build_id: Vec::new(),
        is_main,
        bias,
        segments: Vec::new(),
        loaded: 0,
        unloaded: u32::MAX,
    };
    for phdr in phdrs {
        let start = bias.wrapping_add(phdr.p_vaddr as usize);
        let range = start..start.wrapping_add(phdr.p_memsz as usize);
        match phdr.p_type {
            libc::PT_LOAD => record.segments.push(range),
            libc::PT_NOTE if record.build_id.is_empty() => {
                // SAFETY: a PT_NOTE segment is mapped, readable, `p_memsz` bytes long.
                let notes = unsafe { std::slice::from_raw_parts(start as *const u8, range.len()) };
                record.build_id = build_id(notes);
            }
            _ => {}
        }
    }
    seen.push(record);
    0
}

/// The `NT_GNU_BUILD_ID` note of a `PT_NOTE` segment, if there is one.
fn build_id(mut notes: &[u8]) -> Vec<u8> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let word = |b: &[u8], at: usize| {
        b.get(at..at + 4)
            .map(|w| u32::from_ne_bytes(w.try_into().unwrap()))
    };
    while let (Some(name_size), Some(desc_size), Some(kind)) =
        (word(notes, 0), word(notes, 4), word(notes, 8))
    {
        let name_end = 12 + (name_size as usize).next_multiple_of(4);
        let desc_end = name_end + (desc_size as usize).next_multiple_of(4);
        if kind == NT_GNU_BUILD_ID && notes.get(12..15) == Some(b"GNU") {
            return notes
                .get(name_end..name_end + desc_size as usize)
                .unwrap_or(&[])
                .to_vec();
        }
        notes = notes.get(desc_end..).unwrap_or(&[]);
    }
    Vec::new()
}
