//! The text report, read like LeakSanitizer's: a summary, then one entry per allocation site,
//! largest total first, each with its symbolized stack; memory errors with both stacks.

use super::Report;
use crate::stack;
use crate::symbolize::{Frame, Symbolizer, UNKNOWN_MODULE};
use crate::tracker::errors::{self, MemoryError};
use std::fmt::Write;
use std::sync::{Mutex, MutexGuard, PoisonError};

pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = write_report(&mut out, report);
    out
}

fn write_report(out: &mut String, report: &Report) -> std::fmt::Result {
    let sites = report.sites();
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
    if report.leaks.is_empty() {
        writeln!(out, "No leaks: every tracked block was freed.")?;
    } else {
        writeln!(
            out,
            "Detected {} leaked bytes in {} blocks from {} allocation sites.",
            report.leaked_bytes(),
            report.leaks.len(),
            sites.len()
        )?;
    }
    for site in &sites {
        let first = site.leaks[0];
        let blocks = site.leaks.len();
        writeln!(out)?;
        writeln!(
            out,
            "Leak of {} bytes in {} block{} ({}) allocated from:",
            site.total_bytes,
            blocks,
            if blocks == 1 { "" } else { "s" },
            first
                .allocator
                .unwrap_or_else(|| errors::family(first.kind))
        )?;
        if let Some(file) = &first.file {
            writeln!(out, "    at {}:{} (K15_NEW)", file, first.line)?;
        }
        write_frames(out, report.frames(first.stack), "    ")?;
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
        writeln!(out, "    blocks (thread/seq): {}{}", seqs.join(", "), more)?;
    }
    for error in &report.errors {
        writeln!(out)?;
        write_error(
            out,
            error,
            report.frames(error.alloc_stack),
            report.frames(error.free_stack),
        )?;
    }
    if report.runtime_blocks > 0 {
        writeln!(
            out,
            "\n({} blocks the Rust runtime allocated for itself before main are not listed.)",
            report.runtime_blocks
        )?;
    }
    if report.error_count > report.errors.len() {
        writeln!(
            out,
            "\n... and {} more memory errors, not listed",
            report.error_count - report.errors.len()
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "SUMMARY: k15-memory: {} bytes leaked in {} blocks; {} memory errors; {} allocations in total, peak {} bytes.",
        report.leaked_bytes(),
        report.leaks.len(),
        report.error_count,
        report.stats.total_allocations,
        report.stats.peak_bytes
    )
}

fn write_frames(out: &mut String, frames: &[Frame], indent: &str) -> std::fmt::Result {
    if frames.is_empty() {
        return writeln!(
            out,
            "{indent}(no call stack: stack_depth=0, or none could be captured)"
        );
    }
    for (i, frame) in frames.iter().enumerate() {
        write!(
            out,
            "{indent}#{i} {}",
            frame.function.as_deref().unwrap_or("??")
        )?;
        match &frame.file {
            Some(file) => write!(out, " {}:{}", file, frame.line)?,
            None => write!(out, " ({}+{:#x})", frame.module, frame.module_offset)?,
        }
        writeln!(out, "{}", if frame.inlined { " (inlined)" } else { "" })?;
    }
    Ok(())
}

fn write_error(
    out: &mut String,
    e: &MemoryError,
    alloc: &[Frame],
    free: &[Frame],
) -> std::fmt::Result {
    if e.kind == errors::ErrorKind::BudgetExceeded {
        writeln!(
            out,
            "Memory error: budget_exceeded: {} bytes could not be allocated: {}",
            e.size,
            e.detail.unwrap_or("")
        )?;
        return write_stack(out, "allocation", e, alloc);
    }
    write!(out, "Memory error: {} of {:#x}", e.kind.name(), e.address)?;
    if let Some(allocator) = e.allocator {
        writeln!(
            out,
            ": {} bytes, given to allocator '{allocator}': {}",
            e.size,
            e.detail.unwrap_or("refused")
        )?;
    } else {
        write_description(out, e)?;
    }
    if e.kind != errors::ErrorKind::InvalidFree {
        write_stack(out, "allocated", e, alloc)?;
    }
    writeln!(out, "  released from:")?;
    write_frames(out, free, "    ")
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
        errors::ErrorKind::InvalidFree | errors::ErrorKind::BudgetExceeded => writeln!(
            out,
            ": {} of a pointer that no tracked allocation returned (left alone)",
            errors::release_family(e.freed_with)
        ),
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

/// One symbolizer for the errors printed as they happen: building one reads debug info, too
/// slow to repeat for every error.
static ERROR_SYMBOLIZER: Mutex<Option<Symbolizer>> = Mutex::new(None);

/// Prints one memory error on stderr at the moment it happens, symbolized.
pub fn print_error(error: &MemoryError) {
    let mut cached = lock_symbolizer_for_fork();
    let symbolizer = cached.get_or_insert_with(Symbolizer::new);
    let symbolize = |symbolizer: &mut Symbolizer| {
        let alloc = symbolizer.symbolize_stack(&stack::frames(error.alloc_stack));
        let free = symbolizer.symbolize_stack(&stack::frames(error.free_stack));
        (alloc, free)
    };
    let (mut alloc, mut free) = symbolize(symbolizer);
    if alloc
        .iter()
        .chain(&free)
        .any(|f| f.module == UNKNOWN_MODULE)
    {
        // A library loaded since the symbolizer was made: look again with a fresh one.
        *symbolizer = Symbolizer::new();
        (alloc, free) = symbolize(symbolizer);
    }
    drop(cached);
    let mut out = String::from("k15-memory: ");
    let _ = write_error(&mut out, error, &alloc, &free);
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
