//! The JSON report, format `k15-leaks/2`: each distinct stack once in `stacks`, each allocation
//! site once in `sites` (its stack by index), then one short entry per block and per error,
//! written as it goes.

use super::scan::LeakKind;
use super::{Leak, Report};
use crate::stack::StackId;
use crate::symbolize::Frame;
use crate::tracker::errors;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Write};

pub const FORMAT: &str = "k15-leaks/2";

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
        "  \"summary\": {{ \"leaked_blocks\": {}, \"leaked_bytes\": {}, \"direct_blocks\": {}, \"direct_bytes\": {}, \"indirect_blocks\": {}, \"indirect_bytes\": {}, \"reachable_blocks\": {}, \"reachable_bytes\": {}, \"suppressed_blocks\": {}, \"suppressed_bytes\": {}, \"errors\": {}, \"total_allocations\": {}, \"peak_bytes\": {}, \"runtime_blocks\": {} }},",
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
        report.runtime_blocks
    )?;
    let mut stacks = StackTable::default();
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
    let mut sites: HashMap<super::SiteKey, usize> = HashMap::new();
    let mut site_rows = Vec::new();
    let site_ids: Vec<usize> = ordered
        .iter()
        .map(|l| {
            let next = sites.len();
            *sites.entry(l.site_key()).or_insert_with(|| {
                site_rows.push(*l);
                next
            })
        })
        .collect();

    writeln!(out, "  \"sites\": [")?;
    for (i, l) in site_rows.iter().enumerate() {
        writeln!(
            out,
            "    {{ \"stack\": {}, \"array\": {}, \"file\": {}, \"line\": {}, \"language\": \"{}\" }}{}",
            stacks.id(l.stack),
            l.kind == crate::ffi::BlockKind::NewArray,
            l.file.map_or("null".to_owned(), quoted),
            l.line,
            l.language(),
            comma(i, site_rows.len())
        )?;
    }
    writeln!(out, "  ],")?;
    writeln!(out, "  \"leaks\": [")?;
    for (i, (l, site)) in ordered.iter().zip(&site_ids).enumerate() {
        write!(
            out,
            "{{\"site\":{site},\"leak_kind\":\"{}\",\"size\":{},\"seq\":{},\"thread\":{},\"address\":\"{:#x}\"",
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
        writeln!(
            out,
            "    {{ \"kind\": \"{}\", \"address\": \"{:#x}\", \"size\": {}, \"file\": {}, \"line\": {}, \"allocated_with\": {}, \"freed_with\": {}, \"allocator\": {}, \"detail\": {}, \"alloc_stack\": {}, \"free_stack\": {} }}{}",
            e.kind.name(),
            e.address,
            e.size,
            e.file.as_deref().map_or("null".to_owned(), quoted),
            e.line,
            e.allocated_with.map_or("null".to_owned(), |k| quoted(errors::family(k))),
            if e.allocator.is_some() { "null".to_owned() } else { quoted(errors::release_family(e.freed_with)) },
            e.allocator.map_or("null".to_owned(), quoted),
            e.detail.map_or("null".to_owned(), quoted),
            stacks.id(e.alloc_stack),
            stacks.id(e.free_stack),
            comma(i, report.errors.len())
        )?;
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
    writeln!(out, "  \"stacks\": [")?;
    for (i, id) in stacks.order.iter().enumerate() {
        write!(out, "    ")?;
        write_stack(out, report.frames(*id))?;
        writeln!(out, "{}", comma(i, stacks.order.len()))?;
    }
    writeln!(out, "  ]")?;
    writeln!(out, "}}")
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

fn write_stack(out: &mut dyn Write, frames: &[Frame]) -> io::Result<()> {
    write!(out, "[")?;
    for (i, f) in frames.iter().enumerate() {
        write!(
            out,
            "{}{{ \"function\": {}, \"file\": {}, \"line\": {}, \"inlined\": {}, \"address\": \"{:#x}\", \"module\": {} }}",
            if i == 0 { "" } else { ", " },
            f.function.as_deref().map_or("null".to_owned(), quoted),
            f.file.as_deref().map_or("null".to_owned(), quoted),
            f.line,
            f.inlined,
            f.address,
            quoted(&f.module)
        )?;
    }
    write!(out, "]")
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
