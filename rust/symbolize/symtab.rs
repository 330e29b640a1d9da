//! The symbol-table names of a batch of addresses, found in one pass over the table: the answers of `object`'s `SymbolMap::containing` without building the map.
//!
//! A map of yaml-cpp's test program is 2.8 MB of heap built to name a few frames; here a pass
//! keeps, between each two neighbouring addresses, the best symbol and the highest and lowest
//! entries, and lets go of the table's pages as it goes.

use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, SymbolKind, SymbolScope};

/// Symbols read between two calls of `trim`.
const TRIM_EVERY: usize = 4096;

/// An entry of the map as `object` orders entries at one address: lower is better.
type Rank = (u32, usize);

/// What the pass keeps of the entries between two neighbouring probes (sorted), above the
/// lower one and at or below the upper one.
#[derive(Clone, Copy, Default)]
struct Gap<'data> {
    /// The best named symbol at the highest address that has one.
    named: Option<(u64, Rank, u64, &'data str)>,
    /// The highest and the lowest address of any entry (section ends included).
    highest: Option<u64>,
    lowest: Option<u64>,
}

impl Gap<'_> {
    /// Whether a named symbol at `address` of `rank` would be kept instead of the one kept.
    fn better(&self, address: u64, rank: Rank) -> bool {
        self.named
            .is_none_or(|(at, best, ..)| address > at || (address == at && rank < best))
    }

    /// Whether an entry at `address` of `rank` changes anything the gap keeps.
    fn changed_by(&self, address: u64, rank: Rank) -> bool {
        self.highest.is_none_or(|h| address > h)
            || self.lowest.is_none_or(|l| address < l)
            || self.better(address, rank)
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

/// [`containing`] over one format's symbols.
fn containing_in<'data>(
    object: &impl Object<'data>,
    probes: &[u64],
    trim: &dyn Fn(),
) -> Vec<Option<&'data str>> {
    let mut sorted = probes.to_vec();
    sorted.sort_unstable();
    let mut gaps = vec![Gap::default(); sorted.len() + 1];
    let gap_of = |address: u64| sorted.partition_point(|&p| p < address);
    let note = |gap: &mut Gap<'data>, address: u64, named: Option<(Rank, u64, &'data str)>| {
        gap.highest = Some(gap.highest.map_or(address, |h| h.max(address)));
        gap.lowest = Some(gap.lowest.map_or(address, |l| l.min(address)));
        if let Some((rank, size, name)) = named {
            if gap.better(address, rank) {
                gap.named = Some((address, rank, size, name));
            }
        }
    };
    let Some(table) = object
        .symbol_table()
        .or_else(|| object.dynamic_symbol_table())
    else {
        return vec![None; probes.len()];
    };
    for (read, symbol) in table.symbols().enumerate() {
        if read % TRIM_EVERY == TRIM_EVERY - 1 {
            trim();
        }
        if !symbol.is_definition() {
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
        let address = symbol.address();
        let gap = &mut gaps[gap_of(address)];
        // A name is read (a search for its end in the string table) only for a symbol that
        // changes what its gap keeps: a few per gap, of the table's tens of thousands.
        if !gap.changed_by(address, rank) {
            continue;
        }
        let Some(name) = symbol.name().ok().filter(|name| !name.is_empty()) else {
            continue;
        };
        note(gap, address, Some((rank, symbol.size(), name)));
    }
    // Section ends bound the guessed size of a symbol without one.
    for section in object.sections() {
        let end = section.address().saturating_add(section.size());
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
        answers.push(named.and_then(|(address, _, size, name)| {
            // A section end above the symbol ends it; a symbol without size reaches to the
            // next entry (or, the last of all, holds everything above it).
            let size = match (size, highest) {
                (0, Some(top)) if top > address => top - address,
                (0, _) => above[at].map_or(0, |above: u64| above - address),
                (size, _) => size,
            };
            (size == 0 || probe - address < size).then_some(name)
        }));
    }
    probes
        .iter()
        .map(|probe| answers[sorted.partition_point(|p| p < probe)])
        .collect()
}
