//! `k15-memory export --folded`: leaked bytes (direct and indirect) as folded stacks (`outer;...;inner bytes`), the
//! input of flamegraph.pl, inferno and speedscope.

use crate::report::{printable, Report};
use std::collections::BTreeMap;

/// One line per stack: its frames outermost first, `;`-separated, then its leaked bytes (a `;` in
/// a name written `:`, a control character as an escape, so that each stack stays one line).
pub fn text(report: &Report) -> String {
    let mut bytes: BTreeMap<String, u64> = BTreeMap::new();
    for total in report
        .site_totals()
        .iter()
        .filter(|t| t.kind != "reachable")
    {
        let site = &report.sites[total.site];
        let mut frames: Vec<String> = report
            .frames_of(site.stack)
            .map(|f| printable(&f.name()).replace(';', ":"))
            .collect();
        frames.reverse();
        if frames.is_empty() {
            frames.push("(no call stack)".to_owned());
        }
        let stack_bytes = bytes.entry(frames.join(";")).or_default();
        *stack_bytes = stack_bytes.saturating_add(total.bytes);
    }
    bytes
        .into_iter()
        .map(|(stack, n)| format!("{stack} {n}\n"))
        .collect()
}
