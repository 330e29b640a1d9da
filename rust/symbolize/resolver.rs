//! One module's debug info, loaded as far as the reported stacks need it: its symbol table, and DWARF one compilation unit at a time (placed by `.debug_aranges`), from a separate debug file found by build id or `.gnu_debuglink` when the module is stripped.
//!
//! addr2line's own `Loader` decompresses every DWARF section and parses the abbreviations of
//! every unit up front: for Debian's libc debug file 38 MB of heap to name one frame in
//! `__libc_start_call_main`, kept until exit. Here the location sections are never read, and
//! each unit a probe falls into gets an addr2line context over that unit alone (its abbreviations,
//! lines and functions); the ranges of units `.debug_aranges` leaves out (clang's by default)
//! are read from their first entry once. Units that refer to entries of other units (rustc's,
//! LTO builds) are read in a context over the whole file, as addr2line would. Everything is
//! released with the [`DebugInfo`].

use std::borrow::Cow;
use std::fs::File;
use std::path::{Path, PathBuf};

use addr2line::gimli::{self, EndianSlice, Reader, RunTimeEndian, Section};
use addr2line::{Context, LookupResult};
use memmap2::Mmap;
use object::{Object, ObjectSection, SymbolMap, SymbolMapName};

use super::names::demangle_symbol;

/// Where debug files of stripped modules live (Debian's `-dbg`/`-dbgsym` packages).
const DEBUG_ROOT: &str = "/usr/lib/debug";

/// Section data as gimli reads it: borrowed from a [`Storage`] that outlives every reader.
type Slice = EndianSlice<'static, RunTimeEndian>;

/// One source location of an address: a function and where in it, before it becomes a
/// [`super::Frame`].
#[derive(Default)]
pub(crate) struct Location {
    pub(crate) function: Option<String>,
    pub(crate) file: Option<String>,
    pub(crate) line: u32,
}

/// A mapped file and the sections decompressed from it. Their bytes stay where they are while it
/// lives, even when it moves (a map's pages, a boxed slice's heap block), so the `'static`
/// slices handed out point into it for as long as the [`DebugInfo`] holding it exists.
struct Storage {
    map: Mmap,
    decompressed: Vec<Box<[u8]>>,
}

impl Storage {
    fn open(path: &Path) -> Option<Storage> {
        let file = File::open(path).ok()?;
        // SAFETY: the map is only read; a module file rewritten while the process runs is a
        // hazard every symbolizer accepts.
        let map = unsafe { Mmap::map(&file) }.ok()?;
        Some(Storage {
            map,
            decompressed: Vec::new(),
        })
    }

    /// The mapped bytes, for as long as `self` lives (see the type's docs).
    fn bytes(&self) -> &'static [u8] {
        // SAFETY: the map is neither moved nor unmapped while `self` lives, and every borrower
        // (object files, symbol maps, contexts) is dropped before it (`DebugInfo` field order).
        unsafe { core::slice::from_raw_parts(self.map.as_ptr(), self.map.len()) }
    }

    /// A section's data, decompressed into `self` if need be.
    fn section(&mut self, object: &object::File<'static>, name: &str) -> &'static [u8] {
        let Some(data) = object
            .section_by_name(name)
            .and_then(|s| s.uncompressed_data().ok())
        else {
            return &[];
        };
        match data {
            Cow::Borrowed(bytes) => bytes,
            Cow::Owned(bytes) => {
                let boxed = bytes.into_boxed_slice();
                // SAFETY: the box's heap block does not move when the box is pushed, and it
                // is freed only with `self`, after every borrower (as in `bytes`).
                let data = unsafe { core::slice::from_raw_parts(boxed.as_ptr(), boxed.len()) };
                self.decompressed.push(boxed);
                data
            }
        }
    }
}

/// The DWARF of one file and what has been built from it so far.
struct Dwarf {
    sections: gimli::DwarfSections<Slice>,
    /// `(start, end, unit offset)` of every `.debug_aranges` entry (and, once `scanned`, of
    /// the units it leaves out), sorted by start.
    ranges: Vec<(u64, u64, usize)>,
    scanned: bool,
    /// What each unit a probe needed resolves with, by unit offset (`None`: nothing parses).
    units: Vec<(usize, Option<UnitContext>)>,
    /// The context over the whole file, for units that refer to others.
    whole: Option<Option<Context<Slice>>>,
}

impl Dwarf {
    fn load(storage: &mut Storage, object: &object::File<'static>) -> Option<Dwarf> {
        let endian = if object.is_little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let sections = gimli::DwarfSections::load(|id| -> Result<Slice, ()> {
            // Variable locations are all a symbolizer never reads, and often the largest part.
            let data = match id {
                gimli::SectionId::DebugLoc | gimli::SectionId::DebugLocLists => &[],
                _ => storage.section(object, id.name()),
            };
            Ok(EndianSlice::new(data, endian))
        })
        .ok()?;
        let mut ranges = Vec::new();
        let mut headers = sections.debug_aranges.headers();
        while let Ok(Some(header)) = headers.next() {
            let unit = header.debug_info_offset().0;
            let mut entries = header.entries();
            while let Ok(Some(entry)) = entries.next() {
                let range = entry.range();
                ranges.push((range.begin, range.end, unit));
            }
        }
        ranges.sort_unstable();
        Some(Dwarf {
            sections,
            ranges,
            scanned: false,
            units: Vec::new(),
            whole: None,
        })
    }

    /// The context of the unit holding `probe`, if any unit does.
    fn context(&mut self, probe: u64) -> Option<&Context<Slice>> {
        let mut unit = unit_at(&self.ranges, probe);
        if unit.is_none() && !self.scanned {
            // `.debug_aranges` may leave units out (rustc writes none, clang by default
            // neither): read the ranges of those units from their own first entry, once.
            self.scanned = true;
            self.ranges.extend(self.ranges_outside_aranges());
            self.ranges.sort_unstable();
            unit = unit_at(&self.ranges, probe);
        }
        let unit = unit?;
        let at = match self.units.iter().position(|u| u.0 == unit) {
            Some(at) => at,
            None => {
                let alone = self.unit_context(unit);
                self.units.push((unit, alone));
                self.units.len() - 1
            }
        };
        match self.units[at].1 {
            Some(UnitContext::Alone(ref context)) => Some(context),
            Some(UnitContext::Whole) => {
                let sections = &self.sections;
                self.whole
                    .get_or_insert_with(|| Context::from_dwarf(sections.borrow(|s| *s)).ok())
                    .as_ref()
            }
            None => None,
        }
    }

    /// The address ranges of the units `.debug_aranges` does not list. Each unit's
    /// abbreviations are parsed for this and dropped right after.
    fn ranges_outside_aranges(&self) -> Vec<(u64, u64, usize)> {
        let listed: std::collections::HashSet<usize> = self.ranges.iter().map(|r| r.2).collect();
        let dwarf = self.sections.borrow(|s| *s);
        let mut out = Vec::new();
        let mut headers = dwarf.units();
        while let Ok(Some(header)) = headers.next() {
            let Some(offset) = header.debug_info_offset().map(|o| o.0) else {
                continue;
            };
            if listed.contains(&offset) {
                continue;
            }
            let Ok(unit) = dwarf.unit(header) else {
                continue;
            };
            let Ok(mut ranges) = dwarf.unit_ranges(&unit) else {
                continue;
            };
            while let Ok(Some(range)) = ranges.next() {
                out.push((range.begin, range.end, offset));
            }
        }
        out
    }

    /// A context that sees only the unit at `offset` of `.debug_info`, unless the unit refers
    /// to entries of other units (rustc does, and LTO builds): those are read in context of the
    /// whole file, so that a reference never lands on the wrong entry.
    fn unit_context(&self, offset: usize) -> Option<UnitContext> {
        let mut dwarf = self.sections.borrow(|s| *s);
        let info = *self.sections.debug_info.reader();
        let header = dwarf
            .debug_info
            .header_from_offset(gimli::DebugInfoOffset(offset))
            .ok()?;
        let abbreviations = self
            .sections
            .debug_abbrev
            .reader()
            .range_from(header.debug_abbrev_offset().0..);
        if refers_to_other_units(abbreviations) != Some(false) {
            return Some(UnitContext::Whole);
        }
        let end = offset.checked_add(header.length_including_self())?;
        if end > info.len() {
            return None;
        }
        dwarf.debug_info = info.range(offset..end).into();
        dwarf.debug_aranges = EndianSlice::new(&[], info.endian()).into();
        Context::from_dwarf(dwarf).ok().map(UnitContext::Alone)
    }
}

/// How the frames of one unit are found.
enum UnitContext {
    /// A context over that unit alone.
    Alone(Context<Slice>),
    /// The whole file's context (the unit refers to entries of other units).
    Whole,
}

/// Whether an abbreviation table (read from its start to its end) has forms that refer to
/// entries by offset in `.debug_info` or in another file rather than inside the unit;
/// `None` if it cannot be read.
fn refers_to_other_units(mut table: Slice) -> Option<bool> {
    const DW_FORM_IMPLICIT_CONST: u64 = 0x21;
    const CROSS_UNIT: [u64; 4] = [
        0x10,   // DW_FORM_ref_addr
        0x1c,   // DW_FORM_ref_sup4
        0x24,   // DW_FORM_ref_sup8
        0x1f20, // DW_FORM_GNU_ref_alt
    ];
    loop {
        let code = table.read_uleb128().ok()?;
        if code == 0 {
            return Some(false);
        }
        table.read_uleb128().ok()?; // tag
        table.read_u8().ok()?; // children
        loop {
            let name = table.read_uleb128().ok()?;
            let form = table.read_uleb128().ok()?;
            if name == 0 && form == 0 {
                break;
            }
            if CROSS_UNIT.contains(&form) {
                return Some(true);
            }
            if form == DW_FORM_IMPLICIT_CONST {
                table.read_sleb128().ok()?;
            }
        }
    }
}

/// The unit whose range holds `probe`, from ranges sorted by start.
fn unit_at(ranges: &[(u64, u64, usize)], probe: u64) -> Option<usize> {
    let i = ranges.partition_point(|r| r.0 <= probe).checked_sub(1)?;
    // Ranges of different units do not overlap; the last one starting below may still end
    // before the probe while an earlier, longer one does not (a unit with scattered ranges).
    ranges[..=i]
        .iter()
        .rev()
        .take(8)
        .find(|r| probe < r.1)
        .map(|r| r.2)
}

/// The debug info of one module, built on the first address that falls into it.
pub(crate) struct DebugInfo {
    // Fields drop in declaration order: everything that borrows from `storage` comes first.
    dwarf: Option<Dwarf>,
    /// Symbol tables, the separate debug file's (which knows local functions) first.
    symbols: Vec<SymbolMap<SymbolMapName<'static>>>,
    storage: Vec<Storage>,
}

impl DebugInfo {
    /// Opens the module's file (memory-mapped) and reads its symbol table; DWARF is read
    /// unit by unit on lookup. `None` when the file cannot be read or parsed.
    pub(crate) fn load(path: &Path) -> Option<Self> {
        let mut binary = Storage::open(path)?;
        let object = object::File::parse(binary.bytes()).ok()?;
        let mut info = DebugInfo {
            dwarf: None,
            symbols: vec![object.symbol_map()],
            storage: Vec::new(),
        };
        if has_section(&object, ".debug_info") {
            info.dwarf = Dwarf::load(&mut binary, &object);
        } else if let Some(mut debug) = separate_debug_file(path).and_then(|p| Storage::open(&p)) {
            // addr2line's Loader does not follow debuglinks ("TODO: use debuglink and
            // debugaltlink" in its loader.rs); backtrace-rs gimli/elf.rs does it like this.
            if let Ok(object) = object::File::parse(debug.bytes()) {
                info.symbols.insert(0, object.symbol_map());
                info.dwarf = Dwarf::load(&mut debug, &object);
            }
            info.storage.push(debug);
        }
        info.storage.push(binary);
        Some(info)
    }

    /// The source locations of `probe` (an address as stated in the file), innermost
    /// inlined function first and the function that owns the machine code last. Never empty:
    /// without debug info the one location has the symbol-table name, or no name at all.
    pub(crate) fn locate(&mut self, probe: u64) -> Vec<Location> {
        let mut locations = Vec::new();
        let context = self.dwarf.as_mut().and_then(|d| d.context(probe));
        let frames = context.map(|c| LookupResult::skip_all_loads(c.find_frames(probe)));
        if let Some(Ok(mut frames)) = frames {
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
                .symbols
                .iter()
                .find_map(|map| map.containing(probe))
                .map(|symbol| demangle_symbol(symbol.name()));
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
    object::File::parse(&*map).is_ok_and(|object| has_section(&object, ".debug_info"))
}

fn has_section(object: &object::File<'_>, name: &str) -> bool {
    object.section_by_name(name).is_some_and(|s| s.size() > 0)
}
