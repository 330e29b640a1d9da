//! Symbolization at report time: raw return addresses to demangled, inlined-aware frames.
//!
//! Runs once per report, never on the allocation path, so it allocates freely (through
//! Rust's global allocator, under the tracker's reentrancy guard). Flow (style anchors 9.4-9.6):
//! address -> module by `PT_LOAD` range ([`modules`]) -> `address - bias - 1` (a return
//! address points after the call) -> that module's lazily built `addr2line` loader
//! ([`resolver`]) -> frames, innermost inlined function first -> per-address cache.
//! [`Symbolizer::symbolize_stack`] then trims the tracker's own frames by name ([`names`]).
//! A report goes through [`Symbolizer::symbolize_stacks`], which gathers the addresses of all
//! its stacks first and resolves them a module at a time, each module's debug info read for
//! those addresses alone ([`sections`]) and dropped before the next.

pub mod glob;
mod lean;
mod line_program;
mod modules;
mod names;
mod resolver;
mod sections;
mod symtab;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};

use crate::stack::StackId;

pub use names::is_allocator_frame;

use modules::{Module, ModuleMap};
use names::is_thread_start_of_ours;
use resolver::{DebugInfo, Location};

/// The module name of frames whose address lies in no loaded module.
pub const UNKNOWN_MODULE: &str = "[unknown]";

/// One source-level frame of a return address.
#[derive(Clone, Debug)]
pub struct Frame {
    /// Demangled name (C++ with parameters, Rust without the `::h<hash>` suffix); `None`
    /// when neither DWARF nor a symbol table names the address.
    pub function: Option<String>,
    /// Source file as the compiler recorded it (absolute or relative to the build folder).
    pub file: Option<String>,
    /// Source line; 0 when unknown.
    pub line: u32,
    /// True for a function inlined into the next frame, which shares its `address`.
    pub inlined: bool,
    /// The return address as captured.
    pub address: usize,
    /// Path of the executable or shared library holding `address` (`[unknown]` if none).
    pub module: String,
    /// `address` minus the module's load bias: the address as stated in `module`, to use
    /// with `addr2line -e module` (after subtracting 1, as for any return address).
    pub module_offset: usize,
}

/// Resolves return addresses of this process, caching every address and module it has seen.
pub struct Symbolizer {
    map: ModuleMap,
    /// Per module, in `map.modules` order: not tried yet, unreadable, or loaded.
    debug: Vec<Option<Option<DebugInfo>>>,
    /// By address and the module mapped there.
    cache: HashMap<(usize, Option<usize>), Box<[Frame]>>,
    /// Symbol-table names found for a module before its debug info was loaded (by probe), for
    /// the debug info loaded next: a pass over a large program's symbol table is milliseconds.
    names_found: HashMap<usize, HashMap<u64, Option<String>>>,
    /// The program's own allocation wrappers (`alloc_fns=`), trimmed like the known ones.
    alloc_fns: Vec<String>,
}

impl Symbolizer {
    /// Takes a snapshot of the loaded modules; their debug info is read on first use.
    pub fn new() -> Self {
        let map = ModuleMap::snapshot();
        let debug = map.modules.iter().map(|_| None).collect();
        Symbolizer {
            map,
            debug,
            cache: HashMap::new(),
            names_found: HashMap::new(),
            alloc_fns: crate::options::get()
                .alloc_fns
                .as_ref()
                .map(|patterns| names::alloc_fn_patterns(patterns.as_str()))
                .unwrap_or_default(),
        }
    }

    /// Whether `address` lies in a module still mapped when this symbolizer was made (a
    /// `__FILE__` literal of a `dlclose`d library does not).
    pub fn is_mapped(&self, address: usize) -> bool {
        self.map.is_mapped_now(address)
    }

    /// The frames of one return address, innermost inlined function first, the function
    /// that owns the machine code last. Never empty: at worst one frame with the module and
    /// offset and no name. Each address is resolved once (per module mapped there).
    pub fn resolve(&mut self, address: usize) -> &[Frame] {
        self.resolve_in(address, None)
    }

    /// [`Symbolizer::resolve`] against the module mapped at `address` when `stack` was captured.
    fn resolve_in(&mut self, address: usize, stack: Option<StackId>) -> &[Frame] {
        let Symbolizer {
            map, debug, cache, ..
        } = self;
        let module = map.find(address, stack);
        cache
            .entry((address, module))
            .or_insert_with(|| resolve_uncached(map, debug, address, module))
    }

    /// The frames of every stack of `stacks` (see [`Symbolizer::symbolize_stack`]), resolved
    /// module by module: a module's debug info is read for exactly the addresses that lie in
    /// it (compressed DWARF only where they need it) and released before the next module is
    /// read, so that a report costs the memory of one module's share at a time, not of all.
    pub fn symbolize_stacks(
        &mut self,
        stacks: impl IntoIterator<Item = StackId>,
    ) -> HashMap<StackId, Vec<Frame>> {
        let mut ids: Vec<StackId> = stacks.into_iter().collect();
        ids.sort_unstable_by_key(|id| id.0);
        ids.dedup_by_key(|id| id.0);
        let mut wanted: Vec<(usize, usize)> = Vec::new(); // (module, address)
        for &id in &ids {
            for &address in crate::stack::frames(id).iter() {
                let module = self.map.find(address, Some(id));
                match module {
                    Some(index) if !self.cache.contains_key(&(address, module)) => {
                        wanted.push((index, address));
                    }
                    _ => {}
                }
            }
        }
        wanted.sort_unstable();
        wanted.dedup();
        let kept = if crate::options::get().show_below_main {
            HashMap::new()
        } else {
            self.cut_below_main(&ids, &mut wanted)
        };
        for group in wanted.chunk_by(|a, b| a.0 == b.0) {
            let addresses: Vec<usize> = group.iter().map(|w| w.1).collect();
            self.resolve_module(group[0].0, &addresses);
        }
        ids.into_iter()
            .map(|id| {
                let depth = kept.get(&id).copied().unwrap_or(usize::MAX);
                (id, self.symbolize_frames(id, depth))
            })
            .collect()
    }

    /// How many frames each of `ids` keeps when the frames below `main` go (valgrind's
    /// default): a stack through the executable's `main` ends there, `main` included; others
    /// stay whole. `main` is found before any DWARF is read, so that what lies below it costs
    /// nothing: `_start`, which no unit covers (finding that out walks every unit
    /// `.debug_aranges` leaves out, and in compressed DWARF decompresses them), and libc's
    /// start-up frames (its debug file, compressed): by what `_start` hands to libc
    /// ([`crate::stack::main_code`]), else by the executable's symbol table. The batch then
    /// reads the executable's DWARF for the frames shown alone. `wanted` keeps only the
    /// addresses some stack still shows.
    fn cut_below_main(
        &mut self,
        ids: &[StackId],
        wanted: &mut Vec<(usize, usize)>,
    ) -> HashMap<StackId, usize> {
        let Some(exe) = self.map.modules.iter().position(|m| m.is_main) else {
            return HashMap::new();
        };
        let unresolved: Vec<usize> = wanted.iter().filter(|w| w.0 == exe).map(|w| w.1).collect();
        let main = crate::stack::main_code();
        let mut in_main = match main {
            Some(_) => HashSet::new(),
            None => self.named_main(exe, unresolved),
        };
        let mut kept = HashMap::new();
        let mut shown = HashSet::new();
        for &id in ids {
            let frames = crate::stack::frames(id);
            let mut depth = frames.len();
            for (at, &address) in frames.iter().enumerate() {
                if self.map.find(address, Some(id)) != Some(exe) {
                    continue;
                }
                let resolved_main = || {
                    self.cache
                        .get(&(address, Some(exe)))
                        .and_then(|frames| frames.last()?.function.as_deref())
                        == Some("main")
                };
                let by_code = || {
                    main.as_ref()
                        .is_some_and(|main| main.contains(&address.wrapping_sub(1)))
                };
                if in_main.contains(&address) || by_code() || resolved_main() {
                    in_main.insert(address);
                    depth = at + 1;
                    break;
                }
            }
            shown.extend(frames[..depth].iter().copied());
            kept.insert(id, depth);
        }
        wanted.retain(|w| shown.contains(&w.1));
        kept
    }

    /// Those of `addresses` (return addresses in the executable, module `exe`) that its symbol
    /// table places in `main`.
    fn named_main(&mut self, exe: usize, addresses: Vec<usize>) -> HashSet<usize> {
        let bias = self.map.modules[exe].bias;
        let probes: Vec<u64> = addresses
            .iter()
            .map(|&address| probe(address.wrapping_sub(bias)))
            .collect();
        let names = match &mut self.debug[exe] {
            Some(Some(info)) => info.symbol_names(&probes),
            Some(None) => Vec::new(),
            None if probes.is_empty() => Vec::new(),
            None => self.map.modules[exe]
                .file
                .as_deref()
                .and_then(DebugInfo::load_symbols)
                .map(|mut info| {
                    let names = info.symbol_names(&probes);
                    self.names_found.insert(exe, info.into_names());
                    names
                })
                .unwrap_or_default(),
        };
        addresses
            .into_iter()
            .zip(&names)
            .filter(|(_, name)| name.as_deref() == Some("main"))
            .map(|(address, _)| address)
            .collect()
    }

    /// Resolves `addresses`, all in module `index`, into the cache. Debug info loaded before
    /// stays; otherwise it is loaded for these addresses alone and dropped at the end.
    fn resolve_module(&mut self, index: usize, addresses: &[usize]) {
        let module = &self.map.modules[index];
        let probes: Vec<u64> = addresses
            .iter()
            .map(|&address| probe(address.wrapping_sub(module.bias)))
            .collect();
        let located = match &mut self.debug[index] {
            Some(Some(info)) => info.locate_all(&probes),
            Some(None) => Vec::new(),
            None => match module
                .file
                .as_deref()
                .and_then(|file| DebugInfo::load_for(file, &probes))
            {
                Some(mut info) => {
                    info.learn_names(self.names_found.remove(&index).unwrap_or_default());
                    info.locate_all(&probes)
                }
                None => {
                    self.debug[index] = Some(None);
                    Vec::new()
                }
            },
        };
        let mut located = located.into_iter();
        for &address in addresses {
            let locations = located.next().unwrap_or_default();
            let frames = frames_at(module, address, locations);
            self.cache.insert((address, Some(index)), frames);
        }
    }

    /// All frames of one captured stack (innermost call first), each against the module mapped
    /// at its address when the stack was captured, with the tracker's own and the allocator
    /// wrappers' frames ([`is_allocator_frame`], and those `alloc_fns=` names) trimmed from the
    /// top. Only the top run goes:
    /// after the first user frame everything stays but the tracker's thread start
    /// ([`is_thread_start_of_ours`]). A stack made only of such frames is returned whole
    /// rather than empty.
    pub fn symbolize_stack(&mut self, stack: StackId) -> Vec<Frame> {
        self.symbolize_frames(stack, usize::MAX)
    }

    /// [`Symbolizer::symbolize_stack`] of the stack's first `depth` return addresses.
    fn symbolize_frames(&mut self, stack: StackId, depth: usize) -> Vec<Frame> {
        let return_addresses = crate::stack::frames(stack);
        let mut frames = Vec::with_capacity(return_addresses.len());
        for &address in return_addresses.iter().take(depth) {
            frames.extend_from_slice(self.resolve_in(address, Some(stack)));
        }
        let own = frames
            .iter()
            .take_while(|frame| {
                frame.function.as_deref().is_some_and(|function| {
                    is_allocator_frame(function) || names::is_alloc_fn(function, &self.alloc_fns)
                })
            })
            .count();
        if own < frames.len() {
            frames.drain(..own);
        }
        let shown = |frame: &Frame| {
            !frame
                .function
                .as_deref()
                .is_some_and(is_thread_start_of_ours)
        };
        if frames.iter().any(shown) {
            frames.retain(shown);
        }
        frames
    }
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

fn resolve_uncached(
    map: &ModuleMap,
    debug: &mut [Option<Option<DebugInfo>>],
    address: usize,
    module: Option<usize>,
) -> Box<[Frame]> {
    let Some(index) = module else {
        return Box::new([Frame {
            function: None,
            file: None,
            line: 0,
            inlined: false,
            address,
            module: UNKNOWN_MODULE.to_owned(),
            module_offset: address,
        }]);
    };
    let module = &map.modules[index];
    let info = debug[index].get_or_insert_with(|| module.file.as_deref().and_then(DebugInfo::load));
    let locations = info.as_mut().map_or_else(Vec::new, |info| {
        info.locate(probe(address.wrapping_sub(module.bias)))
    });
    frames_at(module, address, locations)
}

/// The name of the frame where a signal handler returns into `rt_sigreturn`.
const SIGNAL_FRAME: &str = "<signal handler called>";

/// The address to look up for a return address at `module_offset`: minus one, the call
/// instruction, not the statement after it (which can be the next line or even the next
/// function; backtrace-rs `adjust_ip`).
fn probe(module_offset: usize) -> u64 {
    module_offset.wrapping_sub(1) as u64
}

/// The frames of a return address in `module` from its source locations (one unnamed frame
/// when there are none, but for a signal handler's return).
fn frames_at(module: &Module, address: usize, mut locations: Vec<Location>) -> Box<[Frame]> {
    let module_offset = address.wrapping_sub(module.bias);
    if !locations.iter().any(|l| l.function.is_some()) && crate::stack::is_signal_return(address) {
        // glibc's `__restore_rt` has no symbol a stripped libc keeps: named as gdb names it.
        locations = vec![Location {
            function: Some(SIGNAL_FRAME.to_owned()),
            ..Location::default()
        }];
    }
    if locations.is_empty() {
        locations.push(Location::default());
    }
    let count = locations.len();
    locations
        .into_iter()
        .enumerate()
        .map(|(i, location)| Frame {
            function: location.function,
            file: location.file,
            line: location.line,
            inlined: i + 1 < count,
            address,
            module: module.name.clone(),
            module_offset,
        })
        .collect()
}
