//! `k15-memory diff`: leak and error sites new, gone and grown between two reports, matched
//! by the functions and file names of their frames, so that two builds match where code moved.

use crate::report::{base_name, printable, Report};
use serde::Serialize;
use std::collections::BTreeMap;

/// One site's frame as `diff --json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct FrameOut {
    pub function: String,
    pub file: Option<String>,
    pub line: u64,
}

/// A leak site (`kind` is its leak kind) or an error site (`kind` is the error's kind).
#[derive(Debug, Clone, Serialize)]
pub struct SiteChange {
    pub kind: String,
    pub blocks: u64,
    pub bytes: u64,
    pub base_blocks: u64,
    pub base_bytes: u64,
    /// Innermost frame first, from NEW (from BASE for a site that is gone).
    pub stack: Vec<FrameOut>,
}

impl SiteChange {
    /// Whether NEW having this site fails the gate: a leak (not merely reachable) or an error.
    pub fn fails(&self) -> bool {
        self.kind != "reachable"
    }
}

#[derive(Debug, Default, Serialize)]
pub struct Diff {
    pub new: Vec<SiteChange>,
    pub gone: Vec<SiteChange>,
    pub grown: Vec<SiteChange>,
}

impl Diff {
    /// `diff`'s exit status: 1 when NEW has a leak or error site that BASE has not.
    pub fn exit_code(&self) -> i32 {
        i32::from(self.new.iter().any(SiteChange::fails))
    }
}

/// What a site is across builds: its kind, its `K15_NEW` file's name and its frames' functions
/// and file names.
type Key = (String, String, Vec<(String, String)>);

struct Totals {
    blocks: u64,
    bytes: u64,
    stack: Vec<FrameOut>,
}

fn sites(report: &Report) -> BTreeMap<Key, Totals> {
    let mut sites: BTreeMap<Key, Totals> = BTreeMap::new();
    let mut add = |kind: &str, file: Option<&str>, stack: Option<usize>, blocks, bytes| {
        let key = (
            kind.to_owned(),
            file.map(base_name).unwrap_or_default().to_owned(),
            report.stack_key(stack),
        );
        let totals = sites.entry(key).or_insert_with(|| Totals {
            blocks: 0,
            bytes: 0,
            stack: frames_out(report, stack),
        });
        totals.blocks = totals.blocks.saturating_add(blocks);
        totals.bytes = totals.bytes.saturating_add(bytes);
    };
    for total in report.site_totals() {
        let site = &report.sites[total.site];
        add(
            &total.kind,
            site.file.as_deref(),
            site.stack,
            total.blocks,
            total.bytes,
        );
    }
    for error in &report.errors {
        let file = error.fields.get("file").and_then(|f| f.as_str());
        add(&error.kind, file, error.main_stack(), 1, error.size());
    }
    sites
}

fn frames_out(report: &Report, stack: Option<usize>) -> Vec<FrameOut> {
    report
        .frames_of(stack)
        .map(|f| FrameOut {
            function: f.name(),
            file: f.file.clone(),
            line: f.line,
        })
        .collect()
}

/// Sites of `new` that `base` lacks, sites of `base` gone from `new`, and sites with more
/// blocks or bytes in `new`; each list largest first.
pub fn diff(base: &Report, new: &Report) -> Diff {
    let before = sites(base);
    let mut after = sites(new);
    let mut result = Diff::default();
    for (key, old) in before {
        let change = |now: &Totals, stack| SiteChange {
            kind: key.0.clone(),
            blocks: now.blocks,
            bytes: now.bytes,
            base_blocks: old.blocks,
            base_bytes: old.bytes,
            stack,
        };
        match after.remove(&key) {
            None => result.gone.push(SiteChange {
                blocks: 0,
                bytes: 0,
                ..change(&old, old.stack.clone())
            }),
            Some(now) if now.blocks > old.blocks || now.bytes > old.bytes => {
                result.grown.push(change(&now, now.stack.clone()))
            }
            Some(_) => {}
        }
    }
    result.new = after
        .into_iter()
        .map(|((kind, _, _), now)| SiteChange {
            kind,
            blocks: now.blocks,
            bytes: now.bytes,
            base_blocks: 0,
            base_bytes: 0,
            stack: now.stack,
        })
        .collect();
    for list in [&mut result.new, &mut result.gone, &mut result.grown] {
        list.sort_by_key(|c| std::cmp::Reverse(c.bytes.max(c.base_bytes)));
    }
    result
}

/// The diff for people: one paragraph per site.
pub fn text(diff: &Diff) -> String {
    let mut out = String::new();
    let sections = [
        ("New", &diff.new),
        ("Gone", &diff.gone),
        ("Grown", &diff.grown),
    ];
    for (title, list) in sections {
        for change in list {
            let what = match change.kind.as_str() {
                k @ ("direct" | "indirect" | "reachable") => format!("{k} leak"),
                k => format!("{} error", printable(k)),
            };
            out += &format!(
                "{title} {what}: {} in {} (base: {} in {})\n",
                crate::report::count(change.bytes, "byte"),
                crate::report::count(change.blocks, "block"),
                crate::report::count(change.base_bytes, "byte"),
                crate::report::count(change.base_blocks, "block"),
            );
            for (i, frame) in change.stack.iter().enumerate() {
                out += &format!("    #{i} {}", printable(&frame.function));
                if let Some(file) = &frame.file {
                    out += &format!(" {}:{}", printable(file), frame.line);
                }
                out.push('\n');
            }
        }
    }
    out += &format!(
        "{} new, {} gone, {} grown.\n",
        crate::report::count(diff.new.len() as u64, "site"),
        diff.gone.len(),
        diff.grown.len()
    );
    out
}
