//! `k15-memory html` and `html_path=`: the report as one self-contained page (inline CSS and
//! script, the data aggregated by site and embedded as compact JSON).

use crate::report::{LoadError, Report};
use serde_json::{json, Value};
use std::collections::BTreeMap;

const TEMPLATE: &str = include_str!("../page/report.html");
const STYLE: &str = include_str!("../page/report.css");
const SCRIPT: &str = include_str!("../page/report.js");

/// The page of a report given as its JSON text (what the tracker calls at exit).
pub fn html_from_report_json(json: &str) -> Result<String, LoadError> {
    Ok(page(&Report::from_json(json)?))
}

/// The page of `report`.
pub fn page(report: &Report) -> String {
    // `<` never reaches the page raw, so no string of the report can close the script element.
    let data = page_data(report).to_string().replace('<', "\\u003c");
    let title = report
        .program
        .as_deref()
        .map(crate::report::base_name)
        .unwrap_or("merged report");
    fill(
        TEMPLATE,
        &[
            ("title", &escape(title)),
            ("style", STYLE),
            ("script", SCRIPT),
            ("data", &data),
        ],
    )
}

/// `template` with each `{{name}}` of `values` replaced by its value, in one pass: a value is
/// never scanned for placeholders, so a program named `{{data}}` keeps its name.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut page =
        String::with_capacity(template.len() + values.iter().map(|v| v.1.len()).sum::<usize>());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let placeholder = rest[start + 2..]
            .split_once("}}")
            .and_then(|(name, after)| {
                let (_, value) = values.iter().find(|(n, _)| *n == name)?;
                Some((value, after))
            });
        match placeholder {
            Some((value, after)) => {
                page.push_str(&rest[..start]);
                page.push_str(value);
                rest = after;
            }
            None => {
                page.push_str(&rest[..start + 2]);
                rest = &rest[start + 2..];
            }
        }
    }
    page + rest
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Rows of each profile table on the page (the flame graph takes every site).
const PROFILE_ROWS: usize = 20;

/// What the page's script reads: the report by site, stacks and frames stored once.
fn page_data(report: &Report) -> Value {
    let frames: Vec<Value> = report
        .frames
        .iter()
        .map(|f| json!([f.name(), f.file, f.line]))
        .collect();
    let held = report.held();
    let totals = report.site_totals();
    let row_of: BTreeMap<(usize, &str), usize> = totals
        .iter()
        .enumerate()
        .map(|(i, t)| ((t.site, t.kind.as_str()), i))
        .collect();
    let sites: Vec<Value> = totals
        .iter()
        .map(|t| {
            let site = &report.sites[t.site];
            let mut holds: Vec<(usize, u64, u64)> = held
                .iter()
                .filter(|((direct, _), _)| *direct == t.site && t.kind == "direct")
                .map(|((_, indirect), &(blocks, bytes))| {
                    (row_of[&(*indirect, "indirect")], blocks, bytes)
                })
                .collect();
            holds.sort_by_key(|&(_, _, bytes)| std::cmp::Reverse(bytes));
            let place = site.file.as_ref().map(|f| format!("{f}:{}", site.line));
            let processes: Vec<String> = site
                .processes
                .iter()
                .map(crate::show::process_name)
                .collect();
            json!({
                "kind": t.kind, "blocks": t.blocks, "bytes": t.bytes, "stack": site.stack,
                "tag": site.tag, "with": site.allocated_with, "at": place, "holds": holds,
                "processes": processes,
            })
        })
        .collect();
    let leaked: Vec<Value> = totals
        .iter()
        .filter(|t| t.kind != "reachable")
        .map(|t| json!([report.sites[t.site].stack, t.bytes]))
        .collect();
    let mut metrics = json!({ "leaked": leaked });
    if let Some(profile) = &report.profile {
        if let Some(peak) = &profile.peak {
            metrics["peak"] = peak
                .sites
                .iter()
                .map(|s| json!([s.place.stack, s.bytes]))
                .collect();
        }
        metrics["allocations"] = profile
            .sites
            .iter()
            .map(|s| json!([s.place.stack, s.allocations]))
            .collect();
        metrics["temporary"] = profile
            .sites
            .iter()
            .map(|s| json!([s.place.stack, s.temporary]))
            .collect();
    }
    let profile = report.profile.as_ref().map(|p| {
        let place = |p: &crate::report::SitePlace| {
            let at = p.file.as_ref().map(|f| format!("{f}:{}", p.line));
            json!({ "stack": p.stack, "tag": p.tag, "at": at })
        };
        let sites: Vec<Value> = p
            .sites
            .iter()
            .take(PROFILE_ROWS)
            .map(|s| {
                let mut row = place(&s.place);
                row["figures"] = json!([s.allocations, s.temporary, s.bytes]);
                row
            })
            .collect();
        let peak = p.peak.as_ref().map(|peak| {
            let sites: Vec<Value> = peak
                .sites
                .iter()
                .take(PROFILE_ROWS)
                .map(|s| {
                    let mut row = place(&s.place);
                    row["figures"] = json!([s.bytes, s.blocks]);
                    row
                })
                .collect();
            json!({ "bytes": peak.bytes, "frame": peak.frame, "sites": sites })
        });
        json!({ "sites": sites, "peak": peak })
    });
    let errors: Vec<Value> = report
        .errors
        .iter()
        .map(|e| {
            let stacks: Vec<Value> = crate::report::ERROR_STACKS
                .iter()
                .filter_map(|f| Some(json!([f.replace('_', " "), e.stack(f)?])))
                .collect();
            json!({ "kind": e.kind, "size": e.size(), "tag": e.fields.get("tag"), "stacks": stacks })
        })
        .collect();
    let processes: Vec<String> = report
        .processes
        .iter()
        .map(crate::show::process_name)
        .collect();
    // The page draws one shape of timeline, checked here: a report read from a file had its
    // timeline checked at load; one built in memory with a bad timeline just has no chart.
    let timeline = report
        .timeline
        .as_ref()
        .and_then(|t| crate::report::timeline_series(t).ok());
    json!({
        "program": report.program, "pid": report.pid, "format": report.format,
        "summary": report.summary, "processes": processes,
        "frames": frames, "stacks": report.stacks,
        "sites": sites, "metrics": metrics, "errors": errors,
        "tags": report.tags, "timeline": timeline, "profile": profile,
    })
}
