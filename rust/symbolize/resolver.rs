//! One module's debug info: an `addr2line::Loader` for DWARF and the symbol table, with a
//! separate debug file found by build id or `.gnu_debuglink` when the module is stripped.

use std::borrow::Cow;
use std::fs::File;
use std::path::{Path, PathBuf};

use addr2line::Loader;
use object::{Object, ObjectSection};

use super::names::demangle_symbol;

/// Where debug files of stripped modules live (Debian's `-dbg`/`-dbgsym` packages).
const DEBUG_ROOT: &str = "/usr/lib/debug";

/// One source location of an address: a function and where in it, before it becomes a
/// [`super::Frame`].
#[derive(Default)]
pub(crate) struct Location {
    pub(crate) function: Option<String>,
    pub(crate) file: Option<String>,
    pub(crate) line: u32,
}

/// The debug info of one module, built on the first address that falls into it.
pub(crate) struct DebugInfo {
    /// The module file itself: its DWARF if not stripped, and its `.symtab`/`.dynsym`.
    binary: Loader,
    /// The separate debug file, when the module has no DWARF of its own.
    separate: Option<Loader>,
}

impl DebugInfo {
    /// Loads the module's file (memory-mapped; DWARF units are parsed lazily on lookup).
    /// `None` when the file cannot be read or parsed.
    pub(crate) fn load(path: &Path) -> Option<Self> {
        let binary = Loader::new(path).ok()?;
        let separate = if binary.get_section_range(b".debug_info").is_some() {
            None
        } else {
            // addr2line's Loader does not follow debuglinks ("TODO: use debuglink and
            // debugaltlink" in its loader.rs); backtrace-rs gimli/elf.rs does it like this.
            separate_debug_file(path).and_then(|debug| Loader::new(debug).ok())
        };
        Some(DebugInfo { binary, separate })
    }

    /// The source locations of `probe` (an address as stated in the file), innermost
    /// inlined function first and the function that owns the machine code last. Never empty:
    /// without debug info the one location has the symbol-table name, or no name at all.
    pub(crate) fn locate(&self, probe: u64) -> Vec<Location> {
        let dwarf = self.separate.as_ref().unwrap_or(&self.binary);
        let mut locations = Vec::new();
        if let Ok(mut frames) = dwarf.find_frames(probe) {
            while let Ok(Some(frame)) = frames.next() {
                let function = frame
                    .function
                    .as_ref()
                    .and_then(|name| name.demangle().ok())
                    .map(Cow::into_owned);
                let (file, line) = frame.location.map_or((None, 0), |location| {
                    (location.file.map(str::to_owned), location.line.unwrap_or(0))
                });
                locations.push(Location {
                    function,
                    file,
                    line,
                });
            }
        }
        // DWARF names come first because they match what was compiled; the symbol table
        // fills in where there is no DWARF function (assembly, stripped modules). A debug
        // file's `.symtab` knows the local functions that `.dynsym` lacks, so it goes first.
        // `find_symbol` only answers for a symbol whose size covers the address: a function
        // missing from `.dynsym` stays unnamed (module+offset) instead of borrowing the name
        // of the exported function below it, as GNU addr2line's nearest-symbol rule does.
        // g++ gives functions of internal linkage (anonymous namespaces, lambdas, destructors
        // of local classes) no DW_AT_linkage_name, so DWARF names them bare ("spawn"): the
        // symbol's demangled name, qualified and with parameters, is what a reader wants then.
        // (A name DWARF qualified has "::"; a bare one of a namespace member never does.)
        let outer_is_bare = locations.last().is_none_or(|outer| {
            outer
                .function
                .as_deref()
                .is_none_or(|name| !name.contains("::"))
        });
        if outer_is_bare {
            let symbol = self
                .separate
                .as_ref()
                .and_then(|debug| debug.find_symbol(probe))
                .or_else(|| self.binary.find_symbol(probe))
                .map(demangle_symbol);
            match (locations.last_mut(), symbol) {
                (Some(outer), Some(symbol)) => outer.function = Some(symbol),
                (Some(_), None) => {}
                (None, symbol) => locations.push(Location {
                    function: symbol,
                    file: None,
                    line: 0,
                }),
            }
        }
        locations
    }
}

/// The separate debug file of a stripped module: `/usr/lib/debug/.build-id/xx/yyyy.debug`
/// first, then the `.gnu_debuglink` name next to the module, in its `.debug/` folder, and
/// under `/usr/lib/debug/<module folder>/` (the order gdb documents).
fn separate_debug_file(path: &Path) -> Option<PathBuf> {
    let file = File::open(path).ok()?;
    // SAFETY: the map is only read while `file` is open, as addr2line's Loader does; a
    // module file rewritten while the process runs is a hazard every symbolizer accepts.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let object = object::File::parse(&*map).ok()?;
    if let Ok(Some([first, rest @ ..])) = object.build_id() {
        let hex: String = rest.iter().map(|byte| format!("{byte:02x}")).collect();
        let candidate = PathBuf::from(format!("{DEBUG_ROOT}/.build-id/{first:02x}/{hex}.debug"));
        if candidate.is_file() {
            return Some(candidate);
        }
    }
    let (name, _crc) = object.gnu_debuglink().ok()??;
    let name = std::str::from_utf8(name).ok()?;
    // /proc/self/exe is a link: its real folder is where the debuglink file sits.
    let real = std::fs::canonicalize(path).ok()?;
    let folder = real.parent()?;
    [
        folder.join(name),
        folder.join(".debug").join(name),
        Path::new(DEBUG_ROOT)
            .join(folder.strip_prefix("/").unwrap_or(folder))
            .join(name),
    ]
    .into_iter()
    .find(|candidate| *candidate != real && has_dwarf(candidate))
}

/// Whether a candidate debug file really has DWARF (a debuglink name can collide with an
/// unrelated stripped file; gdb checks the CRC, the section is a cheaper test).
fn has_dwarf(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    // SAFETY: as in `separate_debug_file`: read-only use while the file is open.
    let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return false;
    };
    object::File::parse(&*map)
        .ok()
        .and_then(|object| object.section_by_name(".debug_info").map(|s| s.size() > 0))
        .unwrap_or(false)
}
