//! `k15-memory show`: the text report, from a JSON one, filtered by kind and tag.

use crate::report::{count, printable, saturating_sum, Report, SiteTotal};
use std::fmt::Write;

/// What `show` lists.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Leak kinds (`direct`, `indirect`, `reachable`), `errors` or `profile`; empty: all.
    pub kinds: Vec<String>,
    /// Only sites of this tag (a parent tag takes in its children: `Render` and `Render/Mesh`).
    pub tag: Option<String>,
    /// At most this many leak sites (largest first); 0: all.
    pub top: usize,
}

impl Filter {
    fn wants(&self, kind: &str) -> bool {
        self.kinds.is_empty() || self.kinds.iter().any(|k| k == kind)
    }
    fn wants_tag(&self, tag: Option<&str>) -> bool {
        match (&self.tag, tag) {
            (None, _) => true,
            (Some(want), Some(tag)) => {
                tag == want
                    || tag
                        .strip_prefix(want.as_str())
                        .is_some_and(|r| r.starts_with('/'))
            }
            (Some(_), None) => false,
        }
    }
}

/// The text report of `report`, as `filter` selects.
pub fn text(report: &Report, filter: &Filter) -> String {
    let mut out = String::new();
    let _ = write_text(&mut out, report, filter);
    out
}

fn write_text(out: &mut String, report: &Report, filter: &Filter) -> std::fmt::Result {
    writeln!(
        out,
        "================================================================="
    )?;
    writeln!(
        out,
        "==k15-memory== pid {} program {}",
        report.pid,
        printable(report.program.as_deref().unwrap_or("?"))
    )?;
    writeln!(
        out,
        "{} leaked in {} ({} direct, {} indirect), {} reachable, {}; {} allocations, peak {} bytes.",
        count(report.figure("leaked_bytes"), "byte"),
        count(report.figure("leaked_blocks"), "block"),
        report.figure("direct_blocks"),
        report.figure("indirect_blocks"),
        count(report.figure("reachable_blocks"), "block"),
        count(report.errors.len() as u64, "memory error"),
        report.figure("total_allocations"),
        report.figure("peak_bytes"),
    )?;
    if !report.processes.is_empty() {
        writeln!(
            out,
            "Merged from {}.",
            count(report.processes.len() as u64, "process")
        )?;
    }
    let sites: Vec<SiteTotal> = report
        .site_totals()
        .into_iter()
        .filter(|t| filter.wants(&t.kind))
        .filter(|t| filter.wants_tag(report.sites[t.site].tag.as_deref()))
        .collect();
    let listed = if filter.top == 0 {
        sites.len()
    } else {
        filter.top.min(sites.len())
    };
    for total in &sites[..listed] {
        writeln!(out)?;
        write_site(out, report, total)?;
    }
    if listed < sites.len() {
        let rest = &sites[listed..];
        writeln!(
            out,
            "\n... and {}, {} ({}), not listed (--top {})",
            count(rest.len() as u64, "more site"),
            count(saturating_sum(rest.iter().map(|t| t.blocks)), "block"),
            count(saturating_sum(rest.iter().map(|t| t.bytes)), "byte"),
            filter.top
        )?;
    }
    if let Some(profile) = report.profile.as_ref().filter(|_| filter.wants("profile")) {
        write_profile(out, report, profile, filter)?;
    }
    if filter.wants("errors") && filter.tag.is_none() {
        for error in &report.errors {
            writeln!(out)?;
            writeln!(
                out,
                "Memory error: {} ({})",
                printable(&error.kind),
                count(error.size(), "byte")
            )?;
            for field in crate::report::ERROR_STACKS {
                if let Some(stack) = error.stack(field) {
                    writeln!(out, "  {}:", field.replace('_', " "))?;
                    write_frames(out, report, Some(stack), "    ")?;
                }
            }
        }
    }
    Ok(())
}

fn write_site(out: &mut String, report: &Report, total: &SiteTotal) -> std::fmt::Result {
    let site = &report.sites[total.site];
    let kind = capitalized(&total.kind);
    write!(
        out,
        "{kind} leak of {} in {} ({})",
        count(total.bytes, "byte"),
        count(total.blocks, "block"),
        printable(site.allocated_with.as_deref().unwrap_or(if site.array {
            "new[]"
        } else {
            "new"
        }))
    )?;
    if let Some(tag) = &site.tag {
        write!(out, " [{}]", printable(tag))?;
    }
    writeln!(out, " allocated from:")?;
    if let Some(file) = &site.file {
        writeln!(out, "    at {}:{} (K15_NEW)", printable(file), site.line)?;
    }
    write_frames(out, report, site.stack, "    ")?;
    if !site.processes.is_empty() {
        let names: Vec<String> = site.processes.iter().map(process_name).collect();
        writeln!(out, "    in {}", printable(&names.join(", ")))?;
    }
    Ok(())
}

/// `word` with its first letter upper-case (by character: a report's strings need not be ASCII).
fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Profile sites listed when `--top` does not say.
const PROFILE_SITES: usize = 10;

/// `profile=1`'s figures: the sites with the most allocations, then what was live at the peak.
fn write_profile(
    out: &mut String,
    report: &Report,
    profile: &crate::report::Profile,
    filter: &Filter,
) -> std::fmt::Result {
    let top = if filter.top == 0 {
        PROFILE_SITES
    } else {
        filter.top
    };
    let sites: Vec<_> = profile
        .sites
        .iter()
        .filter(|s| filter.wants_tag(s.place.tag.as_deref()))
        .collect();
    writeln!(out, "\nMost allocations ({} listed):", top.min(sites.len()))?;
    for s in sites.iter().take(top) {
        write!(
            out,
            "  {} ({} temporary) of {}",
            count(s.allocations, "allocation"),
            s.temporary,
            count(s.bytes, "byte")
        )?;
        write_profile_place(out, report, &s.place)?;
    }
    let Some(peak) = &profile.peak else {
        return Ok(());
    };
    let sites: Vec<_> = peak
        .sites
        .iter()
        .filter(|s| filter.wants_tag(s.place.tag.as_deref()))
        .collect();
    write!(out, "\nLive at the peak ({}", count(peak.bytes, "byte"))?;
    if let Some(frame) = peak.frame {
        write!(out, " in frame {frame}")?;
    }
    writeln!(out, "; {} listed):", top.min(sites.len()))?;
    for s in sites.iter().take(top) {
        write!(
            out,
            "  {} in {}",
            count(s.bytes, "byte"),
            count(s.blocks, "block")
        )?;
        write_profile_place(out, report, &s.place)?;
    }
    Ok(())
}

/// The rest of a profile site's lines: its tag, then its `K15_NEW` place or its stack.
fn write_profile_place(
    out: &mut String,
    report: &Report,
    place: &crate::report::SitePlace,
) -> std::fmt::Result {
    if let Some(tag) = &place.tag {
        write!(out, " [{}]", printable(tag))?;
    }
    match &place.file {
        Some(file) if report.frames_of(place.stack).next().is_none() => {
            writeln!(out, " at {}:{} (K15_NEW)", printable(file), place.line)
        }
        _ => {
            writeln!(out, " from:")?;
            write_frames(out, report, place.stack, "    ")
        }
    }
}

/// `program (pid N)`.
pub fn process_name(p: &crate::report::Process) -> String {
    format!("{} (pid {})", p.program.as_deref().unwrap_or("?"), p.pid)
}

fn write_frames(
    out: &mut String,
    report: &Report,
    stack: Option<usize>,
    indent: &str,
) -> std::fmt::Result {
    if stack.is_none() {
        return writeln!(out, "{indent}(no call stack)");
    }
    for (i, frame) in report.frames_of(stack).enumerate() {
        write!(out, "{indent}#{i} {}", printable(&frame.name()))?;
        if let Some(file) = &frame.file {
            write!(out, " {}:{}", printable(file), frame.line)?;
        }
        writeln!(out, "{}", if frame.inlined { " (inlined)" } else { "" })?;
    }
    Ok(())
}
