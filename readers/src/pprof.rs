//! `k15-memory export --pprof`: the report as a gzip'd pprof profile (profile.proto's messages
//! declared here with prost's derive): `inuse_*` are the leaked blocks (in use at exit),
//! `alloc_*` the allocation totals of `profile.sites` where the report has them.

use crate::report::Report;
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;

#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "14")]
    default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    /// Innermost first.
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
struct Label {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "3")]
    address: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
    #[prost(int64, tag = "4")]
    filename: i64,
}

/// pprof's string table: index 0 is the empty string.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    ids: HashMap<String, i64>,
}

impl Strings {
    fn id(&mut self, s: &str) -> i64 {
        if self.table.is_empty() {
            self.table.push(String::new());
            self.ids.insert(String::new(), 0);
        }
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        self.table.push(s.to_owned());
        let id = self.table.len() as i64 - 1;
        self.ids.insert(s.to_owned(), id);
        id
    }
}

/// `n` as pprof's int64, `i64::MAX` where it does not fit. Such a figure is no real size, but
/// the report is still read whole (its figures are the file's word): pprof shows it as the
/// largest it can, never as a negative that a cast would make of it.
fn int64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A sample: its stack and its labels (tag, leak kind).
type SampleKey<'a> = (Option<usize>, Option<&'a str>, Option<&'a str>);

/// The report as a gzip'd pprof profile.
pub fn write(report: &Report, out: impl Write) -> std::io::Result<()> {
    let with_allocations = report.profile.as_ref().is_some_and(|p| !p.sites.is_empty());
    let mut strings = Strings::default();
    let mut names = vec![("inuse_objects", "count"), ("inuse_space", "bytes")];
    if with_allocations {
        names.extend([("alloc_objects", "count"), ("alloc_space", "bytes")]);
    }
    let sample_type: Vec<ValueType> = names
        .iter()
        .map(|(t, u)| ValueType {
            r#type: strings.id(t),
            unit: strings.id(u),
        })
        .collect();
    // Samples by stack and labels (tag, leak kind): values as in `sample_type`.
    let mut samples: BTreeMap<SampleKey, Vec<i64>> = BTreeMap::new();
    let width = names.len();
    for leak in &report.leaks {
        let site = &report.sites[leak.site];
        let values = samples
            .entry((
                site.stack,
                site.tag.as_deref(),
                Some(leak.leak_kind.as_str()),
            ))
            .or_insert_with(|| vec![0; width]);
        values[0] += 1;
        values[1] = values[1].saturating_add(int64(leak.size));
    }
    for site in report.profile.iter().flat_map(|p| &p.sites) {
        let values = samples
            .entry((site.place.stack, site.place.tag.as_deref(), None))
            .or_insert_with(|| vec![0; width]);
        values[2] = values[2].saturating_add(int64(site.allocations));
        values[3] = values[3].saturating_add(int64(site.bytes));
    }
    // One location per frame of the report (its index + 1), one function per name and file.
    let mut functions: HashMap<(i64, i64), u64> = HashMap::new();
    let mut function = Vec::new();
    let mut location = Vec::new();
    for (i, frame) in report.frames.iter().enumerate() {
        let key = (
            strings.id(&frame.name()),
            strings.id(frame.file.as_deref().unwrap_or("")),
        );
        let id = *functions.entry(key).or_insert_with(|| {
            function.push(Function {
                id: function.len() as u64 + 1,
                name: key.0,
                system_name: key.0,
                filename: key.1,
            });
            function.len() as u64
        });
        let address = frame
            .address
            .as_deref()
            .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
            .unwrap_or(0);
        location.push(Location {
            id: i as u64 + 1,
            address,
            line: vec![Line {
                function_id: id,
                line: int64(frame.line),
            }],
        });
    }
    let (tag_key, kind_key) = (strings.id("tag"), strings.id("leak_kind"));
    let sample = samples
        .into_iter()
        .map(|((stack, tag, kind), value)| {
            let mut label = Vec::new();
            if let Some(tag) = tag {
                label.push(Label {
                    key: tag_key,
                    str: strings.id(tag),
                });
            }
            if let Some(kind) = kind {
                label.push(Label {
                    key: kind_key,
                    str: strings.id(kind),
                });
            }
            let location_id = stack
                .map(|s| report.stacks[s].iter().map(|&f| f as u64 + 1).collect())
                .unwrap_or_default();
            Sample {
                location_id,
                value,
                label,
            }
        })
        .collect();
    let profile = Profile {
        sample_type,
        sample,
        location,
        function,
        default_sample_type: strings.id("inuse_space"),
        string_table: strings.table,
    };
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()?.flush()
}
