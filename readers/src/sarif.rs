//! `k15-memory export --sarif`: one SARIF 2.1.0 result per leak or error site, located at its
//! first frame in the program's own sources, for GitHub code scanning and other SARIF viewers.

use crate::report::{count, Report};
use serde_json::{json, Value};
use std::path::Path;

/// The report as a SARIF 2.1.0 log. Files under `root` (the checkout) are written relative to
/// it, against `%SRCROOT%`, as code scanning wants; others as absolute `file://` URIs.
pub fn log(report: &Report, root: &Path) -> Value {
    let mut rules: Vec<String> = Vec::new();
    let mut results = Vec::new();
    let mut add = |rule: String, level: &str, text: String, stack: Option<usize>| {
        if !rules.contains(&rule) {
            rules.push(rule.clone());
        }
        let mut result = json!({
            "ruleId": rule,
            "level": level,
            "message": { "text": text },
        });
        let frames: Vec<&crate::report::Frame> = report.frames_of(stack).collect();
        if let Some(place) = frames.iter().find(|f| f.is_user()) {
            result["locations"] = json!([location(place, root)]);
        }
        let stack_frames: Vec<Value> = frames
            .iter()
            .map(|f| json!({ "location": location(f, root) }))
            .collect();
        if !stack_frames.is_empty() {
            result["stacks"] = json!([{ "frames": stack_frames }]);
        }
        results.push(result);
    };
    for total in report.site_totals() {
        let site = &report.sites[total.site];
        let level = if total.kind == "reachable" {
            "note"
        } else {
            "error"
        };
        let text = format!(
            "{} leak of {} in {}",
            total.kind,
            count(total.bytes, "byte"),
            count(total.blocks, "block")
        );
        add(format!("leak/{}", total.kind), level, text, site.stack);
    }
    for error in &report.errors {
        let text = format!(
            "{} ({})",
            error.kind.replace('_', " "),
            count(error.size(), "byte")
        );
        add(
            format!("error/{}", error.kind),
            "error",
            text,
            error.main_stack(),
        );
    }
    let rules: Vec<Value> = rules
        .iter()
        .map(|id| json!({ "id": id, "shortDescription": { "text": describe(id) } }))
        .collect();
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": { "name": "k15-memory", "version": env!("CARGO_PKG_VERSION"), "rules": rules } },
            "originalUriBaseIds": { "%SRCROOT%": { "uri": format!("file://{}/", root.display()) } },
            "results": results,
        }]
    })
}

fn location(frame: &crate::report::Frame, root: &Path) -> Value {
    let mut physical = json!({});
    if let Some(file) = &frame.file {
        physical["artifactLocation"] = match Path::new(file).strip_prefix(root) {
            Ok(relative) => {
                json!({ "uri": relative.display().to_string(), "uriBaseId": "%SRCROOT%" })
            }
            Err(_) => json!({ "uri": format!("file://{file}") }),
        };
        if frame.line > 0 {
            physical["region"] = json!({ "startLine": frame.line });
        }
    }
    let mut location = json!({ "message": { "text": frame.name() } });
    if physical.as_object().is_some_and(|o| !o.is_empty()) {
        location["physicalLocation"] = physical;
    }
    location
}

fn describe(rule: &str) -> String {
    match rule {
        "leak/direct" => "Memory leak: a block no pointer refers to".to_owned(),
        "leak/indirect" => "Memory leak: a block only leaked blocks refer to".to_owned(),
        "leak/reachable" => "Block still reachable at exit".to_owned(),
        other => format!(
            "Memory error: {}",
            other.trim_start_matches("error/").replace('_', " ")
        ),
    }
}
