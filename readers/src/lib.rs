//! Readers of k15-memory's JSON leak report: one module per output over one model of the report.

pub mod diff;
pub mod folded;
pub mod html;
pub mod merge;
pub mod pprof;
pub mod report;
pub mod sarif;
pub mod show;
#[cfg(test)]
mod tests;

pub use html::html_from_report_json;
pub use report::{LoadError, Report};
