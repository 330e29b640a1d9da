//! One module's debug info, loaded as far as the reported stacks need it: its symbol table, and DWARF one compilation unit at a time (placed by `.debug_aranges`), from a separate debug file found by build id or `.gnu_debuglink` when the module is stripped.
//!
//! addr2line's own `Loader` decompresses every DWARF section and parses the abbreviations of
//! every unit up front: for Debian's libc debug file 38 MB of heap to name one frame in
//! `__libc_start_call_main`, kept until exit. Here the location sections are never read, and
//! each unit a probe falls into gets an addr2line context over that unit alone (its abbreviations,
//! lines and functions); the ranges of units `.debug_aranges` leaves out (clang's by default)
//! are read from their first entry once. Units that refer to entries of other units (rustc's,
//! LTO builds) are read in a context over the whole file, as addr2line would. Given all the
//! addresses it will be asked for ([`DebugInfo::load_for`]), it decompresses only the units
//! they fall into (with their abbreviations and line programs), resolves them unit by unit and
//! lets each unit's memory go before the next. Everything is released with the [`DebugInfo`].

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use addr2line::gimli::{self, EndianSlice, Reader, RunTimeEndian, Section};
use addr2line::{Context, LookupResult};
use object::{Object, ObjectSection, SymbolMap, SymbolMapName};

use super::names::{demangle, demangle_symbol};
use super::sections::{initial_length, word, End, Storage};

/// Where debug files of stripped modules live (Debian's `-dbg`/`-dbgsym` packages).
const DEBUG_ROOT: &str = "/usr/lib/debug";

/// Section data as gimli reads it: borrowed from a [`Storage`] that outlives every reader.
pub(super) type Slice = EndianSlice<'static, RunTimeEndian>;

/// One source location of an address: a function and where in it, before it becomes a
/// [`super::Frame`].
#[derive(Default)]
pub(crate) struct Location {
    pub(crate) function: Option<String>,
    pub(crate) file: Option<String>,
    pub(crate) line: u32,
}

/// The DWARF of one file and what has been built from it so far.
struct Dwarf {
    sections: gimli::DwarfSections<Slice>,
    /// `(start, end, unit offset)` of every `.debug_aranges` entry (of those that hold a
    /// probe, where the probes are known), and, once `scanned`, of the units it leaves out;
    /// sorted by start.
    ranges: Vec<(u64, u64, usize)>,
    /// The units `.debug_aranges` lists.
    listed: HashSet<usize>,
    /// The units `.debug_aranges` leaves out, when known from a walk over the unit headers
    /// (`None`: to be found by walking `.debug_info`).
    unlisted: Option<Vec<usize>>,
    scanned: bool,
    /// What each unit a probe needed resolves with, by unit offset (`None`: nothing parses).
    units: Vec<(usize, Option<UnitContext>)>,
    /// The context over the whole file, for units that refer to others.
    whole: Option<Option<Context<Slice>>>,
}

/// A unit's offset in `.debug_info` and the offset of its abbreviations, from its header.
struct UnitHead {
    offset: usize,
    abbrev: usize,
}

impl UnitHead {
    /// Reads the header bytes at a unit's start (DWARF 2 to 5).
    fn parse(offset: usize, head: &[u8], little: bool) -> Option<UnitHead> {
        let (_, size) = initial_length(head, little)?;
        let word_size = if size == 12 { 8 } else { 4 };
        let version = word(head, size, 2, little)?;
        // DWARF 5 puts the unit type and the address size before the abbreviations' offset.
        let at = size + 2 + if version >= 5 { 2 } else { 0 };
        let abbrev = usize::try_from(word(head, at, word_size, little)?).ok()?;
        Some(UnitHead { offset, abbrev })
    }
}

impl Dwarf {
    /// Reads the file's DWARF: every section but the variable locations, which a symbolizer
    /// never reads. With `probes` (every address that will be looked up), compressed
    /// `.debug_info`, `.debug_abbrev` and `.debug_line` are decompressed only where those
    /// addresses' units lie (see [`Dwarf::load_sparse`]).
    fn load(
        storage: &mut Storage,
        object: &object::File<'static>,
        probes: Option<&[u64]>,
    ) -> Option<Dwarf> {
        let endian = if object.is_little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let sparse = probes.is_some()
            && matches!(
                storage.section(object, ".debug_info"),
                super::sections::Section::Compressed(_)
            );
        let deferred = |id: gimli::SectionId| {
            sparse
                && matches!(
                    id,
                    gimli::SectionId::DebugInfo
                        | gimli::SectionId::DebugAbbrev
                        | gimli::SectionId::DebugLine
                )
        };
        let sections = gimli::DwarfSections::load(|id| -> Result<Slice, ()> {
            let data = match id {
                gimli::SectionId::DebugLoc | gimli::SectionId::DebugLocLists => &[],
                id if deferred(id) => &[],
                _ => storage.whole(object, id.name()),
            };
            Ok(EndianSlice::new(data, endian))
        })
        .ok()?;
        // With the probes known, only the entries that hold one are kept: yaml-cpp's tests have
        // 10,800 entries, whose vector (a quarter of a MiB, 64 page faults) and sort cost 2.5 M
        // instructions for the 10 or so a report's stacks need.
        let sorted = probes.map(|probes| {
            let mut sorted = probes.to_vec();
            sorted.sort_unstable();
            sorted
        });
        let wanted = |range: gimli::Range| {
            sorted.as_ref().is_none_or(|sorted| {
                let at = sorted.partition_point(|&p| p < range.begin);
                sorted.get(at).is_some_and(|&p| p < range.end)
            })
        };
        let mut ranges = Vec::new();
        let mut listed = HashSet::new();
        let mut headers = sections.debug_aranges.headers();
        while let Ok(Some(header)) = headers.next() {
            let unit = header.debug_info_offset().0;
            listed.insert(unit);
            let mut entries = header.entries();
            while let Ok(Some(entry)) = entries.next() {
                let range = entry.range();
                if wanted(range) {
                    ranges.push((range.begin, range.end, unit));
                }
            }
        }
        ranges.sort_unstable_by_key(|r| r.0);
        let mut dwarf = Dwarf {
            sections,
            ranges,
            listed,
            unlisted: None,
            scanned: false,
            units: Vec::new(),
            whole: None,
        };
        if let (true, Some(probes)) = (sparse, probes) {
            if dwarf.load_sparse(storage, object, probes).is_none() {
                // A stream or a header that does not read as expected: decompress it all, as
                // addr2line would, rather than lose the module's lines.
                return Dwarf::load(storage, object, None);
            }
        }
        Some(dwarf)
    }

    /// Decompresses what `probes` need of compressed `.debug_info`, `.debug_abbrev` and
    /// `.debug_line`: one pass over `.debug_info` reads every unit header and keeps the units
    /// the probes fall into (and, when some probe lies outside `.debug_aranges`, the units it
    /// leaves out), then their abbreviation tables and line programs. A unit that refers to
    /// other units needs them all: then the three sections are decompressed whole.
    fn load_sparse(
        &mut self,
        storage: &mut Storage,
        object: &object::File<'static>,
        probes: &[u64],
    ) -> Option<()> {
        use super::sections::{Section, Walk};
        let little = object.is_little_endian();
        let endian = self.sections.debug_info.reader().endian();
        let compressed = |storage: &mut Storage, name| match storage.section(object, name) {
            Section::Compressed(c) => Some(c),
            Section::InPlace(_) => None,
        };
        let mut info = compressed(storage, ".debug_info")?;
        let listed = &self.listed;
        let mut wanted: HashSet<usize> = probes
            .iter()
            .filter_map(|&p| unit_at(&self.ranges, p))
            .collect();
        let uncovered = probes.iter().any(|&p| unit_at(&self.ranges, p).is_none());
        // With every probe in `.debug_aranges`, the walk ends one unit past the last wanted
        // one (whose abbreviations' start bounds the tables before it): a libc frame's unit
        // (`__libc_start_main` lies in the first few) costs a few KiB of stream, not the whole.
        let last_wanted = (!uncovered).then(|| wanted.iter().copied().max().unwrap_or(0));
        let mut heads = Vec::new();
        let mut unlisted = Vec::new();
        let mut stopped = false;
        let walked = info.walk_units(|offset, head| {
            if let Some(head) = UnitHead::parse(offset, head, little) {
                if !listed.contains(&offset) {
                    unlisted.push(offset);
                }
                heads.push(head);
            }
            if last_wanted.is_some_and(|last| offset > last) {
                stopped = true;
                Walk::Stop
            } else if wanted.contains(&offset) || (uncovered && !listed.contains(&offset)) {
                Walk::Keep
            } else {
                Walk::Skip
            }
        });
        if !walked {
            return None;
        }
        if uncovered {
            wanted.extend(unlisted.iter().copied());
        }
        let mut abbrev = match storage.section(object, ".debug_abbrev") {
            Section::Compressed(c) => Some(c),
            Section::InPlace(bytes) => {
                self.sections.debug_abbrev = EndianSlice::new(bytes, endian).into();
                None
            }
        };
        if let Some(abbrev) = &mut abbrev {
            // A unit's table ends where the next one starts (or at the section's end).
            let mut starts: Vec<usize> = heads.iter().map(|h| h.abbrev).collect();
            starts.sort_unstable();
            starts.dedup();
            let mut tables: Vec<(usize, End)> = heads
                .iter()
                .filter(|h| wanted.contains(&h.offset))
                .map(|h| {
                    let next = starts.partition_point(|&s| s <= h.abbrev);
                    (
                        h.abbrev,
                        End::At(starts.get(next).copied().unwrap_or(abbrev.size)),
                    )
                })
                .collect();
            tables.sort_unstable();
            tables.dedup();
            if !abbrev.fill(&tables) {
                return None;
            }
        }
        self.sections.debug_info = EndianSlice::new(storage.keep(info), endian).into();
        if let Some(abbrev) = abbrev {
            self.sections.debug_abbrev = EndianSlice::new(storage.keep(abbrev), endian).into();
        }
        self.unlisted = Some(unlisted);
        // The units past the stop were never seen: addresses other than the probes that lie
        // outside `.debug_aranges` find their symbol only (as `load_for` says).
        self.scanned = stopped;
        let cross_unit = heads
            .iter()
            .filter(|h| wanted.contains(&h.offset))
            .any(|h| {
                let table = self.sections.debug_abbrev.reader().range_from(h.abbrev..);
                refers_to_other_units(table) != Some(false)
            });
        if cross_unit {
            // Fresh copies, whole: what was handed out above is never written again.
            for (id, name) in [
                (gimli::SectionId::DebugInfo, ".debug_info"),
                (gimli::SectionId::DebugAbbrev, ".debug_abbrev"),
                (gimli::SectionId::DebugLine, ".debug_line"),
            ] {
                let bytes = EndianSlice::new(storage.whole(object, name), endian);
                match id {
                    gimli::SectionId::DebugInfo => self.sections.debug_info = bytes.into(),
                    gimli::SectionId::DebugAbbrev => self.sections.debug_abbrev = bytes.into(),
                    _ => self.sections.debug_line = bytes.into(),
                }
            }
            self.unlisted = None;
            return Some(());
        }
        let line = match storage.section(object, ".debug_line") {
            Section::Compressed(mut line) => {
                let mut programs: Vec<(usize, End)> = heads
                    .iter()
                    .filter(|h| wanted.contains(&h.offset))
                    .filter_map(|h| self.line_program_offset(h.offset))
                    .map(|offset| (offset, End::Length))
                    .collect();
                programs.sort_unstable();
                programs.dedup();
                if !line.fill(&programs) {
                    return None;
                }
                storage.keep(line)
            }
            Section::InPlace(bytes) => bytes,
        };
        self.sections.debug_line = EndianSlice::new(line, endian).into();
        Some(())
    }

    /// The offset of the line program of the unit at `offset` (its `DW_AT_stmt_list`).
    fn line_program_offset(&self, offset: usize) -> Option<usize> {
        let dwarf = self.sections.borrow(|s| *s);
        let header = dwarf
            .debug_info
            .header_from_offset(gimli::DebugInfoOffset(offset))
            .ok()?;
        let abbreviations = dwarf.abbreviations(&header).ok()?;
        let mut entries = header.entries(&abbreviations);
        let root = entries.next_dfs().ok()??;
        match root.attr_value(gimli::DW_AT_stmt_list)? {
            gimli::AttributeValue::DebugLineRef(line) => Some(line.0),
            _ => None,
        }
    }

    /// The unit whose range holds `probe`, if any: from `.debug_aranges`, else from the ranges
    /// of the units it leaves out, read once (calling `trim` now and then on the way).
    fn unit_of(&mut self, probe: u64, trim: &dyn Fn()) -> Option<usize> {
        let unit = unit_at(&self.ranges, probe);
        if unit.is_some() || self.scanned {
            return unit;
        }
        // `.debug_aranges` may leave units out (rustc writes none, clang by default
        // neither): read the ranges of those units from their own first entry, once.
        self.scanned = true;
        self.ranges.extend(self.ranges_outside_aranges(trim));
        self.ranges.sort_unstable();
        unit_at(&self.ranges, probe)
    }

    /// The locations of `probes`, all in the unit at `offset`, read without building the
    /// unit's tables ([`super::lean`]); `None` for a unit that refers to others or that does
    /// not read as expected (addr2line's context takes it then).
    fn locate_lean(
        &self,
        offset: usize,
        probes: &[u64],
        trim: &dyn Fn(),
    ) -> Option<Vec<Vec<Location>>> {
        let (header, alone) = self.unit_header(offset)?;
        if !alone {
            return None;
        }
        let dwarf = self.sections.borrow(|s| *s);
        let unit = dwarf.unit(header).ok()?;
        super::lean::locate_in_unit(gimli::UnitRef::new(&dwarf, &unit), probes, trim)
    }

    /// Drops the contexts of single units (the whole file's stays: it serves many).
    fn release_units(&mut self) {
        self.units.clear();
    }

    /// The context of the unit holding `probe`, if any unit does.
    fn context(&mut self, probe: u64, trim: &dyn Fn()) -> Option<&Context<Slice>> {
        let unit = self.unit_of(probe, trim)?;
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

    /// The address ranges of the units `.debug_aranges` does not list, each read from the
    /// unit's first entry alone ([`ranges_unit`]).
    fn ranges_outside_aranges(&self, trim: &dyn Fn()) -> Vec<(u64, u64, usize)> {
        /// Units read between two calls of `trim`: their headers, first entries and those
        /// entries' abbreviations are all that is read of them, a few pages each.
        const TRIM_EVERY: usize = 8;
        /// Unit headers walked past between two calls of `trim`.
        const HEADERS_PER_TRIM: usize = 16;
        let dwarf = self.sections.borrow(|s| *s);
        let mut out = Vec::new();
        let mut read = 0;
        let mut add = |header: gimli::UnitHeader<Slice>| {
            read += 1;
            if read % TRIM_EVERY == 0 {
                trim();
            }
            let Some(offset) = header.debug_info_offset().map(|o| o.0) else {
                return;
            };
            let Some(unit) = ranges_unit(&dwarf, header) else {
                return;
            };
            let Ok(mut ranges) = dwarf.unit_ranges(&unit) else {
                return;
            };
            while let Ok(Some(range)) = ranges.next() {
                out.push((range.begin, range.end, offset));
            }
        };
        match &self.unlisted {
            // Walked already (a compressed file): only those units were decompressed.
            Some(unlisted) => {
                for &offset in unlisted {
                    if let Ok(header) = dwarf
                        .debug_info
                        .header_from_offset(gimli::DebugInfoOffset(offset))
                    {
                        add(header);
                    }
                }
            }
            None => {
                let listed = &self.listed;
                let mut headers = dwarf.units();
                let mut walked = 0;
                while let Ok(Some(header)) = headers.next() {
                    // Reaching each unit's header faults in the pages around it (the kernel's
                    // fault-around): over yaml-cpp's 568 units that was 2.9 MiB at once
                    // before the first unit `.debug_aranges` leaves out.
                    walked += 1;
                    if walked % HEADERS_PER_TRIM == 0 {
                        trim();
                    }
                    let offset = header.debug_info_offset().map(|o| o.0);
                    if offset.is_some_and(|o| !listed.contains(&o)) {
                        add(header);
                    }
                }
            }
        }
        out
    }

    /// The header of the unit at `offset` of `.debug_info`, and whether the unit stands alone:
    /// refers to no entry of another unit (rustc's units and LTO builds' do).
    fn unit_header(&self, offset: usize) -> Option<(gimli::UnitHeader<Slice>, bool)> {
        let header = self
            .sections
            .debug_info
            .header_from_offset(gimli::DebugInfoOffset(offset))
            .ok()?;
        let abbreviations = self
            .sections
            .debug_abbrev
            .reader()
            .range_from(header.debug_abbrev_offset().0..);
        Some((header, refers_to_other_units(abbreviations) == Some(false)))
    }

    /// A context that sees only the unit at `offset` of `.debug_info`, unless the unit refers
    /// to entries of other units (rustc does, and LTO builds): those are read in context of the
    /// whole file, so that a reference never lands on the wrong entry.
    fn unit_context(&self, offset: usize) -> Option<UnitContext> {
        let (header, alone) = self.unit_header(offset)?;
        if !alone {
            return Some(UnitContext::Whole);
        }
        let mut dwarf = self.sections.borrow(|s| *s);
        let info = *self.sections.debug_info.reader();
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
    const CROSS_UNIT: [u64; 4] = [
        0x10,   // DW_FORM_ref_addr
        0x1c,   // DW_FORM_ref_sup4
        0x24,   // DW_FORM_ref_sup8
        0x1f20, // DW_FORM_GNU_ref_alt
    ];
    loop {
        let mut cross = false;
        match next_abbreviation(&mut table, |form| cross |= CROSS_UNIT.contains(&form))? {
            0 => return Some(false),
            _ if cross => return Some(true),
            _ => {}
        }
    }
}

/// Reads the abbreviation at the start of `table` (showing `visit` each attribute's form) and
/// returns its code, leaving `table` at the next one: 0 at the table's end, `None` where it
/// does not read.
fn next_abbreviation(table: &mut Slice, mut visit: impl FnMut(u64)) -> Option<u64> {
    const DW_FORM_IMPLICIT_CONST: u64 = 0x21;
    let code = table.read_uleb128().ok()?;
    if code == 0 {
        return Some(0);
    }
    table.read_uleb128().ok()?; // tag
    table.read_u8().ok()?; // children
    loop {
        let name = table.read_uleb128().ok()?;
        let form = table.read_uleb128().ok()?;
        if name == 0 && form == 0 {
            return Some(code);
        }
        visit(form);
        if form == DW_FORM_IMPLICIT_CONST {
            table.read_sleb128().ok()?;
        }
    }
}

/// The unit of `header` as far as its address ranges go: the abbreviation of its first entry
/// alone, and the bases that entry states. `gimli::Unit::new` parses the whole abbreviation
/// table and the line program's header too: 8 us a unit, over the 422 units of yaml-cpp's test
/// program that `.debug_aranges` leaves out (the tracker's own), read for a `_start` frame that
/// none of them holds.
fn ranges_unit(
    dwarf: &gimli::Dwarf<Slice>,
    header: gimli::UnitHeader<Slice>,
) -> Option<gimli::Unit<Slice>> {
    let code = header
        .range_from(gimli::UnitOffset(header.header_size())..)
        .ok()?
        .read_uleb128()
        .ok()?;
    let mut table = dwarf
        .debug_abbrev
        .reader()
        .range_from(header.debug_abbrev_offset().0..);
    let root = loop {
        let at = table;
        match next_abbreviation(&mut table, |_| ())? {
            0 => return None,
            found if found == code => break at.range_to(..at.len() - table.len()),
            _ => {}
        }
    };
    // A table of that one abbreviation, ended as tables are.
    let mut bytes = root.slice().to_vec();
    bytes.push(0);
    let abbreviations = gimli::DebugAbbrev::new(&bytes, root.endian())
        .abbreviations(gimli::DebugAbbrevOffset(0))
        .ok()?;
    let encoding = header.encoding();
    let mut unit = gimli::Unit {
        header,
        abbreviations: std::sync::Arc::new(abbreviations),
        name: None,
        comp_dir: None,
        low_pc: 0,
        str_offsets_base: gimli::DebugStrOffsetsBase::default_for_encoding_and_file(
            encoding,
            dwarf.file_type,
        ),
        addr_base: gimli::DebugAddrBase(0),
        loclists_base: gimli::DebugLocListsBase::default_for_encoding_and_file(
            encoding,
            dwarf.file_type,
        ),
        rnglists_base: gimli::DebugRngListsBase::default_for_encoding_and_file(
            encoding,
            dwarf.file_type,
        ),
        line_program: None,
        dwo_id: None,
    };
    let mut low_pc = None;
    let mut entries = unit.header.entries(&unit.abbreviations);
    let entry = entries.next_dfs().ok()??;
    for attr in entry.attrs() {
        match (attr.name(), attr.value()) {
            (gimli::DW_AT_low_pc, value) => low_pc = Some(value),
            (gimli::DW_AT_str_offsets_base, gimli::AttributeValue::DebugStrOffsetsBase(base)) => {
                unit.str_offsets_base = base;
            }
            (
                gimli::DW_AT_addr_base | gimli::DW_AT_GNU_addr_base,
                gimli::AttributeValue::DebugAddrBase(base),
            ) => unit.addr_base = base,
            (
                gimli::DW_AT_rnglists_base | gimli::DW_AT_GNU_ranges_base,
                gimli::AttributeValue::DebugRngListsBase(base),
            ) => unit.rnglists_base = base,
            _ => {}
        }
    }
    if let Some(value) = low_pc {
        unit.low_pc = dwarf.attr_address(&unit, value).ok()?.unwrap_or(0);
    }
    Some(unit)
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

/// Address space the symbolizer wants free beside a module's mapped files, for the tables it
/// builds from them (a few MiB for the largest modules).
const HEADROOM: usize = 32 << 20;

/// Whether [`HEADROOM`] of address space is still free: a process near its address-space limit
/// (`ulimit -v`) gets its module left unsymbolized (raw addresses in the report) rather than an
/// allocation failing halfway, which aborts (the symbolizer's allocations are not fallible).
fn has_headroom() -> bool {
    let probe = crate::sys::reserve_pages(HEADROOM);
    if probe.is_null() {
        return false;
    }
    // SAFETY: the reservation was made just above and is used by nobody.
    unsafe { crate::sys::unmap_pages(probe, HEADROOM) };
    true
}

/// How much of a file's DWARF [`DebugInfo::open`] reads.
enum DwarfRead<'a> {
    Everything,
    /// What these addresses need (compressed DWARF: only their units).
    For(&'a [u64]),
    /// None: the symbol tables alone.
    Nothing,
}

impl DwarfRead<'_> {
    fn load(&self, storage: &mut Storage, object: &object::File<'static>) -> Option<Dwarf> {
        match *self {
            DwarfRead::Everything => Dwarf::load(storage, object, None),
            DwarfRead::For(probes) => Dwarf::load(storage, object, Some(probes)),
            DwarfRead::Nothing => None,
        }
    }
}

/// The debug info of one module, built on the first address that falls into it.
pub(crate) struct DebugInfo {
    // Fields drop in declaration order: everything that borrows from `storage` comes first.
    dwarf: Option<Dwarf>,
    /// Symbol tables, the separate debug file's (which knows local functions) first; built
    /// from `objects` the first time DWARF leaves a function unnamed or bare.
    symbols: Option<Vec<SymbolMap<SymbolMapName<'static>>>>,
    /// The answers of [`DebugInfo::symbol_names`] so far, by probe.
    named: HashMap<u64, Option<String>>,
    objects: Vec<object::File<'static>>,
    storage: Vec<Storage>,
}

impl DebugInfo {
    /// Opens the module's file (memory-mapped); its symbol table is read when first needed,
    /// DWARF unit by unit on lookup. `None` when the file cannot be read or parsed.
    pub(crate) fn load(path: &Path) -> Option<Self> {
        Self::open(path, DwarfRead::Everything)
    }

    /// [`DebugInfo::load`] for a known set of addresses (as stated in the file): compressed
    /// DWARF is decompressed only where their units lie. Other addresses may find less.
    pub(crate) fn load_for(path: &Path, probes: &[u64]) -> Option<Self> {
        Self::open(path, DwarfRead::For(probes))
    }

    /// The module's symbol tables alone, for [`DebugInfo::symbol_names`]: none of its DWARF
    /// is read (compressed, even the sections every lookup needs would be decompressed).
    pub(crate) fn load_symbols(path: &Path) -> Option<Self> {
        Self::open(path, DwarfRead::Nothing)
    }

    fn open(path: &Path, read: DwarfRead) -> Option<Self> {
        let mut binary = Storage::open(path).filter(|_| has_headroom())?;
        let object = object::File::parse(binary.bytes()).ok()?;
        let mut info = DebugInfo {
            dwarf: None,
            symbols: None,
            named: HashMap::new(),
            objects: Vec::new(),
            storage: Vec::new(),
        };
        if has_section(&object, ".debug_info") {
            info.dwarf = read.load(&mut binary, &object);
        } else if let Some(mut debug) = separate_debug_file(path)
            .and_then(|p| Storage::open(&p))
            .filter(|_| has_headroom())
        {
            // addr2line's Loader does not follow debuglinks ("TODO: use debuglink and
            // debugaltlink" in its loader.rs); backtrace-rs gimli/elf.rs does it like this.
            if let Ok(object) = object::File::parse(debug.bytes()) {
                info.dwarf = read.load(&mut debug, &object);
                info.objects.push(object);
            }
            info.storage.push(debug);
        }
        info.objects.push(object);
        info.storage.push(binary);
        info.trim();
        Some(info)
    }

    /// Lets go of the mapped files' pages read so far (see [`Storage::trim`]).
    fn trim(&self) {
        self.storage.iter().for_each(Storage::trim);
    }

    /// The source locations of each of `probes`, in order (see [`DebugInfo::locate`]). The
    /// probes are resolved unit by unit, and each unit's context is dropped before the next
    /// is read, so that memory holds one unit's share at a time.
    pub(crate) fn locate_all(&mut self, probes: &[u64]) -> Vec<Vec<Location>> {
        let mut order: Vec<(Option<usize>, usize)> = probes
            .iter()
            .enumerate()
            .map(|(i, &probe)| {
                let DebugInfo { dwarf, storage, .. } = &mut *self;
                let trim = || storage.iter().for_each(Storage::trim);
                (dwarf.as_mut().and_then(|d| d.unit_of(probe, &trim)), i)
            })
            .collect();
        order.sort_unstable();
        self.trim();
        let mut found: Vec<Vec<Location>> = probes.iter().map(|_| Vec::new()).collect();
        for group in order.chunk_by(|a, b| a.0 == b.0) {
            let batch: Vec<u64> = group.iter().map(|&(_, i)| probes[i]).collect();
            let lean = match (&self.dwarf, group[0].0) {
                (Some(dwarf), Some(unit)) => {
                    let storage = &self.storage;
                    let trim = || storage.iter().for_each(Storage::trim);
                    dwarf.locate_lean(unit, &batch, &trim)
                }
                _ => None,
            };
            match lean {
                Some(locations) => {
                    for (&(_, i), locations) in group.iter().zip(locations) {
                        found[i] = locations;
                    }
                }
                None => {
                    self.read_lines_first(batch[0]);
                    for &(_, i) in group {
                        found[i] = self.dwarf_locations(probes[i]);
                    }
                    if let Some(dwarf) = &mut self.dwarf {
                        dwarf.release_units();
                    }
                }
            }
            self.trim();
        }
        let bare: Vec<usize> = (0..probes.len())
            .filter(|&i| outer_is_bare(&found[i]))
            .collect();
        let bare_probes: Vec<u64> = bare.iter().map(|&i| probes[i]).collect();
        let names = self.symbol_names(&bare_probes);
        for (&i, name) in bare.iter().zip(names) {
            name_outer(&mut found[i], name.as_deref().map(demangle_symbol));
        }
        found
    }

    /// The answers of [`DebugInfo::symbol_names`] so far, for [`DebugInfo::learn_names`] of
    /// another `DebugInfo` of the same file.
    pub(crate) fn into_names(self) -> HashMap<u64, Option<String>> {
        self.named
    }

    /// Takes answers of [`DebugInfo::symbol_names`] found by another `DebugInfo` of the same
    /// file.
    pub(crate) fn learn_names(&mut self, names: HashMap<u64, Option<String>>) {
        self.named.extend(names);
    }

    /// The symbol-table name (as written, mangled) of the symbol holding each of `probes`: the
    /// separate debug file's table first (it knows local functions). One pass over the tables
    /// for the probes not asked before; answers are kept for later calls.
    pub(crate) fn symbol_names(&mut self, probes: &[u64]) -> Vec<Option<String>> {
        let mut new: Vec<u64> = probes
            .iter()
            .copied()
            .filter(|p| !self.named.contains_key(p))
            .collect();
        new.sort_unstable();
        new.dedup();
        if !new.is_empty() {
            let mut names = vec![None; new.len()];
            for object in &self.objects {
                let storage = &self.storage;
                let trim = || storage.iter().for_each(Storage::trim);
                let found_here = super::symtab::containing(object, &new, &trim);
                for (name, here) in names.iter_mut().zip(found_here) {
                    *name = name.or(here);
                }
            }
            for (probe, name) in new.into_iter().zip(names) {
                self.named.insert(probe, name.map(str::to_owned));
            }
        }
        probes.iter().map(|p| self.named[p].clone()).collect()
    }

    /// Parses the line program of the unit holding `probe` before its functions, letting go
    /// of the pages read for the one before the other is read: a unit's memory peaks at the
    /// larger of the two rather than at both.
    fn read_lines_first(&mut self, probe: u64) {
        let DebugInfo { dwarf, storage, .. } = self;
        let trim = || storage.iter().for_each(Storage::trim);
        if let Some(context) = dwarf.as_mut().and_then(|d| d.context(probe, &trim)) {
            let _ = context.find_location(probe);
        }
        trim();
    }

    /// The source locations of `probe` (an address as stated in the file), innermost
    /// inlined function first and the function that owns the machine code last. Never empty:
    /// without debug info the one location has the symbol-table name, or no name at all.
    pub(crate) fn locate(&mut self, probe: u64) -> Vec<Location> {
        let mut locations = self.dwarf_locations(probe);
        if outer_is_bare(&locations) {
            let DebugInfo {
                symbols,
                objects,
                storage,
                ..
            } = self;
            let symbol = symbols
                .get_or_insert_with(|| {
                    let maps = objects.iter().map(|o| o.symbol_map()).collect();
                    // The tables were read whole; the names found are read again.
                    storage.iter().for_each(Storage::trim);
                    maps
                })
                .iter()
                .find_map(|map| map.containing(probe))
                .map(|symbol| demangle_symbol(symbol.name()));
            name_outer(&mut locations, symbol);
        }
        locations
    }

    /// What DWARF says of `probe`: [`DebugInfo::locate`] before the symbol table fills in.
    fn dwarf_locations(&mut self, probe: u64) -> Vec<Location> {
        let mut locations = Vec::new();
        let DebugInfo { dwarf, storage, .. } = self;
        let trim = || storage.iter().for_each(Storage::trim);
        let context = dwarf.as_mut().and_then(|d| d.context(probe, &trim));
        let frames = context.map(|c| LookupResult::skip_all_loads(c.find_frames(probe)));
        if let Some(Ok(mut frames)) = frames {
            while let Ok(Some(frame)) = frames.next() {
                let function = frame
                    .function
                    .as_ref()
                    .and_then(|name| Some(demangle(name.raw_name().ok()?, name.language)));
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
        locations
    }
}

/// Whether the symbol table should name the function that owns the machine code.
/// DWARF names come first because they match what was compiled; the symbol table fills in
/// where there is no DWARF function (assembly, stripped modules). A debug file's `.symtab`
/// knows the local functions that `.dynsym` lacks, so it goes first. Only a symbol whose
/// size covers the address answers: a function missing from `.dynsym` stays unnamed
/// (module+offset) instead of borrowing the name of the exported function below it, as GNU
/// addr2line's nearest-symbol rule does. g++ gives functions of internal linkage (anonymous
/// namespaces, lambdas, destructors of local classes) no DW_AT_linkage_name, so DWARF names
/// them bare ("spawn"): the symbol's demangled name, qualified and with parameters, is what
/// a reader wants then. (A name DWARF qualified has "::", or parameters where it came
/// demangled from a linkage name at namespace scope; a bare one of a namespace member has
/// neither, and `main` is the program's own, at namespace scope by the language's rules: the
/// symbol table, a pass over all of it, would say the same.)
fn outer_is_bare(locations: &[Location]) -> bool {
    locations.last().is_none_or(|outer| {
        outer.function.as_deref().is_none_or(|name| {
            let with_parameters = name.contains('(') && !name.starts_with("operator");
            !name.contains("::") && !with_parameters && name != "main"
        })
    })
}

/// Gives the outer location the symbol table's name, if it has one (a location of its own
/// when DWARF had none): never empty afterwards.
fn name_outer(locations: &mut Vec<Location>, symbol: Option<String>) {
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
