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
        crate::tracker::apply_deferred_frees();
    }
    let _inside = crate::tracker::guard::Inside::enter();
    let stats = crate::tracker::stats();
    let errors = crate::tracker::errors::all().1;
    if stats.total_allocations == 0 && errors == 0 && !crate::engine::tracked::any_created() {
        return; // nothing was ever tracked (a Rust test binary that links the library, say)
    }
    // Collected even with report=0: the exit code depends on what it finds.
    let report = super::Report::collect();
    let found_something = !report.leaks.is_empty() || report.error_count > 0;
    if options.report {
        let log_path = options.log_path.as_str();
        match super::write(&report, log_path, &options.json_path()) {
            Ok(()) if found_something => {
                let line = format!(
                    "k15-memory: {} leaked blocks ({} bytes), {} memory errors: see {}\n",
                    report.leaks.len(),
                    report.leaked_bytes(),
                    report.error_count,
                    log_path
                );
                crate::sys::write_fd(2, line.as_bytes());
            }
            Ok(()) => {}
            Err(e) => {
                let line =
                    format!("k15-memory: could not write the leak report to {log_path}: {e}\n");
                crate::sys::write_fd(2, line.as_bytes());
            }
        }
    }
    if options.exitcode != 0 && found_something {
        crate::sys::exit_now(options.exitcode);
    }
}
