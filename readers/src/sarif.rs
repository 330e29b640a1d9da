//! `k15-memory export --sarif`: one SARIF 2.1.0 result per leak or error site, located at its
//! first frame in the program's own sources, for GitHub code scanning and other SARIF viewers.

use crate::report::{count, Report};
use serde_json::{json, Value};
use std::path::{Component, Path, PathBuf};

/// The report as a SARIF 2.1.0 log. Files under `root` (the checkout) are written relative to
/// it, against `%SRCROOT%`, as code scanning wants; others as absolute `file://` URIs.
/// Relative paths in the debug information (`-fdebug-prefix-map=$PWD=.`) are taken as
/// relative to `root` too: the checkout is where a CI build that wrote them ran.
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
            "originalUriBaseIds": { "%SRCROOT%": { "uri": directory_uri(root) } },
            "results": results,
        }]
    })
}

fn location(frame: &crate::report::Frame, root: &Path) -> Value {
    let mut physical = json!({});
    if let Some(file) = &frame.file {
        let file = Path::new(file);
        let relative = match file.strip_prefix(root) {
            Ok(relative) => Some(relative),
            Err(_) if file.is_relative() => Some(file),
            Err(_) => None,
        };
        physical["artifactLocation"] = match relative {
            Some(relative) => {
                // `./a.cpp` is `a.cpp`: a reference resolves against the base either way, but
                // viewers match files by their URI's text.
                let relative: PathBuf = relative
                    .components()
                    .filter(|c| *c != Component::CurDir)
                    .collect();
                json!({ "uri": uri_path(&relative), "uriBaseId": "%SRCROOT%" })
            }
            None => json!({ "uri": format!("file://{}", uri_path(file)) }),
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

/// The `file://` URI of directory `path` (absolute), ending in `/` as a base URI must.
fn directory_uri(path: &Path) -> String {
    let uri = format!("file://{}", uri_path(path));
    if uri.ends_with('/') {
        uri
    } else {
        uri + "/"
    }
}

/// `path` as the path of a URI (RFC 3986): every byte but `/` and the unreserved characters
/// percent-encoded, so that a space, `#`, `?`, `%` or `:` in a file name stays part of it.
fn uri_path(path: &Path) -> String {
    path.as_os_str()
        .as_encoded_bytes()
        .iter()
        .map(|&b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
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
