//! The leak report: a snapshot of the live blocks, classified (direct, indirect, reachable) by a
//! pointer scan, filtered by suppressions, grouped by allocation site, written as text
//! (LeakSanitizer-like) and as JSON (`k15-leaks/3`).

pub mod destination;
pub mod ignore;
pub mod json;
pub mod mappings;
pub mod page;
pub mod profile;
pub mod scan;
pub mod suppress;
pub mod text;

use crate::stack::{self, StackId};
use crate::symbolize::{Frame, Symbolizer};
use crate::tracker::errors::{self, MemoryError};
use crate::tracker::guard::Inside;
use crate::tracker::header::BlockHeader;
use crate::tracker::integrity::{self, FoundBy};
use crate::tracker::live_list::StoppedWorld;
use crate::tracker::suspend::Suspension;
use crate::tracker::tags::{self, TagId};
use crate::tracker::BlockKind;
use profile::ProfileReport;
use scan::{LeakKind, Node};
use std::collections::HashMap;
use std::io::Write;
use std::sync::OnceLock;
use suppress::Suppressions;

/// One block still live when the snapshot was taken.
#[derive(Clone, Debug)]
pub struct Leak {
    pub address: usize,
    pub size: usize,
    pub kind: BlockKind,
    pub file: Option<&'static str>,
    pub line: u32,
    pub seq: u32,
    pub thread: u32,
    pub stack: StackId,
    /// The engine allocator that served the block (`rust/engine`), if not `new`/Rust/Bullet.
    pub allocator: Option<&'static str>,
    pub leak_kind: LeakKind,
    /// For an indirect leak: the direct leak (index into [`Report::leaks`]) that holds it.
    pub held_by: Option<usize>,
    /// The rule (index into [`Report::rules`]) that keeps the block out of the report.
    pub suppressed: Option<usize>,
    /// Its allocation site: blocks with the same stack, kind, `K15_NEW` place and tag share it.
    pub site: u32,
    /// The tag scope it was allocated in (`tracker::tags`), 0 for none.
    pub tag: TagId,
}

impl Leak {
    /// SPEC's `language`: who allocated the block.
    pub fn language(&self) -> &'static str {
        if let Some(name) = self.allocator {
            return name;
        }
        match self.kind {
            BlockKind::Rust => "rust",
            BlockKind::Bullet => "bullet",
            BlockKind::New | BlockKind::NewArray => "c++",
            _ => "c",
        }
    }

    /// Whether the block's memory can still be read: a block of the tracker's heap (named
    /// allocations included) always; an engine allocator's while its allocator lives (one
    /// dropped before the report took its memory with it).
    fn is_readable(&self) -> bool {
        self.allocator.is_none()
            || self.kind == BlockKind::Named
            || crate::engine::allocator_of(self.address as *const u8).is_some()
    }

    /// The function (or engine allocator) that allocated the block: `new[]`, `calloc`, ...
    pub fn allocated_with(&self) -> &'static str {
        self.allocator.unwrap_or_else(|| errors::family(self.kind))
    }

    /// What groups blocks into one allocation site: same stack, kind, `K15_NEW` place (the
    /// strings by address: literals, the same for every block of a site) and tag.
    fn site_key(&self) -> SiteKey {
        (
            self.stack.0,
            self.language().as_ptr() as usize,
            self.kind as u8,
            self.file.map_or(0, |f| f.as_ptr() as usize),
            self.line,
            self.tag,
        )
    }

    /// The name of its tag, if it has one.
    pub fn tag_name(&self) -> Option<String> {
        (self.tag != 0).then(|| tags::name(self.tag))
    }
}

type SiteKey = (u32, usize, u8, usize, u32, TagId);

/// For each stack, the first one with the same frames once the allocation wrappers were
/// trimmed: a hook calling either of two wrappers (`alloc_fns=`) from one line is one site.
fn stacks_by_frames(stacks: &HashMap<StackId, Vec<Frame>>) -> HashMap<StackId, StackId> {
    let mut first: HashMap<Vec<(usize, Option<&str>)>, StackId> = HashMap::new();
    let mut ids: Vec<StackId> = stacks.keys().copied().collect();
    ids.sort_unstable_by_key(|id| id.0);
    ids.into_iter()
        .map(|id| {
            let frames = stacks[&id]
                .iter()
                .map(|f| (f.address, f.function.as_deref()))
                .collect();
            (id, *first.entry(frames).or_insert(id))
        })
        .collect()
}

/// Numbers every block's site ([`Leak::site`]) and returns one block of each, by site number.
fn number_sites(leaks: &mut [Leak]) -> Vec<usize> {
    let mut numbers: HashMap<SiteKey, u32, FastHash> = HashMap::default();
    let mut first_of_site = Vec::new();
    for (i, leak) in leaks.iter_mut().enumerate() {
        let next = numbers.len() as u32;
        leak.site = *numbers.entry(leak.site_key()).or_insert_with(|| {
            first_of_site.push(i);
            next
        });
    }
    first_of_site
}

/// A multiply-rotate hash for the report's integer keys: SipHash's DoS resistance buys nothing
/// here and costs most of the grouping time at a million blocks.
type FastHash = core::hash::BuildHasherDefault<WordHasher>;

#[derive(Default)]
struct WordHasher(u64);

impl core::hash::Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u32(&mut self, word: u32) {
        self.write_u64(u64::from(word));
    }

    fn write_u8(&mut self, word: u8) {
        self.write_u64(u64::from(word));
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Blocks of one allocation site and one leak kind: one entry of the text report.
pub struct Site<'a> {
    pub leaks: Vec<&'a Leak>,
    pub total_bytes: usize,
    /// The symbolized stack the blocks share.
    pub frames: &'a [Frame],
}

impl<'a> Site<'a> {
    pub fn first(&self) -> &'a Leak {
        self.leaks[0]
    }
}

/// A direct-leak site and the indirect blocks its blocks hold, by site.
pub struct DirectSite<'a> {
    pub site: Site<'a>,
    pub held: Vec<Site<'a>>,
    pub held_bytes: usize,
    pub held_blocks: usize,
}

/// One suppression rule (a `suppressions=` line, `ignore_leak()` or `ScopedLeakIgnore`) and
/// what it kept out of the report.
#[derive(Clone, Debug, Default)]
pub struct RuleCount {
    pub rule: String,
    pub blocks: usize,
    pub bytes: usize,
    pub errors: usize,
}

/// Blocks and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Total {
    pub blocks: usize,
    pub bytes: usize,
}

impl Total {
    fn add(&mut self, size: usize) {
        self.blocks += 1;
        self.bytes += size;
    }
}

/// Everything a report shows, symbolized.
pub struct Report {
    /// Every block live at the snapshot, reported or suppressed, by thread and sequence.
    pub leaks: Vec<Leak>,
    /// The first errors (`errors::MAX_KEPT_ERRORS`) not suppressed, in order.
    pub errors: Vec<MemoryError>,
    /// All errors, listed or not, suppressed ones excluded.
    pub error_count: usize,
    /// Blocks the Rust runtime allocates once for itself before `main` and keeps (see
    /// [`is_rust_runtime_setup`]): live at exit, but no leak of the program's.
    pub runtime_blocks: usize,
    pub stats: crate::tracker::Stats,
    /// Every tag's figures (`tracker::tags`), a parent before its children.
    pub tags: Vec<tags::TagStats>,
    /// What the frames did (`frame_mark()`), per tag and for the process.
    pub frames: crate::tracker::frames::FrameReport,
    /// Most calls, temporary allocations and the peak's consumers, with `profile=1`.
    pub profile: Option<ProfileReport>,
    /// Threads whose lists could not be settled (see `StoppedWorld`): listed as they were.
    pub unsettled_threads: Vec<u32>,
    /// Engine allocators whose live blocks are left out: their lock stayed held at exit
    /// ([`crate::engine::Busy`]); [`EVERY_ENGINE_ALLOCATOR`] when the registry's did.
    pub unlisted_allocators: Vec<&'static str>,
    /// Live blocks with a page that could not be read (see `scan::Classified`).
    pub unreadable_blocks: usize,
    /// Threads the scan could not suspend (see `tracker::suspend`): read as they ran.
    pub unsuspended_threads: Vec<u32>,
    /// The suppression rules in force, with what each kept out (see [`Report::rules_used`]).
    rules: Vec<RuleCount>,
    /// One block of each site ([`Leak::site`]), by site number.
    pub site_blocks: Vec<usize>,
    stacks: HashMap<StackId, Vec<Frame>>,
}

impl Report {
    /// Snapshots the live lists, the engine allocators' live blocks and the errors, classifies
    /// the blocks, applies the suppressions and symbolizes every stack they name. `stack`: the
    /// caller's live stack, scanned as a root (during the run; not at exit).
    pub fn collect(stack: Option<core::ops::Range<usize>>) -> Report {
        let mut symbolizer = Symbolizer::new();
        let Snapshot {
            mut leaks,
            unsettled_threads,
            unlisted_allocators,
            unreadable_blocks,
            unsuspended_threads,
            stats,
            tags,
        } = snapshot(&symbolizer, stack);
        // After: the snapshot's heap check adds errors (and the threads are going again).
        let (mut all_errors, mut error_count) = errors::all();
        let profiled = crate::tracker::profile::read();
        let ids = leaks
            .iter()
            .map(|l| l.stack)
            .chain(
                all_errors
                    .iter()
                    .flat_map(|e| [e.alloc_stack, e.free_stack, e.previous_free_stack]),
            )
            .chain(profiled.iter().flat_map(ProfileReport::stacks));
        let stacks = symbolizer.symbolize_stacks(ids);
        let runtime_blocks = remove_leaks(&mut leaks, |leak| {
            is_rust_runtime_setup(&stacks[&leak.stack])
        });

        let same_frames = stacks_by_frames(&stacks);
        for leak in &mut leaks {
            leak.stack = same_frames[&leak.stack];
        }
        let profile = profiled.map(|p| ProfileReport::new(&p, &same_frames, &symbolizer));
        drop(symbolizer);

        let mut rules: Vec<RuleCount> = IGNORE_RULES
            .into_iter()
            .map(str::to_owned)
            .chain(suppressions().rules.iter().map(|r| r.text.clone()))
            .map(|rule| RuleCount {
                rule,
                ..RuleCount::default()
            })
            .collect();
        suppress_leaks(&mut leaks, &stacks);
        for leak in &leaks {
            if let Some(rule) = leak.suppressed {
                rules[rule].blocks += 1;
                rules[rule].bytes += leak.size;
            }
        }
        all_errors.retain(|e| match suppressed_error(e, &stacks) {
            Some(rule) => {
                rules[IGNORE_RULES.len() + rule].errors += 1;
                error_count -= 1;
                false
            }
            None => true,
        });
        let site_blocks = number_sites(&mut leaks);
        Report {
            leaks,
            site_blocks,
            errors: all_errors,
            error_count,
            runtime_blocks,
            stats,
            tags,
            frames: crate::tracker::frames::report(),
            profile,
            unsettled_threads,
            unlisted_allocators,
            unreadable_blocks,
            unsuspended_threads,
            rules,
            stacks,
        }
    }

    /// The rules that kept something out of the report.
    pub fn rules_used(&self) -> impl Iterator<Item = &RuleCount> {
        self.rules.iter().filter(|r| r.blocks > 0 || r.errors > 0)
    }

    pub fn frames(&self, id: StackId) -> &[Frame] {
        self.stacks.get(&id).map_or(&[], Vec::as_slice)
    }

    /// The blocks the report shows (not suppressed).
    pub fn reported(&self) -> impl Iterator<Item = &Leak> {
        self.leaks.iter().filter(|l| l.suppressed.is_none())
    }

    /// Blocks and bytes of one kind, suppressed blocks excluded.
    pub fn total(&self, kind: LeakKind) -> Total {
        let mut total = Total::default();
        for leak in self.reported().filter(|l| l.leak_kind == kind) {
            total.add(leak.size);
        }
        total
    }

    /// Direct and indirect leaks together: what "leaked" means in the summaries.
    pub fn leaked(&self) -> Total {
        let (direct, indirect) = (self.total(LeakKind::Direct), self.total(LeakKind::Indirect));
        Total {
            blocks: direct.blocks + indirect.blocks,
            bytes: direct.bytes + indirect.bytes,
        }
    }

    pub fn suppressed(&self) -> Total {
        let mut total = Total::default();
        for leak in self.leaks.iter().filter(|l| l.suppressed.is_some()) {
            total.add(leak.size);
        }
        total
    }

    /// What `exitcode` counts: errors, and blocks of the kinds `leak_kinds=` names.
    pub fn counted_for_exit(&self, leak_kinds: u8) -> usize {
        let blocks = self
            .reported()
            .filter(|l| leak_kinds & l.leak_kind.bit() != 0)
            .count();
        blocks + self.error_count
    }

    /// Reported blocks of `kind` grouped by allocation site, largest total first.
    pub fn sites(&self, kind: LeakKind) -> Vec<Site<'_>> {
        sorted_sites(self.group(self.reported().filter(|l| l.leak_kind == kind)))
    }

    /// The direct-leak sites, each with the indirect blocks held through it, largest first
    /// (counting what they hold).
    pub fn direct_sites(&self) -> Vec<DirectSite<'_>> {
        let sites = self.sites(LeakKind::Direct);
        let mut position_of_site = vec![usize::MAX; self.site_blocks.len()];
        for (i, site) in sites.iter().enumerate() {
            position_of_site[site.first().site as usize] = i;
        }
        let mut held: Vec<Vec<&Leak>> = sites.iter().map(|_| Vec::new()).collect();
        for leak in self
            .reported()
            .filter(|l| l.leak_kind == LeakKind::Indirect)
        {
            let Some(direct) = leak.held_by.map(|d| &self.leaks[d]) else {
                continue;
            };
            if direct.suppressed.is_none() {
                held[position_of_site[direct.site as usize]].push(leak);
            }
        }
        let mut direct: Vec<DirectSite<'_>> = sites
            .into_iter()
            .zip(held)
            .map(|(site, held)| {
                let held_bytes = held.iter().map(|l| l.size).sum();
                let held_blocks = held.len();
                DirectSite {
                    site,
                    held: sorted_sites(self.group(held.into_iter())),
                    held_bytes,
                    held_blocks,
                }
            })
            .collect();
        direct.sort_by_key(|d| core::cmp::Reverse(d.site.total_bytes + d.held_bytes));
        direct
    }

    /// `leaks` by allocation site.
    fn group<'a>(&'a self, leaks: impl Iterator<Item = &'a Leak>) -> Vec<Site<'a>> {
        let mut leaks: Vec<&'a Leak> = leaks.collect();
        leaks.sort_by_key(|l| l.site); // stable: blocks stay in allocation order
        leaks
            .chunk_by(|a, b| a.site == b.site)
            .map(|leaks| Site {
                total_bytes: leaks.iter().map(|l| l.size).sum(),
                frames: self.frames(leaks[0].stack),
                leaks: leaks.to_vec(),
            })
            .collect()
    }

    /// Indirect blocks whose direct leak is not reported (suppressed by another rule), which no
    /// direct site lists.
    pub fn orphan_indirect(&self) -> Vec<Site<'_>> {
        let orphans = self.reported().filter(|l| {
            l.leak_kind == LeakKind::Indirect
                && l.held_by.is_none_or(|d| self.leaks[d].suppressed.is_some())
        });
        sorted_sites(self.group(orphans))
    }
}

/// What [`Report::unlisted_allocators`] names when not even the list of engine allocators could
/// be read.
pub const EVERY_ENGINE_ALLOCATOR: &str = "*";

/// The live blocks at one moment, classified.
struct Snapshot {
    /// By thread, then sequence; then the engine allocators' blocks.
    leaks: Vec<Leak>,
    unsettled_threads: Vec<u32>,
    unlisted_allocators: Vec<&'static str>,
    unreadable_blocks: usize,
    unsuspended_threads: Vec<u32>,
    /// The process's counters and every tag's, read with the lists (read after the world went
    /// on, a mid-run report's tag table counted blocks its leak list did not have).
    stats: crate::tracker::Stats,
    tags: Vec<tags::TagStats>,
}

/// Every live tracked block and every engine allocator's live block, classified by a scan of
/// one moment: the world stopped (no block is allocated or freed) from the walk of the lists
/// through the scan, and the other threads suspended for the scan (no pointer moves between a
/// register and memory, nothing is unmapped). What a suspended thread may hold a lock on is
/// read first (the error log after): the engine allocators' blocks (their memory, freed meanwhile, is only read while
/// their allocator still has it), the roots, the ignored blocks. `__FILE__` strings of unloaded
/// modules are dropped rather than read. `stack`: the caller's live stack, a root.
fn snapshot(symbolizer: &Symbolizer, stack: Option<core::ops::Range<usize>>) -> Snapshot {
    let block_tags = crate::engine::block_tags().unwrap_or_default();
    let tag_of = |address: usize, allocator: u32| {
        block_tags
            .binary_search_by_key(&(address, allocator), |&(key, _)| key)
            .map_or(0, |i| block_tags[i].1)
    };
    let mut engine_leaks = Vec::new();
    let mut unlisted_allocators = crate::engine::for_each_live_block(&mut |info, block| {
        engine_leaks.push(Leak {
            address: block.address,
            size: block.size,
            kind: BlockKind::New,
            file: None,
            line: 0,
            seq: 0,
            thread: 0,
            stack: StackId(block.tag),
            allocator: Some(info.name),
            leak_kind: LeakKind::Direct,
            held_by: None,
            suppressed: None,
            site: 0,
            tag: tag_of(block.address, info.id),
        })
    })
    .unwrap_or_else(|_| vec![EVERY_ENGINE_ALLOCATOR]);
    let sub_blocks = pool_sub_blocks().unwrap_or_else(|_| {
        unlisted_allocators.push(EVERY_POOL);
        Vec::new()
    });
    let loader_calls = crate::tracker::fork::hold_loader_calls();
    let roots = scan::Roots::gather(stack);
    // Before the world stops, as the roots: the loader's lock, which `dl_iterate_phdr` takes, may
    // be held by a thread inside `dlclose`, freeing a block (a plugin reloaded while a report is
    // written: it waited for the stopped world, and the report for it).
    let linker = scan::dynamic_linker();
    let ignored = ignore::IgnoreSet::now();
    let mut leaks = Vec::new();
    let mut problems = Vec::new();
    let mut file_names: HashMap<usize, Option<&'static str>> = HashMap::new();
    let world = StoppedWorld::stop(crate::tracker::guard::thread_number());
    integrity::check_live_blocks(&world, FoundBy::Report, &mut problems, |header| {
        // SAFETY: live headers stay so while the world is stopped.
        let h = unsafe { &*header };
        let file = *file_names.entry(h.file() as usize).or_insert_with(|| {
            // SAFETY: the `file` of a live block is null or a `__FILE__` literal, here of
            // a module still mapped.
            symbolizer
                .is_mapped(h.file() as usize)
                .then(|| unsafe { crate::sys::c_str(h.file()) })
                .flatten()
        });
        // A `k15::memory::allocate` block keeps its allocator's name where others keep
        // their `K15_NEW` file.
        let named = h.kind() == BlockKind::Named;
        leaks.push(Leak {
            address: BlockHeader::user_ptr(header) as usize,
            size: h.size(),
            kind: h.kind(),
            file: file.filter(|_| !named),
            line: h.line(),
            seq: h.seq(),
            thread: h.thread(),
            stack: h.alloc_stack(),
            allocator: file.filter(|_| named),
            leak_kind: LeakKind::Direct,
            held_by: None,
            suppressed: None,
            site: 0,
            tag: h.tag(),
        })
    });
    let unsettled_threads = world.unsettled_threads();
    // The stop settled the queued frees, and no shard's counters move while it lasts.
    let stats = crate::tracker::stats_as_they_stand();
    let tags = tags::all_stats();
    add_sub_blocks(&mut leaks, sub_blocks);
    leaks.retain(|l| !crate::tracker::fork::inherited(l.thread, l.seq));
    leaks.sort_unstable_by_key(|l| (l.thread, l.seq));
    leaks.append(&mut engine_leaks);
    if !ignored.is_empty() {
        for leak in &mut leaks {
            leak.suppressed = ignored
                .rule_for(leak.address, leak.thread, leak.seq)
                .and_then(|rule| IGNORE_RULES.iter().position(|r| *r == rule));
        }
    }
    let nodes = nodes_of(&leaks, linker);
    // Inside another stop (a signal handler's report), threads may be suspended already.
    let suspension = if world.is_outermost() {
        Suspension::suspend_others()
    } else {
        Suspension::none()
    };
    let classified = scan::classify(&nodes, roots, &suspension);
    let unsuspended_threads = suspension.running.clone();
    drop(suspension);
    drop(loader_calls);
    drop(world);
    integrity::report_found();
    integrity::report_all(problems, StackId(0), BlockKind::New);
    integrity::check_quarantine(FoundBy::Report);
    for (leak, verdict) in leaks.iter_mut().zip(classified.verdicts) {
        leak.leak_kind = verdict.kind;
        leak.held_by = verdict.held_by;
    }
    Snapshot {
        leaks,
        unsettled_threads,
        unlisted_allocators,
        unreadable_blocks: classified.unreadable_blocks,
        unsuspended_threads,
        stats,
        tags,
    }
}

/// What [`Report::unlisted_allocators`] names when the pools' sub-blocks could not be read.
pub const EVERY_POOL: &str = "pools";

/// The pools' live sub-blocks (`engine::client_pools`) as leaks, each with whether it lay in a
/// tracked block when it was allocated.
fn pool_sub_blocks() -> Result<Vec<(Leak, bool)>, crate::engine::Busy> {
    let mut sub_blocks = Vec::new();
    crate::engine::client_pools::for_each_sub_block(&mut |pool, address, block| {
        let leak = Leak {
            address,
            size: block.size,
            kind: BlockKind::Named,
            file: None,
            line: 0,
            seq: block.told.seq,
            thread: block.told.thread,
            stack: block.told.stack,
            allocator: Some(pool),
            leak_kind: LeakKind::Direct,
            held_by: None,
            suppressed: None,
            site: 0,
            tag: block.told.tag,
        };
        sub_blocks.push((leak, block.arena.is_some()));
    })?;
    Ok(sub_blocks)
}

/// Adds the pools' sub-blocks to the tracked blocks in `leaks`. A tracked block that holds live
/// sub-blocks (an arena's) is then no block of its own: not a leak, and not scanned but through
/// them (as memcheck treats a block holding mempool chunks), so that no byte is listed twice. A
/// sub-block that lay in a tracked block which no live one holds now went with that memory (the
/// arena was freed without a `pool_reset`): left out.
fn add_sub_blocks(leaks: &mut Vec<Leak>, sub_blocks: Vec<(Leak, bool)>) {
    if sub_blocks.is_empty() {
        return;
    }
    let mut by_address: Vec<(usize, usize)> = leaks
        .iter()
        .enumerate()
        .map(|(i, l)| (l.address, i))
        .collect();
    by_address.sort_unstable();
    let mut arena = vec![false; leaks.len()];
    let mut kept = Vec::with_capacity(sub_blocks.len());
    for (sub, lay_in_tracked_block) in sub_blocks {
        let after = by_address.partition_point(|&(start, _)| start <= sub.address);
        let holder = after
            .checked_sub(1)
            .map(|k| by_address[k].1)
            .filter(|&i| sub.address + sub.size <= leaks[i].address + leaks[i].size.max(1));
        match holder {
            Some(i) => {
                arena[i] = true;
                kept.push(sub);
            }
            None if !lay_in_tracked_block => kept.push(sub),
            None => {}
        }
    }
    let mut at = 0;
    leaks.retain(|_| {
        at += 1;
        !arena[at - 1]
    });
    leaks.append(&mut kept);
}

/// The blocks as the scan sees them. Ignored blocks are roots, and so are the blocks the dynamic
/// linker (its code at `linker`) allocated (as LeakSanitizer counts them): it keeps a loaded
/// library's records and `thread_local` blocks in memory it maps itself, which no scan sees.
fn nodes_of(leaks: &[Leak], linker: core::ops::Range<usize>) -> Vec<Node> {
    let by_linker = |l: &Leak| {
        let innermost = crate::stack::frames(l.stack).iter().next().copied();
        innermost.is_some_and(|address| linker.contains(&address))
    };
    leaks
        .iter()
        .map(|l| Node {
            address: l.address,
            size: l.size,
            root: l.suppressed.is_some() || by_linker(l),
            readable: l.is_readable(),
            whole: true,
        })
        .collect()
}

/// Takes the leaks `gone` picks out of `leaks`; an indirect leak keeps the block it is held by
/// (by its new index), or is held by none when that one went. How many went.
fn remove_leaks(leaks: &mut Vec<Leak>, gone: impl Fn(&Leak) -> bool) -> usize {
    let mut new_index = Vec::with_capacity(leaks.len());
    let mut kept = 0;
    for leak in leaks.iter() {
        let stays = !gone(leak);
        new_index.push(stays.then_some(kept));
        kept += usize::from(stays);
    }
    let before = leaks.len();
    let mut at = 0;
    leaks.retain(|_| {
        at += 1;
        new_index[at - 1].is_some()
    });
    for leak in leaks.iter_mut() {
        leak.held_by = leak.held_by.and_then(|d| new_index[d]);
    }
    before - leaks.len()
}

/// The rules of `ignore_leak` and `ScopedLeakIgnore`: the report's first rules, before those of
/// the `suppressions=` file.
const IGNORE_RULES: [&str; 2] = [ignore::IGNORE_LEAK, ignore::SCOPED];

/// Applies the `leak:` rules to direct and indirect leaks; the blocks a suppressed direct leak
/// holds go with it. Rule indices follow the [`IGNORE_RULES`].
fn suppress_leaks(leaks: &mut [Leak], stacks: &HashMap<StackId, Vec<Frame>>) {
    let suppressions = suppressions();
    if suppressions.rules.is_empty() {
        return;
    }
    let mut by_stack: HashMap<StackId, Option<usize>> = HashMap::new();
    let mut rule_of = |leak: &Leak| {
        *by_stack
            .entry(leak.stack)
            .or_insert_with(|| suppressions.matching("leak", &stacks[&leak.stack]))
    };
    for leak in leaks.iter_mut() {
        if leak.suppressed.is_none() && leak.leak_kind != LeakKind::Reachable {
            leak.suppressed = rule_of(leak).map(|r| IGNORE_RULES.len() + r);
        }
    }
    for i in 0..leaks.len() {
        if leaks[i].suppressed.is_none() {
            if let Some(d) = leaks[i].held_by {
                leaks[i].suppressed = leaks[d].suppressed;
            }
        }
    }
}

/// The rule of `suppressions=` that matches a memory error, by its kind, on either stack.
fn suppressed_error(error: &MemoryError, stacks: &HashMap<StackId, Vec<Frame>>) -> Option<usize> {
    let kind = error.kind.name();
    let rules = suppressions();
    [error.alloc_stack, error.free_stack]
        .iter()
        .find_map(|id| rules.matching(kind, stacks.get(id).map_or(&[], Vec::as_slice)))
}

/// Whether a memory error is suppressed (for the line printed when it happens).
pub fn is_suppressed(error: &MemoryError, alloc: &[Frame], free: &[Frame]) -> bool {
    let rules = suppressions();
    !rules.rules.is_empty()
        && [alloc, free]
            .iter()
            .any(|frames| rules.matching(error.kind.name(), frames).is_some())
}

/// The `suppressions=` file, read once; its warnings go to stderr then.
fn suppressions() -> &'static Suppressions {
    static LOADED: OnceLock<Suppressions> = OnceLock::new();
    LOADED.get_or_init(|| {
        let _inside = Inside::enter();
        let loaded = match &crate::options::get().suppressions {
            Some(path) => Suppressions::load(&crate::sys::from_launch_dir(path.as_str())),
            None => Suppressions::default(),
        };
        for warning in &loaded.warnings {
            crate::sys::write_fd(2, format!("k15-memory: {warning}\n").as_bytes());
        }
        loaded
    })
}

/// Largest total first; ties by the first block's allocation order.
fn sorted_sites(mut sites: Vec<Site<'_>>) -> Vec<Site<'_>> {
    sites.sort_by(|a, b| {
        b.total_bytes
            .cmp(&a.total_bytes)
            .then_with(|| (a.first().thread, a.first().seq).cmp(&(b.first().thread, b.first().seq)))
    });
    sites
}

/// A stack made only by the Rust runtime's start-up (`std::rt::init` and what it calls, before
/// `main`), such as the main thread's stack-overflow guard info: LeakSanitizer suppresses the
/// same kind of blocks of its own runtime.
fn is_rust_runtime_setup(stack: &[Frame]) -> bool {
    let runtime = |f: &Frame| {
        let name = f.function.as_deref().unwrap_or("");
        ["std::", "core::", "alloc::", "<"]
            .iter()
            .any(|p| name.starts_with(p))
    };
    let before_main: Vec<&Frame> = stack
        .iter()
        .take_while(|f| f.function.as_deref() != Some("main"))
        .collect();
    before_main.len() < stack.len()
        && before_main.iter().any(|f| {
            f.function
                .as_deref()
                .is_some_and(|n| n.starts_with("std::rt::"))
        })
        && before_main.iter().all(|f| runtime(f))
}

/// Which file failed, and why.
#[derive(Debug)]
pub struct WriteError {
    pub path: String,
    pub error: std::io::Error,
}

/// Writes the text report to `text_path` and the JSON one to `json_path`, streaming; a failure
/// of one does not stop the other. The error names the file that failed (the text's first).
pub fn write(report: &Report, text_path: &str, json_path: &str) -> Result<(), WriteError> {
    let text = write_file(text_path, |out| text::write(out, report));
    let json = write_file(json_path, |out| json::write(out, report));
    text.and(json)
}

fn write_file(
    path: &str,
    render: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), WriteError> {
    let failed = |error| WriteError {
        path: path.to_owned(),
        error,
    };
    let file = std::fs::File::create(path).map_err(failed)?;
    let mut out = std::io::BufWriter::with_capacity(buffer_bytes(), file);
    render(&mut out).map_err(failed)?;
    out.flush().map_err(failed)
}

/// The report's write buffer: 1 MiB (large reports in few writes), or 4 KiB in a process that
/// cannot have that much (near its address-space limit), where a failed allocation would abort.
fn buffer_bytes() -> usize {
    const LARGE: usize = 1 << 20;
    let mut probe = Vec::<u8>::new();
    if probe.try_reserve_exact(LARGE).is_ok() {
        LARGE
    } else {
        4096
    }
}

/// `write_leak_report(path)`: the report now, to `path` (+ `.json`; `%p` is the pid) or the
/// configured paths.
pub fn write_now(path: Option<&str>) -> bool {
    let _held = crate::sys::CancellationHeld::hold();
    let _headroom = crate::sys::DescriptorHeadroom::raise();
    crate::tracker::apply_deferred_frees();
    let here = 0u8;
    let stack = stack::stack_above(core::ptr::addr_of!(here) as usize);
    let _inside = Inside::enter();
    let report = Report::collect(stack);
    let result = match path {
        Some(p) => {
            let p = destination::with_pid(p);
            write(&report, &p, &format!("{p}.json"))
        }
        None => {
            let to = destination::choose(crate::options::get(), destination::Weight::of(&report));
            write(&report, &to.text, &to.json)
        }
    };
    result.is_ok()
}
