//! Leak kinds: a conservative pointer scan over the live blocks at report time, from the roots
//! that still exist then (writable data and BSS of every loaded module, the calling thread's TLS,
//! the program's own mappings (`mappings`), the other threads' stacks (`threads`), ignored
//! blocks and those of the dynamic linker; the tracker's own state in them excepted), as
//! valgrind's memcheck and LeakSanitizer do.
//!
//! Stacks: at exit after `main` returned, the calling thread's stack holds only the runtime's
//! and the exit handlers' frames, and stale words there would hide real leaks, so it is not
//! scanned; after the program called `exit` itself, its callers' frames are live and are
//! scanned (`at_exit`). A report written during the run (`write_leak_report`) scans the calling
//! thread's live stack, above its own frame, so the caller's locals keep their blocks
//! reachable. Other threads still alive are suspended for the scan (`tracker::suspend`) and
//! scanned from where they stand, their `thread_local`s and registers with them. A block with a
//! page the program made unreadable is read around that page.
//! Any aligned word whose value falls inside a block (`[start, start + size)`, one byte for a
//! 0-byte block) counts as a pointer to it, interior pointers included.
//!
//! Cycles name their owner: unreached blocks are taken in allocation order (thread, then
//! sequence: the order of the given nodes); each one not yet marked starts a clique (a direct
//! leak) and marks every unreached block it points to, directly or not, as indirect and held by
//! it; an earlier clique reached this way, through any of its members, joins the new one. A
//! cycle with no outside pointer is thus one direct leak, its earliest allocation (the owner
//! whose constructor made the children that point back, as a rule), the rest indirect; the
//! heap's address order plays no part. memcheck takes blocks in address order instead, so the
//! two name the same block of a cycle only where the owner also lies lowest.

use core::ffi::{c_int, c_void};

pub use crate::options::LeakKind;
use crate::sys::{self, PAGE_SIZE};
use crate::tracker::suspend::Suspension;

/// One block's verdict: its kind and, for an indirect block, the direct leak (an index into
/// the blocks given to [`classify`]) that holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub kind: LeakKind,
    pub held_by: Option<usize>,
}

/// A block to classify: where it lies, whether it is a root itself (an ignored block: what it
/// points to is reachable), whether its memory can be read (not so for the blocks an engine
/// allocator left live when it was dropped: its memory is gone), and whether every page of it
/// can (else it is read page by page, around the pages that cannot: see [`classify`]).
#[derive(Clone, Copy)]
pub struct Node {
    pub address: usize,
    pub size: usize,
    pub root: bool,
    pub readable: bool,
    pub whole: bool,
}

/// The roots gathered before the other threads are suspended, each behind a lock one of them
/// may hold: the modules' writable segments and the calling thread's TLS (the loader's lock),
/// and the program's mappings (their record's lock). Scanned once the threads are suspended.
pub struct Roots {
    ranges: Vec<core::ops::Range<usize>>,
    mapped: Vec<core::ops::Range<usize>>,
}

impl Roots {
    /// The roots now, and `stack`: the live part of the calling thread's stack for a report
    /// written during the run.
    pub fn gather(stack: Option<core::ops::Range<usize>>) -> Roots {
        let mut ranges: Vec<core::ops::Range<usize>> = stack.into_iter().collect();
        // SAFETY: the callback matches what dl_iterate_phdr expects and `ranges` outlives the
        // call.
        unsafe { libc::dl_iterate_phdr(Some(add_roots), (&raw mut ranges).cast::<c_void>()) };
        Roots {
            ranges,
            mapped: super::mappings::ranges(),
        }
    }
}

/// What [`classify`] found.
pub struct Classified {
    pub verdicts: Vec<Verdict>,
    /// Blocks with a page that could not be read (the program made it `PROT_NONE`): read
    /// around it.
    pub unreadable_blocks: usize,
}

/// Classifies `nodes` against `roots` and the other threads (see the module doc), those of
/// `suspension` by the registers and stack pointer they were suspended with.
pub fn classify(nodes: &[Node], roots: Roots, suspension: &Suspension) -> Classified {
    // The tracker's own state holds addresses that are not the program's pointers: copies of
    // stack words (the caller's last walk) and block and header addresses, stale ones too (the
    // caller's free lists and deferred frees, the shards' queues of settled frees). A compact
    // block's header address is the user address of the block in front, so such a word would
    // keep a leak in front "reachable".
    let others = crate::tracker::threads::others(suspension);
    let mut excluded = vec![
        crate::stack::tracker_thread_state(),
        crate::tracker::guard::thread_state_range(),
        crate::tracker::thread_heap_range(),
        crate::tracker::integrity::found_log_range(),
        crate::tracker::suspend::records_range(),
        crate::tracker::threads::record_range(),
        crate::engine::address_table_range(),
    ];
    excluded.extend(crate::tracker::live_list::shards_ranges());
    excluded.extend(crate::tracker::large_block_tables_ranges());
    excluded.extend(crate::tracker::statistics_ranges());
    excluded.extend(others.own_state);
    let mut ranges = roots.ranges;
    ranges.push(crate::sys::bytes_of(others.registers.as_slice()));
    // The program's mappings as they are now: those gathered before the suspension may have
    // been unmapped since, their addresses given to the tracker's own memory (a 64 KiB range a
    // thread unmapped, read as a root while it held the tracker's words naming the last 2,597 of
    // 20,000 leaks, kept them "reachable" in one exit of ten: `tests/live_threads_report.rs`).
    let mut mapped = if suspension.holds_every_other() {
        super::mappings::ranges_with_others_suspended(roots.mapped)
    } else {
        roots.mapped
    };
    mapped.extend(others.stacks);
    // Roots gathered before the suspension may be gone since (a plugin's segments, unloaded by
    // `dlclose` meanwhile): read only where memory is readable now, as plain loads there crashed
    // the program (a plugin reloaded while reports were written: `tests/live_threads_report.rs`).
    // `None` where the mappings cannot be read (no descriptor left): everything read as before.
    let readable = readable_ranges();
    if let Some(readable) = &readable {
        ranges = ranges
            .into_iter()
            .flat_map(|range| readable_parts(range, readable))
            .collect();
    }
    let nodes: Vec<Node> = nodes
        .iter()
        .map(|node| Node {
            whole: node.whole
                && readable
                    .as_ref()
                    .is_none_or(|readable| covered(readable, node.address, node.size.max(1))),
            ..*node
        })
        .collect();
    Classified {
        verdicts: classify_from(&nodes, &ranges, &mapped, &excluded),
        unreadable_blocks: nodes.iter().filter(|n| n.readable && !n.whole).count(),
    }
}

/// The readable mappings of the process now (`/proc/self/maps`), sorted, touching ones merged;
/// `None` if they cannot be read.
fn readable_ranges() -> Option<Vec<core::ops::Range<usize>>> {
    let text = std::fs::read_to_string("/proc/self/maps").ok()?;
    let mut ranges: Vec<core::ops::Range<usize>> = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(span), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((start, end)) = span.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        if !perms.starts_with('r') {
            continue;
        }
        match ranges.last_mut() {
            Some(last) if last.end == start => last.end = end,
            _ => ranges.push(start..end),
        }
    }
    Some(ranges)
}

/// Whether `[address, address + size)` lies inside one of the sorted `ranges`.
/// The parts of `range` that the sorted, apart `readable` ranges hold.
fn readable_parts(
    range: core::ops::Range<usize>,
    readable: &[core::ops::Range<usize>],
) -> impl Iterator<Item = core::ops::Range<usize>> + '_ {
    let first = readable.partition_point(|r| r.end <= range.start);
    readable[first..]
        .iter()
        .take_while(move |r| r.start < range.end)
        .map(move |r| r.start.max(range.start)..r.end.min(range.end))
}

fn covered(ranges: &[core::ops::Range<usize>], address: usize, size: usize) -> bool {
    let after = ranges.partition_point(|r| r.start <= address);
    after > 0 && address.saturating_add(size) <= ranges[after - 1].end
}

/// [`classify`] of `nodes` given in allocation order (earliest first), from the given root ranges and the `mapped` ones (the program's mappings and
/// the other threads' stacks: read only where they hold memory, and as far as they can be
/// read), skipping the words of the `excluded` ranges (the tracker's own state).
pub fn classify_from(
    nodes: &[Node],
    roots: &[core::ops::Range<usize>],
    mapped: &[core::ops::Range<usize>],
    excluded: &[core::ops::Range<usize>],
) -> Vec<Verdict> {
    let graph = Graph::new(nodes);
    let mut reached = vec![false; nodes.len()];
    let mut work = Vec::new();
    let mut reach = |i: usize| {
        if !reached[i] {
            reached[i] = true;
            work.push(i);
        }
    };
    for range in roots {
        for (lo, hi) in uncovered(range.clone(), excluded) {
            graph.scan(lo, hi, &mut reach);
        }
    }
    for range in mapped {
        for (lo, hi) in uncovered(range.clone(), excluded) {
            graph.scan_mapped(lo, hi, &mut reach);
        }
    }
    for (i, node) in nodes.iter().enumerate() {
        if node.root && !reached[i] {
            reached[i] = true;
            work.push(i);
        }
    }
    while let Some(i) = work.pop() {
        graph.scan_block(i, &mut |j| {
            if !reached[j] {
                reached[j] = true;
                work.push(j);
            }
        });
    }
    let mut verdicts: Vec<Verdict> = reached
        .iter()
        .map(|&r| Verdict {
            kind: if r {
                LeakKind::Reachable
            } else {
                LeakKind::Direct
            },
            held_by: None,
        })
        .collect();
    // Cliques, in allocation order (see the module doc).
    let mut clique_of: Vec<Option<usize>> = vec![None; nodes.len()];
    for leader in 0..nodes.len() {
        if reached[leader] || clique_of[leader].is_some() {
            continue;
        }
        clique_of[leader] = Some(leader);
        work.push(leader);
        while let Some(i) = work.pop() {
            graph.scan_block(i, &mut |j| {
                if reached[j] {
                    return;
                }
                match clique_of[j] {
                    None => {
                        clique_of[j] = Some(leader);
                        work.push(j);
                    }
                    // A member of an earlier clique: that clique joins this one.
                    Some(_) => {
                        let head = clique_head(&clique_of, j);
                        if head != leader {
                            clique_of[head] = Some(leader);
                        }
                    }
                }
            });
        }
    }
    for i in 0..nodes.len() {
        if reached[i] {
            continue;
        }
        let head = clique_head(&clique_of, i);
        if head != i {
            verdicts[i] = Verdict {
                kind: LeakKind::Indirect,
                held_by: Some(head),
            };
        }
    }
    verdicts
}

/// The direct leak that holds unreached block `i` in the end: its clique's head, or the head of
/// the clique that one joined, and so on.
fn clique_head(clique_of: &[Option<usize>], i: usize) -> usize {
    let mut head = clique_of[i].unwrap_or(i);
    while clique_of[head] != Some(head) {
        head = clique_of[head].unwrap_or(head);
    }
    head
}

/// The blocks sorted by address, for finding the block a word points into.
struct Graph<'a> {
    nodes: &'a [Node],
    by_address: Vec<usize>,
    starts: Vec<usize>,
}

impl<'a> Graph<'a> {
    fn new(nodes: &'a [Node]) -> Self {
        let mut by_address: Vec<usize> = (0..nodes.len()).collect();
        by_address.sort_unstable_by_key(|&i| nodes[i].address);
        let starts = by_address.iter().map(|&i| nodes[i].address).collect();
        Graph {
            nodes,
            by_address,
            starts,
        }
    }

    /// The block `value` points into.
    #[inline]
    fn find(&self, value: usize) -> Option<usize> {
        let after = self.starts.partition_point(|&start| start <= value);
        let i = self.by_address[after.checked_sub(1)?];
        let node = &self.nodes[i];
        (value - node.address < node.size.max(1)).then_some(i)
    }

    /// The addresses any block covers lie in `[first, limit)`; `None` without blocks.
    fn span(&self) -> Option<(usize, usize)> {
        let (&first, &last) = (self.starts.first()?, self.starts.last()?);
        Some((
            first,
            last + self.nodes[*self.by_address.last()?].size.max(1),
        ))
    }

    /// Calls `found` for the block `value` points into, if any (`span`: [`Graph::span`]).
    #[inline]
    fn visit(&self, value: usize, (first, limit): (usize, usize), found: &mut impl FnMut(usize)) {
        if value >= first && value < limit {
            if let Some(i) = self.find(value) {
                found(i);
            }
        }
    }

    /// Calls `found` for each block that an aligned word of `[lo, hi)` points into.
    fn scan(&self, lo: usize, hi: usize, found: &mut impl FnMut(usize)) {
        let Some((first, limit)) = self.span() else {
            return;
        };
        let word = core::mem::size_of::<usize>();
        let mut at = lo.next_multiple_of(word);
        while at + word <= hi {
            // SAFETY: `[lo, hi)` is mapped readable memory (a module's writable segment, TLS
            // or a live block); a volatile read of a word another thread may be writing is
            // what a conservative scan does.
            let value = unsafe { core::ptr::read_volatile(at as *const usize) };
            self.visit(value, (first, limit), found);
            at += word;
        }
    }

    /// [`Graph::scan`] of memory that may change or go while it is read (the program's mappings,
    /// other threads' stacks): pages never touched (most of a large reservation) are skipped,
    /// and the others are read through a copy that stops at pages which cannot be read
    /// (`PROT_NONE`, or unmapped meanwhile by another thread).
    fn scan_mapped(&self, lo: usize, hi: usize, found: &mut impl FnMut(usize)) {
        /// Pages asked about in one `mincore` call (16 MiB).
        const CHUNK_PAGES: usize = 4096;
        let Some((first, limit)) = self.span() else {
            return;
        };
        let mut residency = vec![0u8; CHUNK_PAGES];
        let mut copy = vec![0usize; 16 * PAGE_SIZE / core::mem::size_of::<usize>()];
        let word = core::mem::size_of::<usize>();
        let (lo, hi) = (lo.next_multiple_of(word), hi & !(word - 1));
        let mut chunk = lo & !(PAGE_SIZE - 1);
        while chunk < hi {
            let pages = (hi - chunk).div_ceil(PAGE_SIZE).min(CHUNK_PAGES);
            let residency = &mut residency[..pages];
            if !sys::resident_pages(chunk, residency) {
                residency.fill(1); // part of it is gone: each page is tried, and reads stop there
            }
            let mut page = 0;
            while page < pages {
                if residency[page] == 0 {
                    page += 1;
                    continue;
                }
                let run = residency[page..].iter().take_while(|&&r| r != 0).count();
                let mut at = (chunk + page * PAGE_SIZE).max(lo);
                let end = (chunk + (page + run) * PAGE_SIZE).min(hi);
                while at < end {
                    // No further than the copy's pages from `at`'s page: a short read then
                    // means a page that cannot be read.
                    let window = (copy.len() * word - at % PAGE_SIZE) / word;
                    let wanted = ((end - at) / word).min(window);
                    let got = sys::read_words(at, &mut copy[..wanted]);
                    for &value in &copy[..got] {
                        self.visit(value, (first, limit), found);
                    }
                    at += got * word;
                    if got < wanted {
                        at = (at & !(PAGE_SIZE - 1)) + PAGE_SIZE; // that page cannot be read
                    }
                }
                page += run;
            }
            chunk += pages * PAGE_SIZE;
        }
    }

    fn scan_block(&self, i: usize, found: &mut impl FnMut(usize)) {
        let node = self.nodes[i];
        if node.readable && node.whole {
            self.scan(node.address, node.address + node.size, found);
        } else if node.readable {
            self.scan_mapped(node.address, node.address + node.size, found);
        }
    }
}

/// The parts of `range` that no range of `holes` covers, in address order.
pub(super) fn uncovered(
    range: core::ops::Range<usize>,
    holes: &[core::ops::Range<usize>],
) -> Vec<(usize, usize)> {
    let mut holes: Vec<_> = holes
        .iter()
        .filter(|h| h.start < range.end && h.end > range.start)
        .collect();
    holes.sort_unstable_by_key(|h| h.start);
    let mut parts = Vec::new();
    let mut from = range.start;
    for hole in holes {
        if hole.start > from {
            parts.push((from, hole.start));
        }
        from = from.max(hole.end);
    }
    if from < range.end {
        parts.push((from, range.end));
    }
    parts
}

/// The addresses of the dynamic linker's loaded segments (empty in a static program).
pub fn dynamic_linker() -> core::ops::Range<usize> {
    // SAFETY: getauxval only reads the auxiliary vector the kernel passed.
    let base = unsafe { libc::getauxval(libc::AT_BASE) } as usize;
    let mut span = (base, 0..0);
    if base != 0 {
        // SAFETY: the callback matches what dl_iterate_phdr expects and `span` outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(loaded_span), (&raw mut span).cast::<c_void>()) };
    }
    span.1
}

/// `dl_iterate_phdr` callback: for the module loaded at `data.0`, the span of its `PT_LOAD`
/// segments into `data.1`.
unsafe extern "C" fn loaded_span(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info for the call; `data` is `dynamic_linker`'s.
    let (info, span) = unsafe {
        (
            &*info,
            &mut *data.cast::<(usize, core::ops::Range<usize>)>(),
        )
    };
    if info.dlpi_addr as usize != span.0 || info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: `dlpi_phdr` points to `dlpi_phnum` program headers.
    let headers = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
    let loads = headers.iter().filter(|h| h.p_type == libc::PT_LOAD);
    let starts = loads.clone().map(|h| span.0 + h.p_vaddr as usize);
    let ends = loads.map(|h| span.0 + (h.p_vaddr + h.p_memsz) as usize);
    span.1 = starts.min().unwrap_or(0)..ends.max().unwrap_or(0);
    1
}

/// `dl_iterate_phdr` callback: the module's writable `PT_LOAD` segments and the calling
/// thread's block of its `PT_TLS`.
unsafe extern "C" fn add_roots(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info for the call; `data` is the Vec of `classify`.
    let (info, roots) = unsafe { (&*info, &mut *data.cast::<Vec<core::ops::Range<usize>>>()) };
    if info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: `dlpi_phdr` points to `dlpi_phnum` program headers.
    let headers = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
    for header in headers {
        let start = info.dlpi_addr as usize + header.p_vaddr as usize;
        let len = header.p_memsz as usize;
        match header.p_type {
            libc::PT_LOAD if header.p_flags & libc::PF_W != 0 => roots.push(start..start + len),
            libc::PT_TLS if !info.dlpi_tls_data.is_null() => {
                let tls = info.dlpi_tls_data as usize;
                roots.push(tls..tls + len);
            }
            _ => {}
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes of plain boxed blocks (readable, not roots).
    fn nodes_of<const WORDS: usize>(blocks: &[Box<[usize; WORDS]>]) -> Vec<Node> {
        let node = |b: &[usize; WORDS]| Node {
            address: b.as_ptr() as usize,
            size: 8 * WORDS,
            root: false,
            readable: true,
            whole: true,
        };
        blocks.iter().map(|b| node(b)).collect()
    }

    /// Blocks laid out in a plain buffer: `links[i]` lists the blocks block `i` points to.
    fn verdicts(links: &[&[usize]], roots: &[usize]) -> Vec<Verdict> {
        verdicts_at(links, roots, Layout::Ascending)
    }

    /// Where the blocks of [`verdicts_at`] lie, by allocation order.
    #[derive(Clone, Copy, Debug)]
    enum Layout {
        /// The earliest allocation lowest.
        Ascending,
        /// The earliest allocation highest.
        Descending,
    }

    /// [`verdicts`] with the blocks laid out in one buffer in the given address order.
    fn verdicts_at(links: &[&[usize]], roots: &[usize], layout: Layout) -> Vec<Verdict> {
        const WORDS: usize = 4;
        let mut memory = vec![0usize; WORDS * links.len()];
        let base = memory.as_ptr() as usize;
        let slot_of = |i: usize| match layout {
            Layout::Ascending => i,
            Layout::Descending => links.len() - 1 - i,
        };
        let nodes: Vec<Node> = (0..links.len())
            .map(|i| Node {
                address: base + 8 * WORDS * slot_of(i),
                size: 8 * WORDS,
                root: false,
                readable: true,
                whole: true,
            })
            .collect();
        for (i, targets) in links.iter().enumerate() {
            for (slot, &t) in targets.iter().enumerate() {
                // Interior pointers count too.
                memory[WORDS * slot_of(i) + slot] = nodes[t].address + 8 * slot;
            }
        }
        let root_words: Vec<usize> = roots.iter().map(|&r| nodes[r].address).collect();
        let root = root_words.as_ptr() as usize..root_words.as_ptr() as usize + 8 * roots.len();
        let verdicts = classify_from(&nodes, &[root], &[], &[]);
        drop(memory);
        verdicts
    }

    fn kinds(v: &[Verdict]) -> Vec<(LeakKind, Option<usize>)> {
        v.iter().map(|v| (v.kind, v.held_by)).collect()
    }

    #[test]
    fn a_lost_owner_is_direct_and_what_it_owns_indirect() {
        use LeakKind::*;
        let v = verdicts(&[&[1, 2], &[3], &[], &[], &[]], &[4]);
        assert_eq!(
            kinds(&v),
            [
                (Direct, None),
                (Indirect, Some(0)),
                (Indirect, Some(0)),
                (Indirect, Some(0)),
                (Reachable, None)
            ]
        );
    }

    #[test]
    fn a_cycle_with_no_outside_pointer_is_one_direct_leak_its_earliest_allocation() {
        use LeakKind::*;
        for layout in [Layout::Ascending, Layout::Descending] {
            // An owner (0) whose children (1, 2) point back to it, and a grandchild (3).
            let v = verdicts_at(&[&[1, 2], &[0, 3], &[0], &[1]], &[], layout);
            assert_eq!(
                kinds(&v),
                [
                    (Direct, None),
                    (Indirect, Some(0)),
                    (Indirect, Some(0)),
                    (Indirect, Some(0))
                ],
                "{layout:?}"
            );
        }
    }

    #[test]
    fn an_earlier_clique_reached_later_joins_the_later_one() {
        // Whatever the address order, block 2 owns 0 and 1: one direct leak.
        for layout in [Layout::Ascending, Layout::Descending] {
            let v = verdicts_at(&[&[1], &[], &[0]], &[], layout);
            assert_eq!(v[2].kind, LeakKind::Direct, "{layout:?}");
            assert_eq!(v[0].held_by, Some(2), "{layout:?}");
            assert_eq!(v[1].held_by, Some(2), "{layout:?}");
        }
    }

    #[test]
    fn a_clique_reached_through_any_member_joins_the_block_that_reaches_it() {
        use LeakKind::*;
        for layout in [Layout::Ascending, Layout::Descending] {
            // 0 and 1 point to each other; 2, allocated later, points to 1 (not 0, the head).
            let v = verdicts_at(&[&[1], &[0], &[1]], &[], layout);
            assert_eq!(
                kinds(&v),
                [(Indirect, Some(2)), (Indirect, Some(2)), (Direct, None)],
                "{layout:?}"
            );
        }
    }

    #[test]
    fn a_mapped_root_is_read_whole_from_an_unaligned_start_but_not_where_it_cannot_be_read() {
        const PAGES: usize = 40;
        let mapping = crate::sys::map_pages(PAGES * PAGE_SIZE) as usize;
        assert_ne!(mapping, 0);
        let blocks: Vec<Box<[usize; 2]>> = (0..4).map(|_| Box::new([0usize; 2])).collect();
        let nodes = nodes_of(&blocks);
        // Block 0 held just above the start, 1 just past the first 16 pages one read copies (the
        // start is not page-aligned, as another thread's stack pointer is not), 2 on a page made
        // unreadable, 3 nowhere.
        let put = |page: usize, offset: usize, word: usize| {
            let at = (mapping + page * PAGE_SIZE + offset) as *mut usize;
            // SAFETY: a word of the mapping above, which this test alone uses.
            unsafe { at.write(word) };
        };
        for page in 0..20 {
            put(page, 0x100, 0); // written, so resident: the first 20 pages are one run
        }
        put(0, 0x810, nodes[0].address);
        put(16, 0x10, nodes[1].address);
        put(30, 0, nodes[2].address);
        // SAFETY: a page of the test's own mapping.
        unsafe { libc::mprotect((mapping + 30 * PAGE_SIZE) as *mut _, PAGE_SIZE, 0) };
        let root = mapping + 0x808..mapping + PAGES * PAGE_SIZE;
        let v = classify_from(&nodes, &[], &[root], &[]);
        let reached: Vec<bool> = v.iter().map(|v| v.kind == LeakKind::Reachable).collect();
        assert_eq!(reached, [true, true, false, false]);
        // SAFETY: the test's own mapping, unused from here on.
        unsafe { crate::sys::unmap_pages(mapping as *mut u8, PAGES * PAGE_SIZE) };
    }

    #[test]
    fn ignored_blocks_are_roots() {
        let memory = [Box::new([0usize; 2]), Box::new([0usize; 2])];
        let nodes = [
            Node {
                address: memory[0].as_ptr() as usize,
                size: 16,
                root: true,
                readable: true,
                whole: true,
            },
            Node {
                address: memory[1].as_ptr() as usize,
                size: 16,
                root: false,
                readable: true,
                whole: true,
            },
        ];
        let mut memory = memory;
        memory[0][1] = nodes[1].address;
        let v = classify_from(&nodes, &[], &[], &[]);
        assert!(v.iter().all(|v| v.kind == LeakKind::Reachable), "{v:?}");
    }

    #[test]
    fn excluded_ranges_are_cut_out_of_the_roots() {
        assert_eq!(uncovered(0..100, &[]), [(0, 100)]);
        assert_eq!(
            uncovered(0..100, &[40..50, 10..20]),
            [(0, 10), (20, 40), (50, 100)]
        );
        assert_eq!(uncovered(10..20, &[0..15, 18..30, 200..300]), [(15, 18)]);
        assert_eq!(uncovered(10..20, &[0..15, 15..30]), []);
        assert_eq!(uncovered(10..20, &[12..14, 13..16]), [(10, 12), (16, 20)]);
    }
}
