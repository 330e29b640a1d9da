//! The text report, read like LeakSanitizer's: a summary, the direct leaks by allocation site
//! (largest first, each with the indirect blocks it holds), memory errors with both stacks, the
//! reachable blocks, and what suppressions kept out.

use super::profile;
use super::scan::LeakKind;
use super::{Report, Site, Total};
use crate::stack::StackId;
use crate::symbolize::{Frame, Symbolizer, UNKNOWN_MODULE};
use crate::tracker::errors::{self, MemoryError};
use crate::tracker::frames::{FrameFigures, PerFrame};
use std::fmt::Write as _;
use std::io::{self, Write};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The whole text report into `out`.
pub fn write(out: &mut dyn Write, report: &Report) -> io::Result<()> {
    let direct_sites = report.direct_sites();
    let leaked = report.leaked();
    writeln!(
        out,
        "================================================================="
    )?;
    writeln!(
        out,
        "==k15-memory== pid {} program {}",
        std::process::id(),
        program_path()
    )?;
    if leaked.blocks == 0 {
        writeln!(
            out,
            "No leaks: every tracked block was freed or is still reachable."
        )?;
    } else {
        let direct = report.total(LeakKind::Direct);
        let indirect = report.total(LeakKind::Indirect);
        writeln!(
            out,
            "Detected {} leaked in {} from {}: {} direct, {} indirect.",
            count(leaked.bytes, "byte"),
            count(leaked.blocks, "block"),
            count(direct_sites.len(), "allocation site"),
            direct.blocks,
            indirect.blocks,
        )?;
    }
    for thread in &report.unsettled_threads {
        match thread {
            0 => writeln!(
                out,
                "Blocks of exited threads or of threads sharing a list could not be settled: listed as they were."
            )?,
            n => writeln!(
                out,
                "Blocks of thread {n} could not be settled: listed as they were."
            )?,
        }
    }
    if report.unreadable_blocks > 0 {
        writeln!(
            out,
            "Live blocks with a page that could not be read (made unreadable by the program): {}, scanned around it.",
            report.unreadable_blocks
        )?;
    }
    if !report.unsuspended_threads.is_empty() {
        writeln!(
            out,
            "Threads {:?} could not be suspended for the scan (they block signal {}): read as they ran.",
            report.unsuspended_threads,
            crate::tracker::suspend::suspend_signal()
        )?;
    }
    for &name in &report.unlisted_allocators {
        let whose = match name {
            super::EVERY_ENGINE_ALLOCATOR => "engine allocators".to_owned(),
            name => format!("engine allocator '{name}'"),
        };
        writeln!(
            out,
            "Live blocks of {whose} are not listed: a lock stayed held at exit (by this thread, interrupted inside it by a signal)."
        )?;
    }
    let unrecorded = crate::tracker::unrecorded_frees();
    if unrecorded > 0 {
        writeln!(
            out,
            "{} could not be applied (see docs/limits.md, \"Threads, signals and fork\"): their blocks are in no list and still counted live.",
            count(unrecorded as usize, "free")
        )?;
    }
    let max = crate::options::get().max_leaks;
    let listed = if max == 0 {
        direct_sites.len()
    } else {
        max.min(direct_sites.len())
    };
    for direct in &direct_sites[..listed] {
        writeln!(out)?;
        write_site(out, "Direct leak", &direct.site, "    ")?;
        if direct.held_blocks > 0 {
            writeln!(
                out,
                "  and {} ({}) through {}:",
                count(direct.held_blocks, "indirect block"),
                count(direct.held_bytes, "byte"),
                if direct.site.leaks.len() == 1 {
                    "it"
                } else {
                    "them"
                }
            )?;
            for site in &direct.held {
                write_site(out, "Indirect leak", site, "        ")?;
            }
        }
    }
    if listed < direct_sites.len() {
        let rest = &direct_sites[listed..];
        let blocks: usize = rest
            .iter()
            .map(|d| d.site.leaks.len() + d.held_blocks)
            .sum();
        let bytes: usize = rest.iter().map(|d| d.site.total_bytes + d.held_bytes).sum();
        writeln!(
            out,
            "\n... and {} more direct-leak sites, {} ({}) with what they hold, not listed (max_leaks={max})",
            rest.len(),
            count(blocks, "block"),
            count(bytes, "byte"),
        )?;
    }
    for site in &report.orphan_indirect() {
        writeln!(out)?;
        write_site(
            out,
            "Indirect leak (its direct leak is suppressed)",
            site,
            "    ",
        )?;
    }
    for error in &report.errors {
        writeln!(out)?;
        let mut text = String::new();
        let _ = write_error(
            &mut text,
            error,
            &[
                report.frames(error.alloc_stack),
                report.frames(error.free_stack),
                report.frames(error.previous_free_stack),
            ],
        );
        out.write_all(text.as_bytes())?;
    }
    if report.error_count > report.errors.len() {
        writeln!(
            out,
            "\n... and {} more memory errors, not listed",
            report.error_count - report.errors.len()
        )?;
    }
    write_reachable(out, report)?;
    for rule in report.rules_used() {
        let mut what = Vec::new();
        if rule.blocks > 0 {
            what.push(format!(
                "{} ({})",
                count(rule.blocks, "block"),
                count(rule.bytes, "byte")
            ));
        }
        if rule.errors > 0 {
            what.push(count(rule.errors, "memory error"));
        }
        writeln!(
            out,
            "\nSuppressed: {} by `{}`",
            what.join(" and "),
            rule.rule
        )?;
    }
    if report.runtime_blocks > 0 {
        writeln!(
            out,
            "\n({} the Rust runtime allocated for itself before main not listed.)",
            count(report.runtime_blocks, "block")
        )?;
    }
    write_tags(out, report)?;
    write_profile(out, report)?;
    writeln!(out)?;
    writeln!(
        out,
        "SUMMARY: k15-memory: {} leaked in {}; {}; {} in total, peak {}.",
        count(leaked.bytes, "byte"),
        count(leaked.blocks, "block"),
        count(report.error_count, "memory error"),
        count(report.stats.total_allocations as usize, "allocation"),
        count(report.stats.peak_bytes as usize, "byte"),
    )
}

/// The table of tags (none without tag scopes): a parent's figures include its children's.
fn write_tags(out: &mut dyn Write, report: &Report) -> io::Result<()> {
    if report.tags.is_empty() {
        return write_frames_table(out, report, 5);
    }
    let width = report
        .tags
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(0)
        .max(3);
    writeln!(
        out,
        "\nMemory by tag (a parent's figures include its children's):"
    )?;
    writeln!(
        out,
        "  {:width$}  {:>11}  {:>12}  {:>12}  {:>11}  {:>13}  {:>12}",
        "tag", "live blocks", "live bytes", "peak bytes", "allocations", "total bytes", "budget"
    )?;
    for t in &report.tags {
        let budget = match t.budget_bytes {
            0 => "-".to_owned(),
            bytes => bytes.to_string(),
        };
        writeln!(
            out,
            "  {:width$}  {:>11}  {:>12}  {:>12}  {:>11}  {:>13}  {:>12}",
            t.name,
            t.live_blocks,
            t.live_bytes,
            t.peak_bytes,
            t.total_allocations,
            t.total_bytes,
            budget
        )?;
    }
    write_frames_table(out, report, width)
}

/// Per frame (with frames marked): allocations (mean, most and the frame of the most), frees
/// and bytes allocated, for the process and each tag.
fn write_frames_table(out: &mut dyn Write, report: &Report, width: usize) -> io::Result<()> {
    let frames = &report.frames;
    let n = frames.frames();
    if n == 0 {
        return Ok(());
    }
    writeln!(out, "\nPer frame ({}):", count(n as usize, "frame"))?;
    writeln!(
        out,
        "  {:width$}  {:>11}  {:>16}  {:>10}  {:>12}  {:>16}",
        "tag", "allocations", "most (frame)", "frees", "bytes", "most (frame)"
    )?;
    let row = |out: &mut dyn Write, name: &str, f: &FrameFigures, bytes: bool| {
        let most = |p: &PerFrame| format!("{} ({})", p.max, p.max_frame);
        let (mean_bytes, most_bytes) = if bytes {
            (format!("{:.1}", f.bytes.mean(n)), most(&f.bytes))
        } else {
            ("-".to_owned(), "-".to_owned())
        };
        writeln!(
            out,
            "  {:width$}  {:>11.1}  {:>16}  {:>10.1}  {:>12}  {:>16}",
            name,
            f.allocations.mean(n),
            most(&f.allocations),
            f.frees.mean(n),
            mean_bytes,
            most_bytes
        )
    };
    row(out, "(all)", &frames.process, false)?;
    for t in &report.tags {
        row(out, &t.name, &frames.of(t.id), true)?;
    }
    Ok(())
}

/// With `profile=1`: the sites with the most allocations, then the peak's largest consumers,
/// [`profile::SHOWN`] of each, with their innermost frames.
fn write_profile(out: &mut dyn Write, report: &Report) -> io::Result<()> {
    let Some(p) = &report.profile else {
        return Ok(());
    };
    let listed = p.sites.len() + p.other_sites.sites;
    writeln!(
        out,
        "\nMost allocations ({} of {}; temporary: freed before the thread's next allocation):",
        p.sites.len().min(profile::SHOWN),
        count(listed, "site")
    )?;
    for s in p.sites.iter().take(profile::SHOWN) {
        let figures = format!(
            "{} ({} temporary) of {}",
            count(s.allocations as usize, "allocation"),
            s.temporary,
            count(s.bytes as usize, "byte")
        );
        write_profile_site(out, report, s, &figures)?;
    }
    writeln!(
        out,
        "\nLive at the peak ({} in frame {}; {} of {}):",
        count(p.peak_bytes as usize, "byte"),
        p.peak_frame,
        p.peak.len().min(profile::SHOWN),
        count(p.peak.len() + p.other_peak.sites, "site")
    )?;
    for s in p.peak.iter().take(profile::SHOWN) {
        let figures = format!(
            "{} in {}",
            count(s.peak_bytes as usize, "byte"),
            count(s.peak_blocks as usize, "block")
        );
        write_profile_site(out, report, s, &figures)?;
    }
    if p.uncounted > 0 {
        writeln!(
            out,
            "  ({} of stacks beyond the profile's table are in no site.)",
            count(p.uncounted as usize, "allocation")
        )?;
    }
    Ok(())
}

/// One site of the profile: `figures`, its tag, and its first frames (or its `K15_NEW` place).
fn write_profile_site(
    out: &mut dyn Write,
    report: &Report,
    s: &profile::ProfileSite,
    figures: &str,
) -> io::Result<()> {
    let mut text = format!("  {figures}");
    if let Some(tag) = s.tag_name() {
        let _ = write!(text, ", tag {tag}");
    }
    let frames = report.frames(s.stack);
    match s.file {
        Some(file) if frames.is_empty() => {
            let _ = writeln!(text, ", at {file}:{}", s.line);
        }
        _ => {
            text.push_str(", from:\n");
            let _ = write_frames(
                &mut text,
                &frames[..frames.len().min(PROFILE_FRAMES)],
                "    ",
            );
        }
    }
    out.write_all(text.as_bytes())
}

/// The innermost frames shown of a profile site's stack (the JSON has them all).
const PROFILE_FRAMES: usize = 4;

/// `n thing` or `n things`.
pub fn count(n: usize, thing: &str) -> String {
    format!("{n} {thing}{}", if n == 1 { "" } else { "s" })
}

/// One site: its heading, `K15_NEW` place, stack and the blocks' thread/seq.
fn write_site(out: &mut dyn Write, what: &str, site: &Site<'_>, indent: &str) -> io::Result<()> {
    let first = site.first();
    let blocks = site.leaks.len();
    let heading_indent = &indent[..indent.len() - 4];
    writeln!(
        out,
        "{heading_indent}{what} of {} in {} ({}) allocated from:",
        count(site.total_bytes, "byte"),
        count(blocks, "block"),
        first.allocated_with()
    )?;
    if let Some(file) = first.file {
        writeln!(out, "{indent}at {}:{} (K15_NEW)", file, first.line)?;
    }
    if let Some(tag) = first.tag_name() {
        writeln!(out, "{indent}tag: {tag}")?;
    }
    let mut frames = String::new();
    let _ = write_frames(&mut frames, site.frames, indent);
    out.write_all(frames.as_bytes())?;
    let seqs: Vec<String> = site
        .leaks
        .iter()
        .take(8)
        .map(|l| format!("{}/{}", l.thread, l.seq))
        .collect();
    let more = if blocks > 8 {
        format!(" and {} more", blocks - 8)
    } else {
        String::new()
    };
    writeln!(
        out,
        "{indent}blocks (thread/seq): {}{}",
        seqs.join(", "),
        more
    )
}

/// The reachable blocks: one line per site, or one line in all with `show_reachable=0`.
fn write_reachable(out: &mut dyn Write, report: &Report) -> io::Result<()> {
    let total: Total = report.total(LeakKind::Reachable);
    if total.blocks == 0 {
        return Ok(());
    }
    if !crate::options::get().show_reachable {
        return writeln!(
            out,
            "\nStill reachable: {} in {}, not leaks (show_reachable=1 lists them).",
            count(total.bytes, "byte"),
            count(total.blocks, "block")
        );
    }
    let sites = report.sites(LeakKind::Reachable);
    writeln!(
        out,
        "\nStill reachable: {} in {} from {}, not leaks (a global, thread-local or reachable block points to them):",
        count(total.bytes, "byte"),
        count(total.blocks, "block"),
        count(sites.len(), "site")
    )?;
    for site in &sites {
        let first = site.first();
        let frames = site.frames;
        // The first frame of the program's own sources names the site best (library frames
        // such as basic_string's constructor say little).
        let own = frames
            .iter()
            .find(|f| {
                f.file
                    .as_deref()
                    .is_some_and(|file| file.starts_with('/') && !file.starts_with("/usr/"))
            })
            .or(frames.first());
        let mut place = String::new();
        let _ = match (first.file, own) {
            (Some(file), _) => write!(place, "{file}:{}", first.line),
            (None, Some(frame)) => write_frame(&mut place, frame),
            (None, None) => write!(place, "(no call stack)"),
        };
        writeln!(
            out,
            "    {} in {} ({}) from {}",
            count(site.total_bytes, "byte"),
            count(site.leaks.len(), "block"),
            first.allocated_with(),
            place
        )?;
    }
    Ok(())
}

/// `function file:line`, or `function (module+offset)` without debug info.
fn write_frame(out: &mut String, frame: &Frame) -> std::fmt::Result {
    out.push_str(frame.function.as_deref().unwrap_or("??"));
    match &frame.file {
        Some(file) => write!(out, " {file}:{}", frame.line),
        None => write!(out, " ({}+{:#x})", frame.module, frame.module_offset),
    }
}

fn write_frames(out: &mut String, frames: &[Frame], indent: &str) -> std::fmt::Result {
    if frames.is_empty() {
        return writeln!(
            out,
            "{indent}(no call stack: stack_depth=0, or none could be captured)"
        );
    }
    for (i, frame) in frames.iter().enumerate() {
        write!(out, "{indent}#{i} ")?;
        write_frame(out, frame)?;
        out.push_str(if frame.inlined { " (inlined)\n" } else { "\n" });
    }
    Ok(())
}

/// An error's stacks, symbolized: allocation, free (or the call that found the damage), and the
/// previous free (of a double free, or of a block written after it was freed).
type ErrorStacks<'a> = [&'a [Frame]; 3];

fn write_error(out: &mut String, e: &MemoryError, stacks: &ErrorStacks) -> std::fmt::Result {
    let [alloc, free, previous_free] = stacks;
    if e.kind == errors::ErrorKind::BudgetExceeded {
        writeln!(
            out,
            "Memory error: budget_exceeded: {} bytes could not be allocated: {}",
            e.size,
            e.detail.unwrap_or("")
        )?;
        return write_stack(out, "allocation", e, alloc);
    }
    if let Some(align) = e.alignment {
        writeln!(
            out,
            "Memory error: invalid_alignment: {} of {} asked for an alignment of {align}, which it refuses: the call failed",
            errors::family(e.allocated_with.unwrap_or(e.freed_with)),
            count(e.size, "byte"),
        )?;
        return write_stack(out, "allocation", e, alloc);
    }
    if let Some(over) = &e.over_budget {
        writeln!(
            out,
            "Memory error: tag_over_budget: tag '{}' over its budget of {}: {} live with an allocation of {} (served)",
            crate::tracker::tags::name(over.tag),
            count(over.budget_bytes as usize, "byte"),
            count(over.live_bytes as usize, "byte"),
            count(e.size, "byte")
        )?;
        return write_stack(out, "allocation", e, alloc);
    }
    write!(out, "Memory error: {} of {:#x}", e.kind.name(), e.address)?;
    if e.kind.is_damage() {
        return write_damage(out, e, stacks);
    }
    if let Some(allocator) = e.allocator {
        writeln!(
            out,
            ": {} bytes, given to allocator '{allocator}': {}",
            e.size,
            e.detail.unwrap_or("refused")
        )?;
    } else {
        write_description(out, e)?;
        if let Some(detail) = e.detail {
            writeln!(out, "  ({detail})")?;
        }
    }
    if e.kind != errors::ErrorKind::InvalidFree || !alloc.is_empty() {
        write_stack(out, "allocated", e, alloc)?;
    }
    if e.kind == errors::ErrorKind::DoubleFree && e.previous_free_stack != StackId(0) {
        writeln!(out, "  first released from:")?;
        write_frames(out, previous_free, "    ")?;
    }
    writeln!(out, "  released from:")?;
    write_frames(out, free, "    ")
}

/// Bytes overwritten around or inside a block: which, where, and the stacks of the block and of
/// the call that found them.
fn write_damage(out: &mut String, e: &MemoryError, stacks: &ErrorStacks) -> std::fmt::Result {
    let [alloc, found, previous_free] = stacks;
    let what = match e.kind {
        errors::ErrorKind::Overrun => "written past its end",
        errors::ErrorKind::Underrun => "written in front of its start",
        errors::ErrorKind::UseAfterFree => "written after it was freed",
        _ => "a header overwritten",
    };
    if e.kind == errors::ErrorKind::HeapCorruption {
        write!(out, ": {what}")?;
    } else {
        write!(out, ": {} bytes, {what}", e.size)?;
    }
    if let Some(damage) = &e.damage {
        write!(
            out,
            ": {} byte{} at offset {}: {}",
            damage.len,
            if damage.len == 1 { "" } else { "s" },
            damage.offset,
            damage.hex()
        )?;
    }
    writeln!(out)?;
    if let Some(victim) = e.victim {
        writeln!(
            out,
            "  (it reached the header of the block at {victim:#x} behind it)"
        )?;
    }
    if let Some(detail) = e.detail {
        writeln!(out, "  ({detail})")?;
    }
    if e.kind != errors::ErrorKind::HeapCorruption {
        write_stack(out, "allocated", e, alloc)?;
    }
    // A write after the block's delete: into its bytes, or past its end (quarantine).
    if e.kind == errors::ErrorKind::UseAfterFree
        || (e.kind == errors::ErrorKind::Overrun && e.previous_free_stack != StackId(0))
    {
        writeln!(out, "  freed from:")?;
        write_frames(out, previous_free, "    ")?;
    }
    // An overrun seen at the block's `delete` and confirmed later carries that `delete`'s stack.
    let at_free = e.detail.is_none()
        || e.kind == errors::ErrorKind::HeapCorruption
        || e.detail == Some(crate::tracker::integrity::SEEN_AT_DELETE);
    match found.is_empty() {
        false if at_free => writeln!(out, "  released from:")?,
        false => writeln!(out, "  checked from:")?,
        true if at_free && e.detail.is_none() => writeln!(out, "  released from:")?,
        true => return Ok(()),
    }
    write_frames(out, found, "    ")
}

/// What went wrong with a `new`/`delete`-family free.
fn write_description(out: &mut String, e: &MemoryError) -> std::fmt::Result {
    match e.kind {
        errors::ErrorKind::MismatchedDelete => writeln!(
            out,
            ": {} bytes allocated with {}, released with {} (the block was freed)",
            e.size,
            e.allocated_with.map_or("?", errors::family),
            errors::release_family(e.freed_with)
        ),
        errors::ErrorKind::DoubleFree => {
            writeln!(
                out,
                ": {} bytes, released again with {} (ignored)",
                e.size,
                errors::release_family(e.freed_with)
            )
        }
        _ => match e.interior_offset {
            Some(offset) => writeln!(
                out,
                ": {} of a pointer {offset} bytes into a live block of {} bytes (left alone)",
                errors::release_family(e.freed_with),
                e.size
            ),
            None => writeln!(
                out,
                ": {} of a pointer that no tracked allocation returned (left alone)",
                errors::release_family(e.freed_with)
            ),
        },
    }
}

/// "  allocated at file:line from:" and the frames.
fn write_stack(
    out: &mut String,
    what: &str,
    e: &MemoryError,
    frames: &[Frame],
) -> std::fmt::Result {
    match &e.file {
        Some(file) => writeln!(out, "  {what} at {}:{} from:", file, e.line)?,
        None => writeln!(out, "  {what} from:")?,
    }
    write_frames(out, frames, "    ")
}

/// One symbolizer for the errors printed as they happen: it keeps the frames of every address
/// it has resolved (the debug info it read for them is released after each error, so that a
/// program that goes on after an error does not carry it).
static ERROR_SYMBOLIZER: Mutex<Option<Symbolizer>> = Mutex::new(None);

/// Prints one memory error on stderr at the moment it happens, symbolized.
pub fn print_error(error: &MemoryError) {
    let mut cached = lock_symbolizer_for_fork();
    let symbolizer = cached.get_or_insert_with(Symbolizer::new);
    let symbolize = |symbolizer: &mut Symbolizer| {
        let ids = [
            error.alloc_stack,
            error.free_stack,
            error.previous_free_stack,
        ];
        let stacks = symbolizer.symbolize_stacks(ids);
        // The same id may come twice (two frees from one site): each gets the frames.
        ids.map(|id| stacks.get(&id).cloned().unwrap_or_default())
    };
    let mut stacks = symbolize(symbolizer);
    if stacks.iter().flatten().any(|f| f.module == UNKNOWN_MODULE) {
        // A library loaded since the symbolizer was made: look again with a fresh one.
        *symbolizer = Symbolizer::new();
        stacks = symbolize(symbolizer);
    }
    drop(cached);
    let [alloc, free, previous_free] = &stacks;
    if super::is_suppressed(error, alloc, free) {
        return;
    }
    let mut out = String::from("k15-memory: ");
    let _ = write_error(&mut out, error, &[alloc, free, previous_free]);
    crate::sys::write_fd(2, out.as_bytes());
}

/// The error symbolizer's lock (also held by `fork`, see `tracker::fork`).
pub(crate) fn lock_symbolizer_for_fork() -> MutexGuard<'static, Option<Symbolizer>> {
    ERROR_SYMBOLIZER
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

pub fn program_path() -> String {
    std::fs::read_link("/proc/self/exe")
        .map_or_else(|_| "?".to_owned(), |p| p.display().to_string())
}
