//! The JSON report, format `k15-leaks/3`: one short entry per block (its allocation site by
//! index into `sites`) and per error, each site once (its stack by index into `stacks`, its tag
//! by name), each stack once as a list of indices into `frames`, each distinct frame once; the
//! figures of every tag (`tags`); written as it goes. Format 3 keeps every field of format 2.

use super::profile::ProfileSite;
use super::scan::LeakKind;
use super::{Leak, Report};
use crate::stack::StackId;
use crate::symbolize::Frame;
use crate::tracker::errors::{self, MemoryError};
use crate::tracker::frames::PerFrame;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Write};

pub const FORMAT: &str = "k15-leaks/3";

/// The whole JSON report into `out`.
pub fn write(out: &mut dyn Write, report: &Report) -> io::Result<()> {
    let leaked = report.leaked();
    let direct = report.total(LeakKind::Direct);
    let indirect = report.total(LeakKind::Indirect);
    let reachable = report.total(LeakKind::Reachable);
    let suppressed = report.suppressed();
    writeln!(out, "{{")?;
    writeln!(out, "  \"format\": \"{FORMAT}\",")?;
    writeln!(
        out,
        "  \"program\": {},",
        quoted(&super::text::program_path())
    )?;
    writeln!(out, "  \"pid\": {},", std::process::id())?;
    writeln!(
        out,
        "  \"summary\": {{ \"leaked_blocks\": {}, \"leaked_bytes\": {}, \"direct_blocks\": {}, \"direct_bytes\": {}, \"indirect_blocks\": {}, \"indirect_bytes\": {}, \"reachable_blocks\": {}, \"reachable_bytes\": {}, \"suppressed_blocks\": {}, \"suppressed_bytes\": {}, \"errors\": {}, \"total_allocations\": {}, \"peak_bytes\": {}, \"runtime_blocks\": {}, \"unsettled_threads\": {:?}, \"unlisted_engine_allocators\": [{}], \"unrecorded_frees\": {}, \"unreadable_blocks\": {}, \"unsuspended_threads\": {:?}, \"frames_marked\": {} }},",
        leaked.blocks,
        leaked.bytes,
        direct.blocks,
        direct.bytes,
        indirect.blocks,
        indirect.bytes,
        reachable.blocks,
        reachable.bytes,
        suppressed.blocks,
        suppressed.bytes,
        report.error_count,
        report.stats.total_allocations,
        report.stats.peak_bytes,
        report.runtime_blocks,
        report.unsettled_threads,
        report
            .unlisted_allocators
            .iter()
            .map(|name| quoted(name))
            .collect::<Vec<_>>()
            .join(", "),
        crate::tracker::unrecorded_frees(),
        report.unreadable_blocks,
        report.unsuspended_threads,
        report.frames.marks,
    )?;
    write_tags(out, report)?;
    let mut stacks = StackTable::default();
    write_profile(out, report, &mut stacks)?;
    // Blocks in report order: direct sites, each followed by what it holds, then reachable ones.
    let mut ordered: Vec<&Leak> = Vec::with_capacity(report.leaks.len());
    for direct in report.direct_sites() {
        ordered.extend(&direct.site.leaks);
        ordered.extend(direct.held.iter().flat_map(|s| s.leaks.iter().copied()));
    }
    ordered.extend(
        report
            .orphan_indirect()
            .iter()
            .flat_map(|s| s.leaks.iter().copied()),
    );
    ordered.extend(
        report
            .sites(LeakKind::Reachable)
            .iter()
            .flat_map(|s| s.leaks.iter().copied()),
    );
    writeln!(out, "  \"sites\": [")?;
    for (i, &first) in report.site_blocks.iter().enumerate() {
        let l = &report.leaks[first];
        writeln!(
            out,
            "    {{ \"stack\": {}, \"array\": {}, \"file\": {}, \"line\": {}, \"language\": {}, \"allocated_with\": {}, \"tag\": {} }}{}",
            stacks.id(l.stack),
            l.kind == crate::tracker::BlockKind::NewArray,
            l.file.map_or("null".to_owned(), quoted),
            l.line,
            quoted(l.language()),
            quoted(l.allocated_with()),
            l.tag_name().map_or("null".to_owned(), |name| quoted(&name)),
            comma(i, report.site_blocks.len())
        )?;
    }
    writeln!(out, "  ],")?;
    writeln!(out, "  \"leaks\": [")?;
    for (i, l) in ordered.iter().enumerate() {
        write!(
            out,
            "{{\"site\":{},\"leak_kind\":\"{}\",\"size\":{},\"seq\":{},\"thread\":{},\"address\":\"{:#x}\"",
            l.site,
            l.leak_kind.name(),
            l.size,
            l.seq,
            l.thread,
            l.address
        )?;
        if let Some(d) = l.held_by {
            write!(out, ",\"held_by\":\"{:#x}\"", report.leaks[d].address)?;
        }
        writeln!(out, "}}{}", comma(i, ordered.len()))?;
    }
    writeln!(out, "  ],")?;
    writeln!(out, "  \"errors\": [")?;
    for (i, e) in report.errors.iter().enumerate() {
        write!(
            out,
            "    {{ \"kind\": \"{}\", \"address\": \"{:#x}\", \"size\": {}, \"file\": {}, \"line\": {}, \"allocated_with\": {}, \"freed_with\": {}, \"allocator\": {}, \"detail\": {}, \"alloc_stack\": {}, \"free_stack\": {}",
            e.kind.name(),
            e.address,
            e.size,
            e.file.as_deref().map_or("null".to_owned(), quoted),
            e.line,
            e.allocated_with.map_or("null".to_owned(), |k| quoted(errors::family(k))),
            if e.allocator.is_some() || e.over_budget.is_some() || e.alignment.is_some() || (e.kind.is_damage() && e.detail.is_some()) { "null".to_owned() } else { quoted(errors::release_family(e.freed_with)) },
            e.allocator.map_or("null".to_owned(), quoted),
            e.detail.map_or("null".to_owned(), quoted),
            stacks.id(e.alloc_stack),
            stacks.id(e.free_stack),
        )?;
        write_damage_fields(out, e, &mut stacks)?;
        writeln!(out, " }}{}", comma(i, report.errors.len()))?;
    }
    writeln!(out, "  ],")?;
    writeln!(out, "  \"suppressions\": [")?;
    let rules: Vec<_> = report.rules_used().collect();
    for (i, r) in rules.iter().enumerate() {
        writeln!(
            out,
            "    {{ \"rule\": {}, \"blocks\": {}, \"bytes\": {}, \"errors\": {} }}{}",
            quoted(&r.rule),
            r.blocks,
            r.bytes,
            r.errors,
            comma(i, rules.len())
        )?;
    }
    writeln!(out, "  ],")?;
    // Each distinct frame once (stacks share most of theirs), then the stacks as frame lists.
    let mut frames: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
    let mut frame_rows: Vec<&Frame> = Vec::new();
    let stack_rows: Vec<Vec<usize>> = stacks
        .order
        .iter()
        .map(|id| {
            let stack = report.frames(*id);
            stack
                .iter()
                .enumerate()
                .map(|(i, frame)| {
                    // An address's inlined frames, told apart by their distance from the last
                    // of them (the top of a stack may have lost the first ones to trimming);
                    // one address may also name different code in modules loaded at different
                    // times, hence the comparison.
                    let from_end = stack[i..]
                        .iter()
                        .take_while(|f| f.address == frame.address)
                        .count();
                    let rows = frames.entry((frame.address, from_end)).or_default();
                    match rows.iter().find(|&&row| same_frame(frame_rows[row], frame)) {
                        Some(&row) => row,
                        None => {
                            frame_rows.push(frame);
                            rows.push(frame_rows.len() - 1);
                            frame_rows.len() - 1
                        }
                    }
                })
                .collect()
        })
        .collect();
    writeln!(out, "  \"frames\": [")?;
    for (i, frame) in frame_rows.iter().enumerate() {
        write!(out, "    ")?;
        write_frame(out, frame)?;
        writeln!(out, "{}", comma(i, frame_rows.len()))?;
    }
    writeln!(out, "  ],")?;
    writeln!(out, "  \"stacks\": [")?;
    for (i, row) in stack_rows.iter().enumerate() {
        let ids: Vec<String> = row.iter().map(usize::to_string).collect();
        writeln!(out, "    [{}]{}", ids.join(","), comma(i, stack_rows.len()))?;
    }
    writeln!(out, "  ]")?;
    writeln!(out, "}}")
}

/// `tags`: every tag's figures, a parent's including its children's, with what it did per
/// frame; `per_frame`: the process's figures per frame (`frames` is the table of stack frames).
fn write_tags(out: &mut dyn Write, report: &Report) -> io::Result<()> {
    let frames = &report.frames;
    writeln!(out, "  \"tags\": [")?;
    for (i, t) in report.tags.iter().enumerate() {
        let f = frames.of(t.id);
        writeln!(
            out,
            "    {{ \"name\": {}, \"live_blocks\": {}, \"live_bytes\": {}, \"peak_bytes\": {}, \"total_allocations\": {}, \"total_bytes\": {}, \"budget_bytes\": {}, \"per_frame\": {{ \"allocations\": {}, \"frees\": {}, \"bytes\": {} }} }}{}",
            quoted(&t.name),
            t.live_blocks,
            t.live_bytes,
            t.peak_bytes,
            t.total_allocations,
            t.total_bytes,
            t.budget_bytes,
            per_frame(&f.allocations, frames.frames()),
            per_frame(&f.frees, frames.frames()),
            per_frame(&f.bytes, frames.frames()),
            comma(i, report.tags.len())
        )?;
    }
    writeln!(out, "  ],")?;
    writeln!(
        out,
        "  \"per_frame\": {{ \"marked\": {}, \"frames\": {}, \"allocations\": {}, \"frees\": {} }},",
        frames.marks,
        frames.frames(),
        per_frame(&frames.process.allocations, frames.frames()),
        per_frame(&frames.process.frees, frames.frames())
    )
}

/// `profile` (`null` without `profile=1`): the sites with the most allocations and the peak's
/// consumers, each list followed by the sum of the sites it leaves out.
fn write_profile(out: &mut dyn Write, report: &Report, stacks: &mut StackTable) -> io::Result<()> {
    let Some(p) = &report.profile else {
        return writeln!(out, "  \"profile\": null,");
    };
    let place = |s: &ProfileSite, stacks: &mut StackTable| {
        format!(
            "\"stack\": {}, \"tag\": {}, \"file\": {}, \"line\": {}",
            stacks.id(s.stack),
            s.tag_name().map_or("null".to_owned(), |name| quoted(&name)),
            s.file.map_or("null".to_owned(), quoted),
            s.line
        )
    };
    writeln!(out, "  \"profile\": {{")?;
    writeln!(
        out,
        "    \"peak\": {{ \"bytes\": {}, \"frame\": {}, \"other\": {{ \"sites\": {}, \"blocks\": {}, \"bytes\": {} }}, \"sites\": [",
        p.peak_bytes, p.peak_frame, p.other_peak.sites, p.other_peak.peak_blocks, p.other_peak.peak_bytes
    )?;
    for (i, s) in p.peak.iter().enumerate() {
        writeln!(
            out,
            "      {{ {}, \"blocks\": {}, \"bytes\": {} }}{}",
            place(s, stacks),
            s.peak_blocks,
            s.peak_bytes,
            comma(i, p.peak.len())
        )?;
    }
    writeln!(out, "    ] }},")?;
    writeln!(
        out,
        "    \"uncounted_allocations\": {},\n    \"other_sites\": {{ \"sites\": {}, \"allocations\": {}, \"bytes\": {}, \"temporary\": {} }},\n    \"sites\": [",
        p.uncounted, p.other_sites.sites, p.other_sites.allocations, p.other_sites.bytes, p.other_sites.temporary
    )?;
    for (i, s) in p.sites.iter().enumerate() {
        writeln!(
            out,
            "      {{ {}, \"allocations\": {}, \"bytes\": {}, \"temporary\": {} }}{}",
            place(s, stacks),
            s.allocations,
            s.bytes,
            s.temporary,
            comma(i, p.sites.len())
        )?;
    }
    writeln!(out, "    ]\n  }},")
}

/// `{ "mean", "max", "max_frame" }` of a count over `frames` frames.
fn per_frame(figures: &PerFrame, frames: u64) -> String {
    format!(
        "{{ \"mean\": {:.2}, \"max\": {}, \"max_frame\": {} }}",
        figures.mean(frames),
        figures.max,
        figures.max_frame
    )
}

/// The fields of the error kinds that name bytes, a first free, a tag or an alignment: `offset`
/// and `bytes` (hex pairs as found) for damage, `offset` for a pointer inside a block,
/// `previous_free_stack`, a `tag_over_budget`'s `tag`, `budget_bytes` and `live_bytes`, an
/// `invalid_alignment`'s `alignment`, and the `victim` of an `overrun` that reached the header
/// behind its block.
fn write_damage_fields(
    out: &mut dyn Write,
    e: &MemoryError,
    stacks: &mut StackTable,
) -> io::Result<()> {
    if let Some(damage) = &e.damage {
        write!(
            out,
            ", \"offset\": {}, \"bytes\": \"{}\"",
            damage.offset,
            damage.hex()
        )?;
    } else if let Some(offset) = e.interior_offset {
        write!(out, ", \"offset\": {offset}")?;
    }
    if let Some(over) = &e.over_budget {
        write!(
            out,
            ", \"tag\": {}, \"budget_bytes\": {}, \"live_bytes\": {}",
            quoted(&crate::tracker::tags::name(over.tag)),
            over.budget_bytes,
            over.live_bytes
        )?;
    }
    if let Some(align) = e.alignment {
        write!(out, ", \"alignment\": {align}")?;
    }
    if let Some(victim) = e.victim {
        write!(out, ", \"victim\": \"{victim:#x}\"")?;
    }
    if e.previous_free_stack != StackId(0) {
        write!(
            out,
            ", \"previous_free_stack\": {}",
            stacks.id(e.previous_free_stack)
        )?;
    }
    Ok(())
}

/// The stacks the report names, numbered in order of first use.
#[derive(Default)]
struct StackTable {
    ids: HashMap<StackId, usize>,
    order: Vec<StackId>,
}

impl StackTable {
    fn id(&mut self, stack: StackId) -> usize {
        *self.ids.entry(stack).or_insert_with(|| {
            self.order.push(stack);
            self.order.len() - 1
        })
    }
}

fn comma(i: usize, len: usize) -> &'static str {
    if i + 1 < len {
        ","
    } else {
        ""
    }
}

fn same_frame(a: &Frame, b: &Frame) -> bool {
    (&a.function, &a.file, a.line, &a.module) == (&b.function, &b.file, b.line, &b.module)
}

fn write_frame(out: &mut dyn Write, f: &Frame) -> io::Result<()> {
    out.write_all(b"{ \"function\": ")?;
    write_quoted(out, f.function.as_deref())?;
    out.write_all(b", \"file\": ")?;
    write_quoted(out, f.file.as_deref())?;
    write!(
        out,
        ", \"line\": {}, \"inlined\": {}, \"address\": \"{:#x}\", \"module\": ",
        f.line, f.inlined, f.address
    )?;
    write_quoted(out, Some(&f.module))?;
    out.write_all(b" }")
}

/// A JSON string literal, or `null`, straight into `out` (stacks are most of a big report).
fn write_quoted(out: &mut dyn Write, s: Option<&str>) -> io::Result<()> {
    match s {
        None => out.write_all(b"null"),
        Some(s) if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') => {
            out.write_all(b"\"")?;
            out.write_all(s.as_bytes())?;
            out.write_all(b"\"")
        }
        Some(s) => out.write_all(quoted(s).as_bytes()),
    }
}

/// A JSON string literal.
fn quoted(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\t' => q.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(q, "\\u{:04x}", c as u32);
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    #[test]
    fn strings_are_escaped() {
        assert_eq!(super::quoted("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
    }
}
