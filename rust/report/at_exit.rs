//! The report at exit. `cpp/new_delete.cpp` registers [`run`] with `__cxa_atexit` from the
//! destructor of the module that holds the tracker, inside the dynamic linker's `_dl_fini`: it
//! runs after every static destructor of the executable and of its shared libraries, wherever the
//! tracker was linked (proven by `tests/exit_order.rs` and `tests/shared_engine.rs`). Frees that
//! come later still work.

use core::sync::atomic::{AtomicBool, Ordering};

static DONE: AtomicBool = AtomicBool::new(false);

pub fn run() {
    if DONE.swap(true, Ordering::AcqRel) {
        return;
    }
    let options = crate::options::get();
    if !options.report && options.exitcode == 0 {
        return; // nothing to write, nothing to decide
    }
    let me = crate::tracker::guard::me();
    if crate::tracker::in_tracker(me) {
        // `exit` from a signal handler that interrupted this thread inside the tracker: what
        // the thread was changing is read as it stands, and nothing is settled (see
        // `live_list::stop_settling`).
        crate::tracker::live_list::stop_settling();
    } else {
        // Outside the tracker: the caches' frees are to be applied now, not deferred.
        crate::tracker::malloc::release_runtime_caches();
        crate::tracker::apply_deferred_frees();
        crate::tracker::release_free_memory();
    }
    let _inside = crate::tracker::guard::Inside::enter();
    let stats = crate::tracker::stats();
    let errors = crate::tracker::errors::all().1;
    if stats.total_allocations == 0
        && errors == 0
        && !crate::engine::any_tracked_allocator_created()
    {
        return; // nothing was ever tracked (a Rust test binary that links the library, say)
    }
    // Collected even with report=0: the exit code depends on what it finds.
    let report = super::Report::collect(None);
    if options.report {
        let (text_path, json_path) = super::paths(options);
        let line = match super::write(&report, &text_path, &json_path) {
            Ok(()) => format!("{}: see {text_path}\n", summary_line(&report)),
            Err(failed) if failed.path == text_path => {
                // The report must not be lost: all of it goes to stderr instead.
                let mut err = std::io::BufWriter::new(std::io::stderr().lock());
                let _ = super::text::write(&mut err, &report);
                let _ = std::io::Write::flush(&mut err);
                format!(
                    "k15-memory: could not write the leak report to {}: {} (the report is above)\n{}\n",
                    failed.path,
                    failed.error,
                    summary_line(&report)
                )
            }
            Err(failed) => format!(
                "k15-memory: could not write the JSON report to {}: {}\n{}: see {text_path}\n",
                failed.path,
                failed.error,
                summary_line(&report)
            ),
        };
        crate::sys::write_fd(2, line.as_bytes());
    }
    if options.exitcode != 0 && report.counted_for_exit(options.leak_kinds) > 0 {
        crate::sys::exit_now(options.exitcode);
    }
}

/// `k15-memory: 3 leaked blocks (1336 bytes), 2 reachable blocks (96 bytes), 0 memory errors`.
fn summary_line(report: &super::Report) -> String {
    use super::text::count;
    let leaked = report.leaked();
    let reachable = report.total(super::scan::LeakKind::Reachable);
    let mut line = format!(
        "k15-memory: {} ({})",
        count(leaked.blocks, "leaked block"),
        count(leaked.bytes, "byte")
    );
    if reachable.blocks > 0 {
        line += &format!(
            ", {} still reachable ({})",
            count(reachable.blocks, "block"),
            count(reachable.bytes, "byte")
        );
    }
    let suppressed = report.suppressed();
    if suppressed.blocks > 0 {
        line += &format!(", {} suppressed", count(suppressed.blocks, "block"));
    }
    line + &format!(", {}", count(report.error_count, "memory error"))
}
