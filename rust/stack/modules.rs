//! The loaded modules and their `.eh_frame` tables (from `dl_iterate_phdr`), published for lock-free reads.
//!
//! A [`Snapshot`] is immutable once published through an `AtomicPtr`. When a return address
//! falls outside every known module (a library `dlopen`ed after the scan), [`refresh`] takes
//! a mutex, rescans if the loader's add/remove counters moved, and publishes a new snapshot.
//! Old snapshots are leaked on purpose: a thread may still be unwinding with one, and there is
//! one per change of the module list, a few KiB each. The rules compiled from the modules'
//! tables are not theirs but the process's (`rules::RULES`): a rescan forgets those of the
//! modules that went before it publishes.
//!
//! Limit: section data is borrowed from the mapped objects. After a `dlclose`, the current
//! snapshot still names the unloaded object until some unknown return address triggers a
//! rescan; a stack that then contains an address in that old range (code mapped there by a
//! later `dlopen`) would read unmapped unwind tables. Programs that `dlclose` and `dlopen`
//! while allocating are outside what this module handles.

use core::ops::Range;
use core::ptr;
use core::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

use framehop::x86_64::UnwinderX86_64;
use framehop::{ExplicitModuleSectionInfo, Module, MustNotAllocateDuringUnwind, Unwinder};

use super::rules::{Sections, RULES};

/// The DWARF unwinder over borrowed section data: `.eh_frame` and `.eh_frame_hdr` are read in
/// place in the mapped modules, so adding a module copies nothing.
pub(crate) type DwarfUnwinder = UnwinderX86_64<&'static [u8], MustNotAllocateDuringUnwind>;

/// An immutable view of the process's modules.
pub(crate) struct Snapshot {
    pub(crate) unwinder: DwarfUnwinder,
    /// Executable address ranges, sorted by start; the same ranges the unwinder knows.
    code: Vec<Range<usize>>,
    /// The unwind sections of each module of `code`, in the same order.
    sections: Vec<Sections>,
    /// The loader's `dlpi_adds`/`dlpi_subs` counters when this snapshot was taken.
    adds: u64,
    subs: u64,
}

impl Snapshot {
    /// The code range of the known module holding `pc`, if any.
    #[inline]
    pub(crate) fn module_of(&self, pc: usize) -> Option<Range<usize>> {
        self.index_of(pc).map(|i| self.code[i].clone())
    }

    /// The unwind sections of the known module holding `pc`, if any.
    pub(crate) fn sections_of(&self, pc: usize) -> Option<Sections> {
        self.index_of(pc).map(|i| self.sections[i])
    }

    /// The code ranges of this snapshot's modules that `fresh` does not hold as they were (same
    /// range, same unwind sections): all of them when modules were both unloaded and loaded
    /// since, as one may have been replaced by another at its very place and layout (the
    /// `dlopen`/`dlclose` hooks rescan after each call, so this takes a loader call that
    /// bypassed them).
    fn gone_from(&self, fresh: &Snapshot) -> Vec<Range<usize>> {
        let replaced = fresh.adds != self.adds && fresh.subs != self.subs;
        self.code
            .iter()
            .zip(&self.sections)
            .filter(|&(code, sections)| {
                replaced
                    || !fresh
                        .code
                        .iter()
                        .zip(&fresh.sections)
                        .any(|(c, s)| c == code && s == sections)
            })
            .map(|(code, _)| code.clone())
            .collect()
    }

    fn index_of(&self, pc: usize) -> Option<usize> {
        // Few modules (tens): a binary search is a handful of compares.
        let i = self
            .code
            .partition_point(|r| r.start <= pc)
            .checked_sub(1)?;
        (pc < self.code[i].end).then_some(i)
    }
}

static CURRENT: AtomicPtr<Snapshot> = AtomicPtr::new(ptr::null_mut());
// Serialises rescans; never taken on the hot path.
static RESCAN: Mutex<()> = Mutex::new(());

/// The rescan lock, held by `fork` (see `tracker::fork`): a child must not find it held by a
/// thread that was rescanning (inside `dlopen`).
pub(crate) fn lock_for_fork() -> std::sync::MutexGuard<'static, ()> {
    RESCAN.lock().unwrap_or_else(|e| e.into_inner())
}

/// The published snapshot, if a scan has happened.
#[inline]
pub(crate) fn current() -> Option<&'static Snapshot> {
    let p = CURRENT.load(Ordering::Acquire);
    // SAFETY: a non-null CURRENT points to a leaked, never-freed, immutable Snapshot.
    unsafe { p.as_ref() }
}

/// The published snapshot, scanning first if there is none yet.
#[inline]
pub(crate) fn current_or_scan() -> Option<&'static Snapshot> {
    current().or_else(refresh)
}

/// Slow path: rescans the modules if the loader's list changed since the last snapshot (or
/// there is none), publishes the result, updates the history of modules and returns the
/// current snapshot.
#[cold]
#[inline(never)]
pub(crate) fn refresh() -> Option<&'static Snapshot> {
    let _guard = RESCAN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(snap) = current() {
        let (adds, subs) = loader_counters();
        if adds == snap.adds && subs == snap.subs {
            return Some(snap);
        }
    }
    let fresh = scan()?;
    if let Some(old) = current() {
        RULES.forget_code(&old.gone_from(&fresh));
    }
    let snap = Box::into_raw(Box::new(fresh));
    CURRENT.store(snap, Ordering::Release);
    // The symbolizer's history of modules learns of the change too, before any stack can be
    // captured in a module mapped now.
    super::history::note_changes();
    current()
}

/// What one module contributes, gathered inside the `dl_iterate_phdr` callback.
#[derive(Clone, Copy, Default)]
struct RawModule {
    bias: usize,
    code: (usize, usize),
    eh_frame_hdr: (usize, usize),
    eh_frame: (usize, usize),
}

struct ScanState {
    out: *mut RawModule,
    cap: usize,
    len: usize,
    adds: u64,
    subs: u64,
}

/// `dlpi_adds`/`dlpi_subs` of the loader: they change on every `dlopen`/`dlclose` that maps or
/// unmaps an object. One callback call is enough to read them.
fn loader_counters() -> (u64, u64) {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: the loader passes a valid info; `data` is the `(u64, u64)` below.
        unsafe {
            let counters = &mut *data.cast::<(u64, u64)>();
            *counters = ((*info).dlpi_adds, (*info).dlpi_subs);
        }
        1
    }
    let mut counters = (u64::MAX, u64::MAX);
    // SAFETY: the callback only writes through `data`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), (&raw mut counters).cast()) };
    counters
}

/// Reads every loaded module's code range and unwind tables and builds a snapshot.
fn scan() -> Option<Snapshot> {
    // Count first, then fill a buffer reserved outside the callback: the loader lock is held
    // during callbacks, and allocating there could re-enter the tracker.
    unsafe extern "C" fn count(
        _: *mut libc::dl_phdr_info,
        _: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: `data` is the usize counter below.
        unsafe { *data.cast::<usize>() += 1 };
        0
    }
    let mut n = 0usize;
    // SAFETY: the callback only increments the counter behind `data`.
    unsafe { libc::dl_iterate_phdr(Some(count), (&raw mut n).cast()) };

    let cap = n + 8; // a few spare for objects loaded between the two passes
    let mut raw = vec![RawModule::default(); cap];
    let mut state = ScanState {
        out: raw.as_mut_ptr(),
        cap,
        len: 0,
        adds: u64::MAX,
        subs: u64::MAX,
    };
    // SAFETY: `collect` writes at most `cap` RawModules into `raw` via `state`, both alive here.
    unsafe { libc::dl_iterate_phdr(Some(collect), (&raw mut state).cast()) };
    raw.truncate(state.len);
    raw.sort_by_key(|m| m.code.0);

    let mut unwinder = DwarfUnwinder::new();
    let mut code = Vec::with_capacity(raw.len());
    let mut sections = Vec::with_capacity(raw.len());
    for m in &raw {
        if code.last().is_some_and(|r: &Range<usize>| r.end > m.code.0) {
            continue; // overlapping ranges cannot both be searched; keep the first
        }
        code.push(m.code.0..m.code.1);
        sections.push(Sections {
            code_start: m.code.0,
            eh_frame_hdr: m.eh_frame_hdr,
            eh_frame: m.eh_frame,
        });
        unwinder.add_module(to_framehop(m));
    }
    Some(Snapshot {
        unwinder,
        code,
        sections,
        adds: state.adds,
        subs: state.subs,
    })
}

unsafe extern "C" fn collect(
    info: *mut libc::dl_phdr_info,
    _: usize,
    data: *mut libc::c_void,
) -> i32 {
    // SAFETY: `data` is the ScanState of `scan`; `info` and its program headers are valid for
    // the duration of the callback (the loader lock is held).
    unsafe {
        let state = &mut *data.cast::<ScanState>();
        let info = &*info;
        state.adds = info.dlpi_adds;
        state.subs = info.dlpi_subs;
        if state.len < state.cap {
            if let Some(m) = read_module(info) {
                state.out.add(state.len).write(m);
                state.len += 1;
            }
        }
    }
    0
}

/// Extracts code range and unwind sections of one loaded object.
///
/// # Safety
/// `info` must come from `dl_iterate_phdr` and be used inside its callback.
unsafe fn read_module(info: &libc::dl_phdr_info) -> Option<RawModule> {
    if info.dlpi_phdr.is_null() || info.dlpi_phnum == 0 {
        return None;
    }
    // SAFETY: the loader guarantees `dlpi_phnum` headers at `dlpi_phdr`.
    let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let bias = info.dlpi_addr as usize;
    let mut code = (usize::MAX, 0usize);
    let mut hdr = (0usize, 0usize);
    for ph in phdrs {
        let start = bias.wrapping_add(ph.p_vaddr as usize);
        if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 {
            code.0 = code.0.min(start);
            code.1 = code.1.max(start + ph.p_memsz as usize);
        } else if ph.p_type == libc::PT_GNU_EH_FRAME {
            hdr = (start, ph.p_memsz as usize);
        }
    }
    if code.0 >= code.1 {
        return None;
    }
    let mut m = RawModule {
        bias,
        code,
        ..RawModule::default()
    };
    if hdr.1 >= 8 {
        // SAFETY: PT_GNU_EH_FRAME lies inside a mapped PT_LOAD segment of this object.
        let hdr_bytes = unsafe { core::slice::from_raw_parts(hdr.0 as *const u8, hdr.1) };
        if let Some(eh) = eh_frame_address(hdr_bytes, hdr.0, bias) {
            // .eh_frame's size is not in the program headers: run to the end of the file-backed
            // part of its PT_LOAD. The hdr's binary-search table gives FDE offsets, so bytes
            // after .eh_frame's terminator are never parsed.
            let seg_end = phdrs
                .iter()
                .filter(|ph| ph.p_type == libc::PT_LOAD)
                .map(|ph| {
                    let s = bias.wrapping_add(ph.p_vaddr as usize);
                    (s, s + ph.p_filesz as usize)
                })
                .find(|&(s, e)| s <= eh && eh < e)
                .map(|(_, e)| e);
            if let Some(end) = seg_end {
                m.eh_frame_hdr = hdr;
                m.eh_frame = (eh, end - eh);
            }
        }
    }
    Some(m)
}

/// Decodes `eh_frame_ptr` of an `.eh_frame_hdr` (version 1) mapped at `hdr_addr`.
fn eh_frame_address(hdr: &[u8], hdr_addr: usize, bias: usize) -> Option<usize> {
    const DW_EH_PE_ABSPTR: u8 = 0x00;
    const DW_EH_PE_UDATA4: u8 = 0x03;
    const DW_EH_PE_UDATA8: u8 = 0x04;
    const DW_EH_PE_SDATA4: u8 = 0x0b;
    const DW_EH_PE_SDATA8: u8 = 0x0c;
    const DW_EH_PE_PCREL: u8 = 0x10;
    const DW_EH_PE_DATAREL: u8 = 0x30;
    if hdr[0] != 1 {
        return None;
    }
    let enc = hdr[1];
    let field = &hdr[4..];
    let word = |n: usize| -> Option<[u8; 8]> {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(field.get(..n)?);
        Some(b)
    };
    let value: i64 = match enc & 0x0f {
        DW_EH_PE_ABSPTR | DW_EH_PE_UDATA8 | DW_EH_PE_SDATA8 => i64::from_le_bytes(word(8)?),
        DW_EH_PE_UDATA4 => u32::from_le_bytes(word(4)?[..4].try_into().ok()?) as i64,
        DW_EH_PE_SDATA4 => i32::from_le_bytes(word(4)?[..4].try_into().ok()?) as i64,
        _ => return None,
    };
    let base = match enc & 0x70 {
        DW_EH_PE_PCREL => hdr_addr + 4,
        DW_EH_PE_DATAREL => hdr_addr,
        // The header sits in a read-only segment, so an absolute value was never relocated.
        0 => bias,
        _ => return None,
    };
    Some(base.wrapping_add(value as usize))
}

fn to_framehop(m: &RawModule) -> Module<&'static [u8]> {
    let svma = |(addr, len): (usize, usize)| (addr - m.bias) as u64..(addr - m.bias + len) as u64;
    let bytes = |(addr, len): (usize, usize)| -> &'static [u8] {
        // SAFETY: both ranges (.eh_frame, .eh_frame_hdr) lie in mapped read-only segments of a
        // loaded object; they stay valid until it is dlclosed (see the module docs on that limit).
        unsafe { core::slice::from_raw_parts(addr as *const u8, len) }
    };
    let mut info = ExplicitModuleSectionInfo::<&'static [u8]> {
        base_svma: 0,
        text_svma: Some(svma(m.code)),
        ..Default::default()
    };
    if m.eh_frame.1 != 0 {
        info.eh_frame_svma = Some(svma(m.eh_frame));
        info.eh_frame = Some(bytes(m.eh_frame));
        info.eh_frame_hdr_svma = Some(svma(m.eh_frame_hdr));
        info.eh_frame_hdr = Some(bytes(m.eh_frame_hdr));
    }
    // An empty name: framehop only keeps it for debugging, and it would cost an allocation.
    Module::new(
        String::new(),
        m.code.0 as u64..m.code.1 as u64,
        m.bias as u64,
        info,
    )
}
