//! The JSON report, format `k15-leaks/1` (SPEC): one entry per leaked block and per error.

use super::Report;
use crate::symbolize::Frame;
use crate::tracker::errors;
use std::fmt::Write;

pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = write_report(&mut out, report);
    out
}

fn write_report(out: &mut String, report: &Report) -> std::fmt::Result {
    writeln!(out, "{{")?;
    writeln!(out, "  \"format\": \"k15-leaks/1\",")?;
    writeln!(
        out,
        "  \"program\": {},",
        quoted(&super::text::program_path())
    )?;
    writeln!(out, "  \"pid\": {},", std::process::id())?;
    writeln!(
        out,
        "  \"summary\": {{ \"leaked_blocks\": {}, \"leaked_bytes\": {}, \"errors\": {}, \"total_allocations\": {}, \"peak_bytes\": {}, \"runtime_blocks\": {} }},",
        report.leaks.len(),
        report.leaked_bytes(),
        report.error_count,
        report.stats.total_allocations,
        report.stats.peak_bytes,
        report.runtime_blocks
    )?;
    writeln!(out, "  \"leaks\": [")?;
    let mut leaks = report
        .sites()
        .into_iter()
        .flat_map(|site| site.leaks)
        .peekable();
    while let Some(l) = leaks.next() {
        write!(
            out,
            "    {{ \"size\": {}, \"array\": {}, \"file\": {}, \"line\": {}, \"seq\": {}, \"thread\": {}, \"language\": {}, \"allocated_with\": {}, \"address\": \"{:#x}\", \"stack\": ",
            l.size,
            l.kind == crate::ffi::BlockKind::NewArray,
            l.file.as_deref().map_or("null".to_owned(), quoted),
            l.line,
            l.seq,
            l.thread,
            quoted(l.language()),
            quoted(l.allocated_with()),
            l.address
        )?;
        write_stack(out, report.frames(l.stack))?;
        writeln!(out, " }}{}", if leaks.peek().is_some() { "," } else { "" })?;
    }
    writeln!(out, "  ],")?;
    writeln!(out, "  \"errors\": [")?;
    for (i, e) in report.errors.iter().enumerate() {
        write!(
            out,
            "    {{ \"kind\": \"{}\", \"address\": \"{:#x}\", \"size\": {}, \"file\": {}, \"line\": {}, \"allocated_with\": {}, \"freed_with\": {}, \"allocator\": {}, \"detail\": {}, \"alloc_stack\": ",
            e.kind.name(),
            e.address,
            e.size,
            e.file.as_deref().map_or("null".to_owned(), quoted),
            e.line,
            e.allocated_with.map_or("null".to_owned(), |k| quoted(errors::family(k))),
            if e.allocator.is_some() { "null".to_owned() } else { quoted(errors::release_family(e.freed_with)) },
            e.allocator.map_or("null".to_owned(), quoted),
            e.detail.map_or("null".to_owned(), quoted),
        )?;
        write_stack(out, report.frames(e.alloc_stack))?;
        write!(out, ", \"free_stack\": ")?;
        write_stack(out, report.frames(e.free_stack))?;
        writeln!(
            out,
            " }}{}",
            if i + 1 < report.errors.len() { "," } else { "" }
        )?;
    }
    writeln!(out, "  ]")?;
    writeln!(out, "}}")
}

fn write_stack(out: &mut String, frames: &[Frame]) -> std::fmt::Result {
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
