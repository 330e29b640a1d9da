//! Process-wide orchestration, the top layer: start-up (the upper layers join the tracker's
//! error printing and `fork` protocol, which cannot name them), and the report at exit.

pub mod at_exit;

use crate::tracker::{errors, fork};

/// Called once from the tracker's module constructor (`cpp/new_delete.cpp`), before `main`
/// or at the `dlopen` that loads the tracker: the tracker itself starts earlier, at the first
/// allocation, and works alone until then (errors recorded meanwhile are printed now).
pub fn start_up() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(join_the_tracker);
}

fn join_the_tracker() {
    crate::sys::note_launch_dir();
    crate::report::destination::join_the_run();
    fork::take_part(fork::ForkPhase::BeforeErrors, |guards| {
        crate::engine::hold_registry_for_fork(guards);
        guards.push(Box::new(crate::engine::lock_names_for_fork()));
        guards.push(Box::new(crate::engine::lock_client_pools_for_fork()));
        guards.push(Box::new(crate::engine::lock_tags_for_fork()));
    });
    fork::take_part(fork::ForkPhase::BeforeShards, |guards| {
        guards.push(Box::new(crate::report::text::lock_symbolizer_for_fork()));
    });
    fork::take_part(fork::ForkPhase::Last, |guards| {
        guards.push(Box::new(crate::report::mappings::lock_for_fork()));
    });
    errors::set_printer(crate::report::text::print_error);
    crate::tracker::timeline::start();
}
