//! A batch of addresses resolved in one unit without building its tables: one run of its line program keeping the rows in effect at those addresses, one walk over its entries keeping the functions that hold them, pages let go on the way.
//!
//! addr2line's context builds the unit's whole line table (24 bytes a row) and reads every
//! entry of the unit in one go; for gtest-all.cc, measured in the process, that is 0.7 MiB of
//! rows and 4 MiB of `.debug_info` pages resident at once. The answers here are addr2line's
//! own (same rows, same function search, same names): its lookups are followed step by step,
//! over what the probes need.

use std::cmp::Ordering;

use addr2line::gimli::{self, AttributeValue, UnitRef};

use super::line_program::{self, LineRow, Run};
use super::resolver::{Location, Slice};

/// Rows or entries read between two calls of `trim`.
const TRIM_EVERY: usize = 65536;

/// The source locations of each of `probes` (as [`super::resolver::DebugInfo::locate`] has
/// them before the symbol table fills in), or `None` when something does not read as
/// expected (the caller then builds addr2line's context, which reports what it can).
pub(super) fn locate_in_unit(
    unit: UnitRef<'_, Slice>,
    probes: &[u64],
    trim: &dyn Fn(),
) -> Option<Vec<Vec<Location>>> {
    let (lang, covered) = root(unit)?;
    let mut sorted = probes.to_vec();
    sorted.sort_unstable();
    let scope = Scope {
        sorted: &sorted,
        trim,
        read: std::cell::Cell::new(0),
    };
    let lines = Lines::read(unit, probes, &scope)?;
    let mut functions = Functions::read(unit, &scope, Subtrees::OfHolders)?;
    let in_code = |probe: &u64| covered.iter().any(|r| r.begin <= *probe && *probe < r.end);
    if sorted
        .iter()
        .filter(|p| in_code(p))
        .any(|&p| functions.find(p).is_none())
    {
        // Code below an idle function's entry (a local class's member, a lambda) or none.
        functions = Functions::read(unit, &scope, Subtrees::All)?;
    }
    trim();
    let mut found = Vec::with_capacity(probes.len());
    // The functions read so far, by entry: probes often share one.
    let mut read: Vec<(gimli::UnitOffset, Function)> = Vec::new();
    for (at, &probe) in probes.iter().enumerate() {
        if !in_code(&probe) {
            // addr2line's context over the unit alone does not look outside its ranges.
            found.push(Vec::new());
            continue;
        }
        let location = lines.location(unit, at)?;
        let Some(function) = functions.find(probe) else {
            found.push(location.into_iter().collect());
            continue;
        };
        let at = match read.iter().position(|(offset, _)| *offset == function) {
            Some(at) => at,
            None => {
                read.push((function, Function::read(unit, function, &scope)?));
                read.len() - 1
            }
        };
        let function = &read[at].1;
        let name = |raw: Option<Slice>| {
            let raw = raw?.to_string_lossy();
            Some(super::names::demangle(raw, lang))
        };
        let mut frames = Vec::new();
        let mut location = location;
        for inlined in function.inlined_at(probe).into_iter().rev() {
            let mut frame = location.take().unwrap_or_default();
            frame.function = name(inlined.name);
            frames.push(frame);
            location = Some(Location {
                function: None,
                file: match inlined.call_file {
                    Some(index) => lines.file(unit, index)?,
                    None => None,
                },
                line: inlined.call_line,
            });
        }
        let mut outer = location.unwrap_or_default();
        outer.function = name(function.name);
        frames.push(outer);
        found.push(frames);
    }
    Some(found)
}

/// The unit's `DW_AT_language` (addr2line picks the demangler with it) and its address
/// ranges; `None` when it states none (addr2line would take them from the line program).
fn root(unit: UnitRef<'_, Slice>) -> Option<(Option<gimli::DwLang>, Vec<gimli::Range>)> {
    let mut entries = unit.entries_raw(None).ok()?;
    let abbrev = entries.read_abbreviation().ok()??;
    let mut lang = None;
    let mut ranges = Ranges::default();
    for spec in abbrev.attributes() {
        let attr = entries.read_attribute(*spec).ok()?;
        ranges.note(unit, &attr)?;
        if let (gimli::DW_AT_language, AttributeValue::Language(value)) =
            (attr.name(), attr.value())
        {
            lang = Some(value);
        }
    }
    let mut covered = Vec::new();
    ranges
        .each(unit, |range| covered.push(range))?
        .then_some((lang, covered))
}

/// One line-table row: a file index and a line (0: none).
#[derive(Clone, Copy)]
struct Row {
    file: u64,
    line: u32,
}

/// A sequence of the line program and the rows in effect at the probes it holds.
struct Sequence {
    start: u64,
    end: u64,
    /// `(probe index, row)`, for the probes in `start..end`.
    rows: Box<[(usize, Row)]>,
}

/// The rows of a line program as they come, kept where they are in effect at a probe.
struct RowsAtProbes<'p> {
    probes: &'p [u64],
    /// Indexes of `probes`, by address, and those addresses.
    order: Vec<usize>,
    sorted: Vec<u64>,
    sequences: Vec<Sequence>,
    /// The rows kept in the sequence being read, and its start.
    rows: Vec<(usize, Row)>,
    start: Option<u64>,
    /// The last row of the sequence being read, its address, and the first probe (in `sorted`)
    /// at or above that address: addresses grow within a sequence, so each row moves it on
    /// instead of searching.
    last: Option<(u64, Row)>,
    next_probe: usize,
}

impl<'p> RowsAtProbes<'p> {
    fn new(probes: &'p [u64]) -> Self {
        let mut order: Vec<usize> = (0..probes.len()).collect();
        order.sort_unstable_by_key(|&i| probes[i]);
        let sorted = order.iter().map(|&i| probes[i]).collect();
        RowsAtProbes {
            probes,
            order,
            sorted,
            sequences: Vec::new(),
            rows: Vec::new(),
            start: None,
            last: None,
            next_probe: 0,
        }
    }

    #[inline]
    fn row(&mut self, row: LineRow) {
        let address = row.address;
        match self.last {
            Some((at, previous)) if at < address => {
                // The probes in `at..address` have the previous row.
                while self
                    .sorted
                    .get(self.next_probe)
                    .is_some_and(|&p| p < address)
                {
                    self.rows.push((self.order[self.next_probe], previous));
                    self.next_probe += 1;
                }
            }
            Some((at, _)) if at == address => {}
            // A sequence's first row (or an address going back, which no compiler writes).
            _ => self.next_probe = self.sorted.partition_point(|&p| p < address),
        }
        if row.end_sequence {
            if let Some(start) = self.start.take().filter(|&start| start < address) {
                self.sequences.push(Sequence {
                    start,
                    end: address,
                    rows: std::mem::take(&mut self.rows).into_boxed_slice(),
                });
            }
            self.rows.clear();
            self.last = None;
            return;
        }
        self.start.get_or_insert(address);
        let kept = Row {
            file: row.file,
            line: row.line as u32,
        };
        self.last = Some((address, kept));
    }

    /// The row in effect at each probe, found by its sequence.
    fn found(mut self) -> Vec<Option<Row>> {
        self.sequences
            .sort_unstable_by_key(|sequence| sequence.start);
        let mut found = vec![None; self.probes.len()];
        for (i, &probe) in self.probes.iter().enumerate() {
            let at = self
                .sequences
                .binary_search_by(|sequence| range_order(sequence.start, sequence.end, probe));
            if let Ok(at) = at {
                found[i] = self.sequences[at]
                    .rows
                    .iter()
                    .find(|r| r.0 == i)
                    .map(|r| r.1);
            }
        }
        found
    }
}

/// The rows in effect at the probes, found through the sequences as addr2line finds them.
struct Lines {
    found: Vec<Option<Row>>,
    header: Option<gimli::LineProgramHeader<Slice>>,
}

impl Lines {
    /// Runs the unit's line program once ([`super::line_program`]; gimli's rows where that
    /// leaves the program to gimli). Rows at one address fold into the last of them, and a
    /// probe takes the last row at or below it in its sequence, as addr2line's table.
    fn read(unit: UnitRef<'_, Slice>, probes: &[u64], scope: &Scope<'_>) -> Option<Lines> {
        let Some(program) = unit.line_program.clone() else {
            return Some(Lines {
                found: vec![None; probes.len()],
                header: None,
            });
        };
        let mut rows = RowsAtProbes::new(probes);
        let header = match line_program::for_each_row(program.header(), |row| {
            scope.count();
            rows.row(row);
        }) {
            Ok(()) => program.header().clone(),
            Err(Run::Malformed) => return None,
            Err(Run::Unsupported) => {
                rows = RowsAtProbes::new(probes);
                let mut state = program.rows();
                while let Some((_, row)) = state.next_row().ok()? {
                    scope.count();
                    rows.row(LineRow::of(row));
                }
                state.header().clone()
            }
        };
        Some(Lines {
            found: rows.found(),
            header: Some(header),
        })
    }

    /// The location of the probe at `at` in the batch, without a function (`Some(None)`:
    /// none; `None`: its file's name does not read).
    fn location(&self, unit: UnitRef<'_, Slice>, at: usize) -> Option<Option<Location>> {
        let Some(row) = self.found[at] else {
            return Some(None);
        };
        Some(Some(Location {
            function: None,
            file: self.file(unit, row.file)?,
            line: row.line,
        }))
    }

    /// The path of file `index`, as addr2line renders it (the unit's folder, the file's
    /// folder, its name; a later absolute part replaces what is before it).
    /// `Some(None)` for an index past the file table; `None` when a name does not read.
    fn file(&self, unit: UnitRef<'_, Slice>, index: u64) -> Option<Option<String>> {
        let Some(header) = self.header.as_ref() else {
            return Some(None);
        };
        let Some(file) = header.file(index) else {
            // DWARF 4 has no file 0; addr2line names it "".
            return Some((index == 0).then(String::new));
        };
        let text = |value| -> Option<String> {
            Some(unit.attr_string(value).ok()?.to_string_lossy().into_owned())
        };
        let mut path = match unit.comp_dir {
            Some(dir) => dir.to_string_lossy().into_owned(),
            None => String::new(),
        };
        if file.directory_index() != 0 {
            if let Some(directory) = file.directory(header) {
                push_path(&mut path, &text(directory)?);
            }
        }
        push_path(&mut path, &text(file.path_name())?);
        Some(Some(path))
    }
}

/// addr2line's `path_push`.
fn push_path(path: &mut String, part: &str) {
    let rooted = |p: &str| {
        p.starts_with('/')
            || p.starts_with('\\')
            || p.get(1..3) == Some(":/")
            || p.get(1..3) == Some(":\\")
    };
    if rooted(part) {
        *path = part.to_owned();
        return;
    }
    let separator = if path.starts_with('\\') || path.get(1..3) == Some(":\\") {
        '\\'
    } else {
        '/'
    };
    if !path.is_empty() && !path.ends_with(separator) {
        path.push(separator);
    }
    path.push_str(part);
}

/// The subprograms whose ranges hold a probe: their entries and those ranges.
struct Functions {
    /// Entry offsets of the subprograms kept.
    entries: Vec<gimli::UnitOffset>,
    /// `(range, index in entries)`, sorted by start.
    addresses: Vec<(gimli::Range, usize)>,
}

/// Which subprograms' subtrees [`Functions::read`] walks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Subtrees {
    /// Only those of subprograms holding a probe: a function's own code is never below
    /// another's entry, except a local class's members and lambdas (below their function's).
    OfHolders,
    /// Every one, as addr2line does.
    All,
}

impl Functions {
    /// Walks the unit's entries once, reading the ranges of every subprogram it meets (at any
    /// depth, as addr2line does; `subtrees` says below which) and skipping everything else;
    /// keeps those that hold a probe (of `sorted`). addr2line keeps them all, and where ranges
    /// overlap its search may settle on another one of those holding the probe; compilers do
    /// not emit such overlaps.
    fn read(unit: UnitRef<'_, Slice>, scope: &Scope<'_>, subtrees: Subtrees) -> Option<Functions> {
        let mut entries = Vec::new();
        let mut addresses = Vec::new();
        let mut walk = unit.entries_raw(None).ok()?;
        // The depth of the next entry is `base + walk.next_depth()` (a jump starts a new walk),
        // and that of the outermost subprogram around it, if any.
        let mut base = 0;
        let mut in_function: Option<isize> = None;
        while !walk.is_empty() {
            scope.count();
            let offset = walk.next_offset();
            let depth = base + walk.next_depth();
            if in_function.is_some_and(|outer| depth <= outer) {
                in_function = None;
            }
            let Some(abbrev) = walk.read_abbreviation().ok()? else {
                continue;
            };
            if abbrev.tag() == gimli::DW_TAG_subprogram && in_function.is_none() {
                in_function = Some(depth);
            }
            if abbrev.tag() != gimli::DW_TAG_subprogram {
                if !holds_no_code(abbrev, in_function.is_some()) {
                    walk.skip_attributes(abbrev.attributes()).ok()?;
                } else if let Some(next) = sibling(&mut walk, abbrev, offset)? {
                    walk = unit.entries_raw(Some(next)).ok()?;
                    base = depth;
                }
                continue;
            }
            // Only the address attributes and the sibling are read; the runs of others between
            // them are skipped (by their forms' sizes, where gimli knows them), not decoded.
            let mut ranges = Ranges::default();
            let mut next = None;
            let specs = abbrev.attributes();
            let mut unread = 0;
            for (at, spec) in specs.iter().enumerate() {
                if let gimli::DW_AT_low_pc
                | gimli::DW_AT_high_pc
                | gimli::DW_AT_ranges
                | gimli::DW_AT_sibling = spec.name()
                {
                    walk.skip_attributes(&specs[unread..at]).ok()?;
                    let attr = walk.read_attribute(*spec).ok()?;
                    ranges.note(unit, &attr)?;
                    next = next.or(forward_sibling(&attr, offset));
                    unread = at + 1;
                }
            }
            walk.skip_attributes(&specs[unread..]).ok()?;
            let index = entries.len();
            let mut kept = false;
            ranges.each(unit, |range| {
                if holds_probe(scope.sorted, &range) {
                    addresses.push((range, index));
                    kept = true;
                }
            })?;
            if kept {
                entries.push(offset);
            } else if let Some(next) = next.filter(|_| subtrees == Subtrees::OfHolders) {
                walk = unit.entries_raw(Some(next)).ok()?;
                base = depth;
            }
        }
        addresses.sort_unstable_by_key(|address: &(gimli::Range, usize)| address.0.begin);
        Some(Functions { entries, addresses })
    }

    /// The entry of the function holding `probe`, found as addr2line finds it.
    fn find(&self, probe: u64) -> Option<gimli::UnitOffset> {
        let at = self
            .addresses
            .binary_search_by(|(range, _)| range_order(range.begin, range.end, probe))
            .ok()?;
        Some(self.entries[self.addresses[at].1])
    }
}

/// Whether no function's code lies among the entries below an entry of this kind (inside a
/// function's entry or not): an inlined call holds its parameters, blocks, variables and the
/// calls inlined into it (a local class of the inlined function lies in that function's own
/// entry), a call site its parameters, and a type outside any function its members'
/// declarations (their code lies at namespace scope, naming the declaration). Code may lie
/// below a type inside a function: g++ puts a local class's member functions there.
fn holds_no_code(abbrev: &gimli::Abbreviation, in_function: bool) -> bool {
    abbrev.has_children()
        && match abbrev.tag() {
            gimli::DW_TAG_inlined_subroutine
            | gimli::DW_TAG_call_site
            | gimli::DW_TAG_GNU_call_site => true,
            gimli::DW_TAG_class_type
            | gimli::DW_TAG_structure_type
            | gimli::DW_TAG_union_type
            | gimli::DW_TAG_enumeration_type => !in_function,
            _ => false,
        }
}

/// Reads the attributes of the entry at `offset` (whose abbreviation was just read) as far as
/// its `DW_AT_sibling`: the offset of its next sibling, where that states one past it
/// (`Some(None)` if not, all attributes read). The walk is to go on from that sibling.
fn sibling(
    walk: &mut gimli::EntriesRaw<'_, Slice>,
    abbrev: &gimli::Abbreviation,
    offset: gimli::UnitOffset,
) -> Option<Option<gimli::UnitOffset>> {
    let specs = abbrev.attributes();
    let Some(at) = specs
        .iter()
        .position(|spec| spec.name() == gimli::DW_AT_sibling)
    else {
        walk.skip_attributes(specs).ok()?;
        return Some(None);
    };
    walk.skip_attributes(&specs[..at]).ok()?;
    let next = forward_sibling(&walk.read_attribute(specs[at]).ok()?, offset);
    if next.is_none() {
        walk.skip_attributes(&specs[at + 1..]).ok()?;
    }
    Some(next)
}

/// The sibling `attr` states of the entry at `offset`, if it is one past it.
fn forward_sibling(
    attr: &gimli::Attribute<Slice>,
    offset: gimli::UnitOffset,
) -> Option<gimli::UnitOffset> {
    match (attr.name(), attr.value()) {
        (gimli::DW_AT_sibling, AttributeValue::UnitRef(to)) if to.0 > offset.0 => Some(to),
        _ => None,
    }
}

/// Where the range `begin..end` lies against `probe`, for a binary search of sorted, disjoint
/// ranges: `Equal` when it holds the probe.
fn range_order(begin: u64, end: u64, probe: u64) -> Ordering {
    if probe < begin {
        Ordering::Greater
    } else if probe >= end {
        Ordering::Less
    } else {
        Ordering::Equal
    }
}

/// Whether some probe of `sorted` lies in `range`.
fn holds_probe(sorted: &[u64], range: &gimli::Range) -> bool {
    let first = sorted.partition_point(|&p| p < range.begin);
    sorted.get(first).is_some_and(|&p| p < range.end)
}

/// What the walks over a unit keep (what holds a probe) and let go of (the pages read).
struct Scope<'a> {
    /// The batch's probes, sorted.
    sorted: &'a [u64],
    trim: &'a dyn Fn(),
    read: std::cell::Cell<usize>,
}

impl Scope<'_> {
    /// Counts one entry read, letting go of the pages read so far now and then.
    fn count(&self) {
        self.read.set(self.read.get() + 1);
        if self.read.get().is_multiple_of(TRIM_EVERY) {
            (self.trim)();
        }
    }
}

/// The address attributes of an entry, as addr2line's `RangeAttributes`.
#[derive(Default)]
struct Ranges {
    low: Option<u64>,
    high: Option<u64>,
    size: Option<u64>,
    list: Option<gimli::RangeListsOffset>,
}

impl Ranges {
    /// Takes `attr` if it is one of the address attributes; `None` if it does not read.
    fn note(&mut self, unit: UnitRef<'_, Slice>, attr: &gimli::Attribute<Slice>) -> Option<()> {
        match (attr.name(), attr.value()) {
            (gimli::DW_AT_low_pc, AttributeValue::Addr(at)) => self.low = Some(at),
            (gimli::DW_AT_low_pc, AttributeValue::DebugAddrIndex(index)) => {
                self.low = Some(unit.address(index).ok()?);
            }
            (gimli::DW_AT_high_pc, AttributeValue::Addr(at)) => self.high = Some(at),
            (gimli::DW_AT_high_pc, AttributeValue::DebugAddrIndex(index)) => {
                self.high = Some(unit.address(index).ok()?);
            }
            (gimli::DW_AT_high_pc, AttributeValue::Udata(size)) => self.size = Some(size),
            (gimli::DW_AT_ranges, value) => self.list = unit.attr_ranges_offset(value).ok()?,
            _ => {}
        }
        Some(())
    }

    /// Calls `f` with each non-empty range; whether there was one.
    fn each(&self, unit: UnitRef<'_, Slice>, mut f: impl FnMut(gimli::Range)) -> Option<bool> {
        let mut any = false;
        let mut add = |range: gimli::Range| {
            if range.begin < range.end {
                f(range);
                any = true;
            }
        };
        if let Some(list) = self.list {
            let mut list = unit.ranges(list).ok()?;
            while let Some(range) = list.next().ok()? {
                add(range);
            }
        } else if let (Some(begin), Some(end)) = (self.low, self.high) {
            add(gimli::Range { begin, end });
        } else if let (Some(begin), Some(size)) = (self.low, self.size) {
            add(gimli::Range {
                begin,
                end: begin.wrapping_add(size),
            });
        }
        Some(any)
    }
}

/// A function inlined at a probe: its name and where it was called from.
struct Inlined {
    name: Option<Slice>,
    call_file: Option<u64>,
    call_line: u32,
}

/// One function's name and the functions inlined into it, read from its entry's subtree.
struct Function {
    name: Option<Slice>,
    inlined: Vec<Inlined>,
    /// `(range, call depth, index in inlined)`, sorted by depth then start.
    addresses: Vec<(gimli::Range, usize, usize)>,
}

impl Function {
    /// Reads the subprogram at `offset` and those of its inlined subroutines (not those of
    /// nested subprograms) whose ranges hold a probe, as addr2line's `Function::parse` reads
    /// them all: a test body of generated code inlines tens of thousands.
    fn read(
        unit: UnitRef<'_, Slice>,
        offset: gimli::UnitOffset,
        scope: &Scope<'_>,
    ) -> Option<Function> {
        let mut walk = unit.entries_raw(Some(offset)).ok()?;
        let depth = walk.next_depth();
        let abbrev = walk.read_abbreviation().ok()??;
        let mut name = None;
        for spec in abbrev.attributes() {
            let attr = walk.read_attribute(*spec).ok()?;
            note_name(unit, &attr, &mut name)?;
        }
        let mut function = Function {
            name,
            inlined: Vec::new(),
            addresses: Vec::new(),
        };
        function.read_children(unit, &mut walk, depth, 0, scope)?;
        function
            .addresses
            .sort_unstable_by_key(|&(range, depth, _)| (depth, range.begin));
        Some(function)
    }

    fn read_children(
        &mut self,
        unit: UnitRef<'_, Slice>,
        walk: &mut gimli::EntriesRaw<'_, Slice>,
        depth: isize,
        call_depth: usize,
        scope: &Scope<'_>,
    ) -> Option<()> {
        loop {
            scope.count();
            let next_depth = walk.next_depth();
            if next_depth <= depth {
                return Some(());
            }
            let Some(abbrev) = walk.read_abbreviation().ok()? else {
                continue;
            };
            match abbrev.tag() {
                gimli::DW_TAG_subprogram => {
                    walk.skip_attributes(abbrev.attributes()).ok()?;
                    while walk.next_depth() > next_depth {
                        if let Some(abbrev) = walk.read_abbreviation().ok()? {
                            walk.skip_attributes(abbrev.attributes()).ok()?;
                        }
                    }
                }
                gimli::DW_TAG_inlined_subroutine => {
                    let mut ranges = Ranges::default();
                    let mut inlined = Inlined {
                        name: None,
                        call_file: None,
                        call_line: 0,
                    };
                    // Names are looked up (through other entries) only for what is kept.
                    let mut naming = Vec::new();
                    for spec in abbrev.attributes() {
                        let attr = walk.read_attribute(*spec).ok()?;
                        ranges.note(unit, &attr)?;
                        match (attr.name(), attr.value()) {
                            (gimli::DW_AT_call_file, AttributeValue::FileIndex(index))
                                if index > 0 || unit.header.version() >= 5 =>
                            {
                                inlined.call_file = Some(index);
                            }
                            (gimli::DW_AT_call_line, _) => {
                                inlined.call_line = attr.udata_value().unwrap_or(0) as u32;
                            }
                            (
                                gimli::DW_AT_linkage_name
                                | gimli::DW_AT_MIPS_linkage_name
                                | gimli::DW_AT_name
                                | gimli::DW_AT_abstract_origin
                                | gimli::DW_AT_specification,
                                _,
                            ) => naming.push(attr),
                            _ => {}
                        }
                    }
                    let index = self.inlined.len();
                    let addresses = &mut self.addresses;
                    let mut kept = false;
                    ranges.each(unit, |range| {
                        if holds_probe(scope.sorted, &range) {
                            addresses.push((range, call_depth, index));
                            kept = true;
                        }
                    })?;
                    if kept {
                        for attr in &naming {
                            note_name(unit, attr, &mut inlined.name)?;
                        }
                        self.inlined.push(inlined);
                    }
                    self.read_children(unit, walk, next_depth, call_depth + 1, scope)?;
                }
                _ => walk.skip_attributes(abbrev.attributes()).ok()?,
            }
        }
    }

    /// The functions inlined at `probe`, outermost first (addr2line's search, depth by depth).
    fn inlined_at(&self, probe: u64) -> Vec<&Inlined> {
        let mut found = Vec::new();
        let mut rest = &self.addresses[..];
        loop {
            let depth = found.len();
            let at = rest.binary_search_by(|(range, call_depth, _)| {
                call_depth
                    .cmp(&depth)
                    .then_with(|| range_order(range.begin, range.end, probe))
            });
            let Ok(at) = at else {
                return found;
            };
            found.push(&self.inlined[rest[at].2]);
            rest = &rest[at + 1..];
        }
    }
}

/// Takes a name from `attr` as addr2line does: the linkage name first, else the name, else
/// the name of the entry an abstract origin or specification points to.
fn note_name(
    unit: UnitRef<'_, Slice>,
    attr: &gimli::Attribute<Slice>,
    name: &mut Option<Slice>,
) -> Option<()> {
    match attr.name() {
        gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
            if let Ok(value) = unit.attr_string(attr.value()) {
                *name = Some(value);
            }
        }
        gimli::DW_AT_name if name.is_none() => *name = unit.attr_string(attr.value()).ok(),
        gimli::DW_AT_abstract_origin | gimli::DW_AT_specification if name.is_none() => {
            *name = referred_name(unit, attr.value(), 16)?;
        }
        _ => {}
    }
    Some(())
}

/// The name of the entry `value` refers to within the unit (addr2line's `name_attr`, which
/// gives up after `depth` references); `None` when an entry does not read.
fn referred_name(
    unit: UnitRef<'_, Slice>,
    value: AttributeValue<Slice>,
    depth: usize,
) -> Option<Option<Slice>> {
    let AttributeValue::UnitRef(offset) = value else {
        return Some(None);
    };
    if depth == 0 {
        return Some(None);
    }
    let mut walk = unit.entries_raw(Some(offset)).ok()?;
    let abbrev = walk.read_abbreviation().ok()??;
    let mut name = None;
    let mut next = None;
    for spec in abbrev.attributes() {
        let attr = walk.read_attribute(*spec).ok()?;
        match attr.name() {
            gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                if let Ok(value) = unit.attr_string(attr.value()) {
                    return Some(Some(value));
                }
            }
            gimli::DW_AT_name => {
                if let Ok(value) = unit.attr_string(attr.value()) {
                    name = Some(value);
                }
            }
            gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => next = Some(attr.value()),
            _ => {}
        }
    }
    match (name, next) {
        (Some(name), _) => Some(Some(name)),
        (None, Some(next)) => referred_name(unit, next, depth - 1),
        (None, None) => Some(None),
    }
}
