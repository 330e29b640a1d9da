//! The JSON leak report (`k15-leaks/2`, `k15-leaks/3`) as a serde model, loaded with one-line errors.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// The formats this reader understands; `merge` writes the newest of its inputs'.
pub const FORMATS: [&str; 2] = ["k15-leaks/2", "k15-leaks/3"];

/// The leak kinds a report may give a block, in the text report's order (direct leaks first).
pub const LEAK_KINDS: [&str; 3] = ["direct", "indirect", "reachable"];

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub format: String,
    #[serde(default)]
    pub program: Option<String>,
    #[serde(default)]
    pub pid: u64,
    #[serde(default)]
    pub summary: Map<String, Value>,
    pub sites: Vec<Site>,
    pub leaks: Vec<Leak>,
    #[serde(default)]
    pub errors: Vec<MemoryError>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suppressions: Vec<Value>,
    pub frames: Vec<Frame>,
    pub stacks: Vec<Vec<usize>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<Tag>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Value>,
    /// Written by `merge`: the processes whose reports it joined.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<Process>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Process {
    pub program: Option<String>,
    pub pid: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Site {
    pub stack: Option<usize>,
    #[serde(default)]
    pub array: bool,
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub line: u64,
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub allocated_with: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Written by `merge`: the processes that leaked from this site.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<Process>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Leak {
    pub site: usize,
    pub leak_kind: String,
    pub size: u64,
    #[serde(default)]
    pub seq: u64,
    #[serde(default)]
    pub thread: u64,
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// Written by `merge`: the index in `processes` of the process that leaked the block (an
    /// address, and so `held_by`, means something only within its process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<usize>,
}

/// A memory error: its kind and stacks; the kind-specific fields are kept as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemoryError {
    pub kind: String,
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

/// The fields of an error that index `stacks`, in the order a reader shows them.
pub const ERROR_STACKS: [&str; 4] = ["stack", "alloc_stack", "free_stack", "previous_free_stack"];

impl MemoryError {
    pub fn stack(&self, field: &str) -> Option<usize> {
        self.fields.get(field)?.as_u64().map(|i| i as usize)
    }
    /// The stack that says where the error happened: the one that did it (a free, an access, an
    /// allocation over budget), else where the block came from.
    pub fn main_stack(&self) -> Option<usize> {
        ["free_stack", "stack", "alloc_stack"]
            .iter()
            .find_map(|f| self.stack(f))
    }
    pub fn size(&self) -> u64 {
        self.fields.get("size").and_then(Value::as_u64).unwrap_or(0)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Frame {
    pub function: Option<String>,
    pub file: Option<String>,
    #[serde(default)]
    pub line: u64,
    #[serde(default)]
    pub inlined: bool,
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub module: Option<String>,
}

impl Frame {
    /// The function's name, else `module+address` (a frame without symbols).
    pub fn name(&self) -> String {
        match (&self.function, &self.module, &self.address) {
            (Some(f), _, _) => f.clone(),
            (None, Some(m), Some(a)) => format!("{}+{a}", base_name(m)),
            (None, _, Some(a)) => a.clone(),
            _ => "??".to_owned(),
        }
    }
    /// Whether the frame is the program's own code: it has a source file outside the system's.
    pub fn is_user(&self) -> bool {
        matches!(&self.file, Some(f) if self.line > 0 && !f.starts_with("/usr/"))
    }
}

/// The last component of a path.
pub fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tag {
    pub name: String,
    #[serde(default)]
    pub live_blocks: u64,
    #[serde(default)]
    pub live_bytes: u64,
    #[serde(default)]
    pub peak_bytes: u64,
    #[serde(default)]
    pub total_allocations: u64,
    #[serde(default)]
    pub total_bytes: u64,
    #[serde(default)]
    pub budget_bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Profile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak: Option<Peak>,
    #[serde(default)]
    pub sites: Vec<ProfileSite>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Peak {
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub frame: Option<u64>,
    #[serde(default)]
    pub sites: Vec<PeakSite>,
}

/// Where a profile row's blocks were allocated: their stack and tag, and `K15_NEW`'s place.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SitePlace {
    pub stack: Option<usize>,
    #[serde(default)]
    pub tag: Option<String>,
    /// `K15_NEW`'s place, where stacks were off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default)]
    pub line: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeakSite {
    #[serde(flatten)]
    pub place: SitePlace,
    #[serde(default)]
    pub blocks: u64,
    #[serde(default)]
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProfileSite {
    #[serde(flatten)]
    pub place: SitePlace,
    #[serde(default)]
    pub allocations: u64,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub temporary: u64,
}

/// Why a report could not be read: one line for the user.
#[derive(Debug)]
pub struct LoadError(pub String);

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

impl Report {
    /// Reads the report at `path`.
    pub fn load(path: &str) -> Result<Report, LoadError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| LoadError(format!("{path}: cannot read: {e}")))?;
        Report::from_json(&text).map_err(|LoadError(why)| LoadError(format!("{path}: {why}")))
    }

    /// Parses a report and checks that every index in it points inside its table.
    pub fn from_json(text: &str) -> Result<Report, LoadError> {
        // Straight into the model (a million leaks are read once); what went wrong is worked
        // out only when something did.
        let report = serde_json::from_str::<Report>(text).map_err(|e| why_not(text, e))?;
        if !FORMATS.contains(&report.format.as_str()) {
            return Err(other_format(&report.format));
        }
        report.check_indices()?;
        report.check_leak_kinds()?;
        if let Some(timeline) = &report.timeline {
            timeline_series(timeline)
                .map_err(|why| LoadError(format!("malformed report: timeline: {why}")))?;
        }
        Ok(report)
    }

    fn check_indices(&self) -> Result<(), LoadError> {
        let bad = |what: &str, i: usize| {
            Err(LoadError(format!(
                "malformed report: {what} {i} out of range"
            )))
        };
        for stack in &self.stacks {
            if let Some(&f) = stack.iter().find(|&&f| f >= self.frames.len()) {
                return bad("frame", f);
            }
        }
        let stack_ok = |s: Option<usize>| s.is_none_or(|s| s < self.stacks.len());
        if let Some(s) = self.sites.iter().find(|s| !stack_ok(s.stack)) {
            return bad("stack", s.stack.unwrap_or(0));
        }
        if let Some(l) = self.leaks.iter().find(|l| l.site >= self.sites.len()) {
            return bad("site", l.site);
        }
        let process_ok = |p: Option<usize>| p.is_none_or(|p| p < self.processes.len());
        if let Some(l) = self.leaks.iter().find(|l| !process_ok(l.process)) {
            return bad("process", l.process.unwrap_or(0));
        }
        for e in &self.errors {
            if let Some(s) = ERROR_STACKS
                .iter()
                .filter_map(|f| e.stack(f))
                .find(|&s| s >= self.stacks.len())
            {
                return bad("stack", s);
            }
        }
        let profile_stacks = self.profile.iter().flat_map(|p| {
            let peak = p
                .peak
                .iter()
                .flat_map(|peak| peak.sites.iter().map(|s| s.place.stack));
            peak.chain(p.sites.iter().map(|s| s.place.stack))
        });
        for s in profile_stacks {
            if !stack_ok(s) {
                return bad("stack", s.unwrap_or(0));
            }
        }
        Ok(())
    }

    /// Every command groups, ranks and labels leaks by their kind: one it does not know is a
    /// damaged report, refused like an index out of range.
    fn check_leak_kinds(&self) -> Result<(), LoadError> {
        match self
            .leaks
            .iter()
            .find(|l| !LEAK_KINDS.contains(&l.leak_kind.as_str()))
        {
            Some(leak) => Err(LoadError(format!(
                "malformed report: leak_kind {:?} is not one of {}",
                leak.leak_kind,
                LEAK_KINDS.join(", ")
            ))),
            None => Ok(()),
        }
    }

    /// The frames of stack `index`, innermost first (none for a stack not recorded).
    pub fn frames_of(&self, index: Option<usize>) -> impl Iterator<Item = &Frame> {
        index
            .map(|i| self.stacks[i].as_slice())
            .unwrap_or_default()
            .iter()
            .map(|&f| &self.frames[f])
    }

    /// A summary figure (0 when the report lacks it).
    pub fn figure(&self, name: &str) -> u64 {
        self.summary.get(name).and_then(Value::as_u64).unwrap_or(0)
    }

    /// The leaks grouped by site and kind, largest bytes first.
    pub fn site_totals(&self) -> Vec<SiteTotal> {
        let mut totals: HashMap<(usize, &str), SiteTotal> = HashMap::new();
        for leak in &self.leaks {
            let total = totals
                .entry((leak.site, leak.leak_kind.as_str()))
                .or_insert_with(|| SiteTotal {
                    site: leak.site,
                    kind: leak.leak_kind.clone(),
                    blocks: 0,
                    bytes: 0,
                });
            total.blocks += 1;
            total.bytes = total.bytes.saturating_add(leak.size);
        }
        let mut totals: Vec<SiteTotal> = totals.into_values().collect();
        totals.sort_by(|a, b| {
            (kind_rank(&a.kind), b.bytes, a.site).cmp(&(kind_rank(&b.kind), a.bytes, b.site))
        });
        totals
    }

    /// The identity of stack `index` across builds: the functions and file names of its
    /// frames, never addresses or lines.
    pub fn stack_key(&self, index: Option<usize>) -> Vec<(String, String)> {
        self.frames_of(index)
            .map(|f| {
                let file = f.file.as_deref().map(base_name).unwrap_or_default();
                (f.name_for_key(), file.to_owned())
            })
            .collect()
    }
}

impl Frame {
    /// A frame's function for matching: without symbols, its module (its address moves).
    fn name_for_key(&self) -> String {
        match (&self.function, &self.module) {
            (Some(f), _) => f.clone(),
            (None, Some(m)) => base_name(m).to_owned(),
            (None, None) => "??".to_owned(),
        }
    }
}

/// Why `text` is not a report: truncated, not JSON, another format, or a malformed report.
fn why_not(text: &str, error: serde_json::Error) -> LoadError {
    let value: Value = match serde_json::from_str(text) {
        Err(e) if e.is_eof() => {
            return LoadError(format!("truncated JSON (ends at line {})", e.line()))
        }
        Err(e) => return LoadError(format!("not JSON: {e}")),
        Ok(value) => value,
    };
    match value.get("format").and_then(Value::as_str) {
        Some(format) if !FORMATS.contains(&format) => other_format(format),
        None => LoadError("not a k15-memory report (no \"format\")".into()),
        Some(_) => LoadError(format!("malformed report: {error}")),
    }
}

fn other_format(format: &str) -> LoadError {
    LoadError(format!(
        "format {format:?} is not one this reader knows ({})",
        FORMATS.join(", ")
    ))
}

/// Direct leaks first, then indirect, then reachable (the text report's order).
pub fn kind_rank(kind: &str) -> usize {
    LEAK_KINDS
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(LEAK_KINDS.len())
}

/// The leaked blocks of one site and one kind.
#[derive(Debug, Clone)]
pub struct SiteTotal {
    pub site: usize,
    pub kind: String,
    pub blocks: u64,
    pub bytes: u64,
}

impl Report {
    /// For each direct-leak site, the indirect blocks its leaks hold, by the indirect block's
    /// site: `(direct site, indirect site) -> (blocks, bytes)`.
    pub fn held(&self) -> HashMap<(usize, usize), (u64, u64)> {
        // By process and address: two processes of a merged report may have leaked at the same
        // address (the same program without address randomization).
        let owner: HashMap<(Option<usize>, &str), usize> = self
            .leaks
            .iter()
            .filter(|l| l.leak_kind == "direct")
            .filter_map(|l| Some(((l.process, l.address.as_deref()?), l.site)))
            .collect();
        let mut held: HashMap<(usize, usize), (u64, u64)> = HashMap::new();
        for leak in self.leaks.iter().filter(|l| l.leak_kind == "indirect") {
            let holder = leak.held_by.as_deref().map(|a| (leak.process, a));
            if let Some(&direct) = holder.and_then(|h| owner.get(&h)) {
                let entry = held.entry((direct, leak.site)).or_insert((0, 0));
                entry.0 += 1;
                entry.1 = entry.1.saturating_add(leak.size);
            }
        }
        held
    }
}

/// Live bytes per tag over a timeline's samples, in sample order (`None` where a sample lacks
/// the tag).
pub type TimelineSeries = BTreeMap<String, Vec<Option<u64>>>;

/// The series of a report's `timeline`, from any of the shapes it may take:
/// `{"frames": [...], "tags": {name: [bytes...]}}`, `{"tags": [{"name", "live_bytes": [bytes...]}]}`
/// or `[{"frame", "tags": {name: bytes}}]` (`live_bytes` for `tags`); or why it is none of them.
pub fn timeline_series(timeline: &Value) -> Result<TimelineSeries, String> {
    let bytes = |v: &Value, what: &dyn Fn() -> String| match v {
        Value::Null => Ok(None),
        v => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{} is not a byte count", what())),
    };
    let list = |v: &Value, what: &dyn Fn() -> String| -> Result<Vec<Option<u64>>, String> {
        v.as_array()
            .ok_or_else(|| format!("{} is not a list of byte counts", what()))?
            .iter()
            .enumerate()
            .map(|(i, v)| bytes(v, &|| format!("{}[{i}]", what())))
            .collect()
    };
    let mut series = TimelineSeries::new();
    match timeline {
        Value::Array(points) => {
            for (i, point) in points.iter().enumerate() {
                if !point.is_object() {
                    return Err(format!("[{i}] is not an object"));
                }
                let tags = match point.get("tags").or_else(|| point.get("live_bytes")) {
                    None => continue,
                    Some(Value::Object(tags)) => tags,
                    Some(_) => return Err(format!("[{i}].tags is not an object")),
                };
                for (name, v) in tags {
                    let v = bytes(v, &|| format!("[{i}].tags.{name}"))?;
                    let line = series.entry(name.clone()).or_default();
                    line.resize(i, None);
                    line.push(v);
                }
            }
        }
        Value::Object(t) => match t.get("tags") {
            Some(Value::Object(tags)) => {
                for (name, v) in tags {
                    series.insert(name.clone(), list(v, &|| format!("tags.{name}"))?);
                }
            }
            Some(Value::Array(tags)) => {
                for (i, tag) in tags.iter().enumerate() {
                    let name = tag
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("tags[{i}] has no name"))?;
                    let v = tag.get("live_bytes").unwrap_or(&Value::Null);
                    series.insert(name.to_owned(), list(v, &|| format!("tags.{name}"))?);
                }
            }
            _ => return Err("no \"tags\" object or list".to_owned()),
        },
        _ => return Err("neither an object nor a list of samples".to_owned()),
    }
    Ok(series)
}

/// The sum of `values`, at most `u64::MAX`. Every sum of the readers saturates so: a report's
/// figures are the file's word, not checked against each other, and sizes near the limit must
/// make a total that shows as huge, not one that wrapped round to a small number.
pub fn saturating_sum(values: impl IntoIterator<Item = u64>) -> u64 {
    values.into_iter().fold(0, u64::saturating_add)
}

/// `text` with its control characters written as escapes (`\n`, `\t`, `\r`, `\x1b`): a name
/// from a report must not end a line of a line-based format or drive the terminal it is shown on.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => escaped.push_str("\\n"),
            '\t' => escaped.push_str("\\t"),
            '\r' => escaped.push_str("\\r"),
            // Control characters are all below U+00A0: two hex digits say each.
            c if c.is_control() => escaped.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

/// `n thing` or `n things` (`processes`).
pub fn count(n: u64, thing: &str) -> String {
    let plural = match (n, thing.ends_with('s')) {
        (1, _) => "",
        (_, true) => "es",
        (_, false) => "s",
    };
    format!("{n} {thing}{plural}")
}
