//! The symbol-table names of a batch of addresses, found in one pass over the table: the answers of `object`'s `SymbolMap::containing` without building the map.
//!
//! A map of yaml-cpp's test program (70 000 symbols of long template names) is 3 MB of heap
//! built to name a few frames; here a pass keeps, per address, the best symbol at or below
//! it and the nearest entry above it, and lets go of the table's pages as it goes.

use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, SymbolKind, SymbolScope};

/// Symbols read between two calls of `trim`.
const TRIM_EVERY: usize = 4096;

/// An entry of the map as `object` orders entries at one address: lower is better.
type Rank = (u32, usize);

/// What the pass keeps for one address.
#[derive(Clone, Copy, Default)]
struct Nearest<'data> {
    /// The best named symbol at the highest address at or below the probe.
    below: Option<(u64, Rank, u64, &'data str)>,
    /// The highest address at or below the probe of any entry (section ends included).
    top: Option<u64>,
    /// The lowest address above the probe of any entry.
    above: Option<u64>,
}

/// For each of `probes`, the name of the symbol of `object` whose range holds it, as
/// `object.symbol_map().containing(probe)` would answer (its `.symtab`, else `.dynsym`; a
/// symbol without size reaches to the next entry).
pub(super) fn containing<'data>(
    object: &object::File<'data>,
    probes: &[u64],
    trim: &dyn Fn(),
) -> Vec<Option<&'data str>> {
    let mut nearest = vec![Nearest::default(); probes.len()];
    let mut note = |address: u64, named: Option<(Rank, u64, &'data str)>| {
        for (&probe, near) in probes.iter().zip(&mut nearest) {
            if address > probe {
                near.above = Some(near.above.map_or(address, |a| a.min(address)));
                continue;
            }
            near.top = Some(near.top.map_or(address, |t| t.max(address)));
            if let Some((rank, size, name)) = named {
                let better = near
                    .below
                    .is_none_or(|(at, best, ..)| address > at || (address == at && rank < best));
                if better {
                    near.below = Some((address, rank, size, name));
                }
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
        let Some(name) = symbol.name().ok().filter(|name| !name.is_empty()) else {
            continue;
        };
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
        note(symbol.address(), Some((rank, symbol.size(), name)));
    }
    // Section ends bound the guessed size of a symbol without one.
    for section in object.sections() {
        note(section.address().saturating_add(section.size()), None);
    }
    trim();
    probes
        .iter()
        .zip(nearest)
        .map(|(&probe, near)| {
            let (address, _, size, name) = near.below?;
            // A section end above the symbol ends it; a symbol without size reaches to the
            // next entry (or, the last of all, holds everything above it).
            let size = match (size, near.top) {
                (0, Some(top)) if top > address => top - address,
                (0, _) => near.above.map_or(0, |above| above - address),
                (size, _) => size,
            };
            (size == 0 || probe - address < size).then_some(name)
        })
        .collect()
}
