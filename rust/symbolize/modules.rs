//! Snapshot of the loaded modules from `dl_iterate_phdr`: path, load bias and `PT_LOAD` ranges.

use std::ffi::{c_int, c_void, CStr};
use std::ops::Range;
use std::path::PathBuf;

/// One loaded ELF object (the main program or a shared library).
pub(crate) struct Module {
    /// The path shown in frames: the real path of the executable, or the loader's name.
    pub(crate) name: String,
    /// The file to read the debug info from; `None` for objects with no file (the vdso).
    pub(crate) file: Option<PathBuf>,
    /// `dlpi_addr`: runtime address minus the address stated in the file (0 for non-PIE).
    pub(crate) bias: usize,
}

/// The modules of the process and their mapped address ranges, sorted for lookup.
pub(crate) struct ModuleMap {
    pub(crate) modules: Vec<Module>,
    /// `(runtime range of one PT_LOAD segment, index into modules)`, sorted by start.
    segments: Vec<(Range<usize>, usize)>,
}

impl ModuleMap {
    /// Takes the snapshot now: a library `dlclose`d later keeps its entry, and one loaded
    /// later is not in it, so take it while the stacks' modules are still mapped.
    pub(crate) fn snapshot() -> Self {
        let mut map = ModuleMap {
            modules: Vec::new(),
            segments: Vec::new(),
        };
        // SAFETY: the callback matches the signature dl_iterate_phdr expects, and `data` is
        // a valid `&mut ModuleMap` that outlives the call (the iteration is synchronous).
        unsafe {
            libc::dl_iterate_phdr(Some(add_module), (&raw mut map).cast::<c_void>());
        }
        map.segments.sort_by_key(|(range, _)| range.start);
        map
    }

    /// The index of the module whose `PT_LOAD` segment contains `address`.
    pub(crate) fn find(&self, address: usize) -> Option<usize> {
        let after = self
            .segments
            .partition_point(|(range, _)| range.start <= address);
        let (range, index) = self.segments.get(after.checked_sub(1)?)?;
        range.contains(&address).then_some(*index)
    }
}

/// `dl_iterate_phdr` callback: records one module. Allocates (the caller is at report time,
/// under the tracker's reentrancy guard) but never panics across the C frame.
unsafe extern "C" fn add_module(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info for the duration of the call, and `data`
    // is the `&mut ModuleMap` given by `snapshot`.
    let (info, map) = unsafe { (&*info, &mut *data.cast::<ModuleMap>()) };
    let loader_name = if info.dlpi_name.is_null() {
        &[][..]
    } else {
        // SAFETY: a non-null dlpi_name is a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
    };
    let (name, file) = if map.modules.is_empty() && loader_name.is_empty() {
        // The main program comes first with an empty name (backtrace-rs
        // libs_dl_iterate_phdr.rs `infer_current_exe`); /proc/self/exe opens it even when
        // the path has since been deleted or replaced.
        let real = std::fs::read_link("/proc/self/exe")
            .map(|path| path.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "/proc/self/exe".to_owned());
        (real, Some(PathBuf::from("/proc/self/exe")))
    } else {
        let name = String::from_utf8_lossy(loader_name).into_owned();
        // The vdso ("linux-vdso.so.1") and other file-less objects keep their name for the
        // module+offset of a frame, but there is nothing to read debug info from.
        let file = std::fs::File::open(&name)
            .ok()
            .map(|_| PathBuf::from(&name));
        (name, file)
    };
    if name.is_empty() {
        return 0;
    }
    let index = map.modules.len();
    let bias = info.dlpi_addr as usize;
    let phdrs = if info.dlpi_phdr.is_null() {
        &[][..]
    } else {
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers of the mapped object.
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
    };
    for phdr in phdrs.iter().filter(|phdr| phdr.p_type == libc::PT_LOAD) {
        let start = bias.wrapping_add(phdr.p_vaddr as usize);
        map.segments
            .push((start..start.wrapping_add(phdr.p_memsz as usize), index));
    }
    map.modules.push(Module { name, file, bias });
    0
}
