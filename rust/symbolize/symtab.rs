//! The symbol-table names of a batch of addresses, found in one pass over the table: the answers of `object`'s `SymbolMap::containing` without building the map.
//!
//! A map of yaml-cpp's test program is 2.8 MB of heap built to name a few frames; here a pass
//! keeps, between each two neighbouring addresses, the best symbol and the highest and lowest
//! entries, and lets go of the table's pages as it goes.

use object::read::elf::Sym;
use object::{
    Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, SymbolIndex, SymbolKind, SymbolScope,
};

/// Symbols read between two calls of `trim`.
const TRIM_EVERY: usize = 4096;

/// An entry of the map as `object` orders entries at one address: lower is better.
type Rank = (u32, usize);

/// What the pass keeps of the entries between two neighbouring probes (sorted), above the
/// lower one and at or below the upper one.
#[derive(Clone, Copy, Default)]
struct Gap {
    /// The best named symbol at the highest address that has one: its address, rank, size
    /// and index (its name is read once the pass is over, for the symbols that answer).
    named: Option<(u64, Rank, u64, SymbolIndex)>,
    /// The highest and the lowest address of any entry (section ends included).
    highest: Option<u64>,
    lowest: Option<u64>,
}

impl Gap {
    /// Whether a named symbol at `address` of `rank` would be kept instead of the one kept.
    fn better(&self, address: u64, rank: Rank) -> bool {
        self.named
            .is_none_or(|(at, best, ..)| address > at || (address == at && rank < best))
    }

    /// Whether an entry at `address` of `rank` changes anything the gap keeps.
    fn changed_by(&self, address: u64, rank: Rank) -> bool {
        self.outside(address) || self.better(address, rank)
    }

    /// Whether an entry at `address` could change what the gap keeps, of whatever kind and
    /// rank: it lies outside the entries kept, or not below the named one.
    fn could_change(&self, address: u64) -> bool {
        self.outside(address) || self.named.is_none_or(|(at, ..)| address >= at)
    }

    fn outside(&self, address: u64) -> bool {
        self.highest.is_none_or(|h| address > h) || self.lowest.is_none_or(|l| address < l)
    }
}

/// For each of `probes`, the name of the symbol of `object` whose range holds it, as
/// `object.symbol_map().containing(probe)` would answer (its `.symtab`, else `.dynsym`; a
/// symbol without size reaches to the next entry).
pub(super) fn containing<'data>(
    object: &object::File<'data>,
    probes: &[u64],
    trim: &dyn Fn(),
) -> Vec<Option<&'data str>> {
    match object {
        // Typed for the one format that matters: `object::File`'s symbols dispatch over every
        // format at each call, a third of the pass (yaml-cpp's tests: 1.3 -> 0.9 ms).
        object::File::Elf64(elf) => containing_in(elf, probes, trim),
        _ => containing_in(object, probes, trim),
    }
}

/// [`containing`] over one format's symbols: its `.symtab`, else its `.dynsym`.
fn containing_in<'data: 'file, 'file, O: Object<'data>>(
    object: &'file O,
    probes: &[u64],
    trim: &dyn Fn(),
) -> Vec<Option<&'data str>>
where
    O::SymbolTable<'file>: ObjectSymbolTable<'data, Symbol: HasName>,
{
    let Some(table) = object
        .symbol_table()
        .or_else(|| object.dynamic_symbol_table())
    else {
        return vec![None; probes.len()];
    };
    // Section ends bound the guessed size of a symbol without one.
    let section_ends = object
        .sections()
        .map(|section| section.address().saturating_add(section.size()));
    in_table(table, section_ends, probes, trim)
}

/// Whether a symbol has a name, told without reading it (a search for its end in the string
/// table, and a check of its UTF-8, for each of thousands of long C++ names).
trait HasName {
    fn has_name(&self) -> bool;
}

impl HasName for object::read::elf::ElfSymbol64<'_, '_> {
    /// Index 0 of the string table is the empty name; ELF tools write no other.
    fn has_name(&self) -> bool {
        self.elf_symbol().st_name(self.endian()) != 0
    }
}

impl HasName for object::Symbol<'_, '_> {
    fn has_name(&self) -> bool {
        self.name_bytes().is_ok_and(|name| !name.is_empty())
    }
}

/// [`containing`] over one symbol table.
fn in_table<'data, T: ObjectSymbolTable<'data, Symbol: HasName>>(
    table: T,
    section_ends: impl Iterator<Item = u64>,
    probes: &[u64],
    trim: &dyn Fn(),
) -> Vec<Option<&'data str>> {
    let mut sorted = probes.to_vec();
    sorted.sort_unstable();
    let mut gaps = vec![Gap::default(); sorted.len() + 1];
    let gap_of = |address: u64| sorted.partition_point(|&p| p < address);
    let note = |gap: &mut Gap, address: u64, named: Option<(Rank, u64, SymbolIndex)>| {
        gap.highest = Some(gap.highest.map_or(address, |h| h.max(address)));
        gap.lowest = Some(gap.lowest.map_or(address, |l| l.min(address)));
        if let Some((rank, size, index)) = named {
            if gap.better(address, rank) {
                gap.named = Some((address, rank, size, index));
            }
        }
    };
    for (read, symbol) in table.symbols().enumerate() {
        if read % TRIM_EVERY == TRIM_EVERY - 1 {
            trim();
        }
        // Most entries land inside what their gap keeps and below its named one: decided by
        // the address alone, before the entry's kind and rank are read (a third of the pass).
        let address = symbol.address();
        let gap = &mut gaps[gap_of(address)];
        if !gap.could_change(address) || !symbol.is_definition() {
            continue;
        }
        let mut priority = match symbol.kind() {
            SymbolKind::Text | SymbolKind::Data => 0,
            SymbolKind::Unknown => 1,
            _ => continue,
        };
        // `object`'s order: known kind, then a size, then the widest visibility, then the
        // later symbol.
        priority = (priority * 2) * 2 + u32::from(symbol.size() == 0);
        priority = priority * 4
            + match symbol.scope() {
                SymbolScope::Unknown => 3,
                SymbolScope::Compilation => 2,
                SymbolScope::Linkage => 1,
                SymbolScope::Dynamic => 0,
            };
        let rank = (priority, usize::MAX - symbol.index().0);
        if !gap.changed_by(address, rank) || !symbol.has_name() {
            continue;
        }
        note(gap, address, Some((rank, symbol.size(), symbol.index())));
    }
    for end in section_ends {
        note(&mut gaps[gap_of(end)], end, None);
    }
    trim();
    // Per sorted probe: the best symbol at the highest named address at or below it, the
    // highest entry at or below it and the lowest above it.
    let mut above = vec![None; sorted.len()];
    let mut lowest = gaps[sorted.len()].lowest;
    for at in (0..sorted.len()).rev() {
        above[at] = lowest;
        lowest = gaps[at].lowest.or(lowest);
    }
    let (mut named, mut highest) = (None, None);
    let mut answers = Vec::with_capacity(sorted.len());
    for (at, &probe) in sorted.iter().enumerate() {
        named = gaps[at].named.or(named);
        highest = gaps[at].highest.or(highest);
        answers.push(named.and_then(|(address, _, size, index)| {
            // A section end above the symbol ends it; a symbol without size reaches to the
            // next entry (or, the last of all, holds everything above it).
            let size = match (size, highest) {
                (0, Some(top)) if top > address => top - address,
                (0, _) => above[at].map_or(0, |above: u64| above - address),
                (size, _) => size,
            };
            (size == 0 || probe - address < size).then_some(index)
        }));
    }
    // A name that does not read as UTF-8 leaves its probes unnamed (`object`'s map leaves such
    // a symbol out, naming them by the one below it; no toolchain writes one).
    let answers: Vec<Option<&'data str>> = answers
        .into_iter()
        .map(|index| table.symbol_by_index(index?).ok()?.name().ok())
        .collect();
    probes
        .iter()
        .map(|probe| answers[sorted.partition_point(|p| p < probe)])
        .collect()
}
