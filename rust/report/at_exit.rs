//! The report at exit. `cpp/new_delete.cpp` registers [`run`] from the executable's
//! `.preinit_array` with `__cxa_atexit(fn, nullptr, nullptr)`: registered before anything else,
//! it runs after every static destructor of the executable and of its shared libraries
//! (field notes; proven by `tests/exit_order.rs`). Frees that come later still work.

use core::sync::atomic::{AtomicBool, Ordering};

static DONE: AtomicBool = AtomicBool::new(false);

pub fn run() {
    if DONE.swap(true, Ordering::AcqRel) {
        return;
    }
    let options = crate::options::get();
    let _inside = crate::tracker::guard::Inside::enter();
    crate::tracker::malloc::release_runtime_caches();
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
