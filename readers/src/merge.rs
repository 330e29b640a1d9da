//! `k15-memory merge`: many processes' reports into one, by site, each site naming the
//! processes it came from; the result is a report the other commands read.

use crate::report::{Frame, Process, Profile, Report, Site, Tag, FORMATS};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// A frame as merging matches it: function, file, line, inlined, module.
type FrameKey = (Option<String>, Option<String>, u64, bool, Option<String>);

/// Tables of the merged report, each entry stored once.
#[derive(Default)]
struct Tables {
    frames: Vec<Frame>,
    frame_ids: HashMap<FrameKey, usize>,
    stacks: Vec<Vec<usize>>,
    stack_ids: HashMap<Vec<usize>, usize>,
    sites: Vec<Site>,
    site_ids: HashMap<String, usize>,
}

impl Tables {
    /// The merged index of `report`'s stack `index`. Frames match by what they name (their
    /// addresses differ from process to process).
    fn stack(&mut self, report: &Report, index: Option<usize>) -> Option<usize> {
        let frames: Vec<usize> = report
            .frames_of(Some(index?))
            .map(|f| {
                let key = (
                    f.function.clone(),
                    f.file.clone(),
                    f.line,
                    f.inlined,
                    f.module.clone(),
                );
                *self.frame_ids.entry(key).or_insert_with(|| {
                    self.frames.push(f.clone());
                    self.frames.len() - 1
                })
            })
            .collect();
        let next = self.stacks.len();
        let id = *self.stack_ids.entry(frames.clone()).or_insert(next);
        if id == next {
            self.stacks.push(frames);
        }
        Some(id)
    }

    fn site(&mut self, report: &Report, index: usize, process: &Process) -> usize {
        let mut site = report.sites[index].clone();
        site.stack = self.stack(report, site.stack);
        site.processes.clear();
        let key = serde_json::to_string(&site).expect("a site serializes");
        let next = self.sites.len();
        let id = *self.site_ids.entry(key).or_insert(next);
        if id == next {
            self.sites.push(site);
        }
        let processes = &mut self.sites[id].processes;
        if !processes.contains(process) {
            processes.push(process.clone());
        }
        id
    }
}

/// One report of `reports`' leaks, errors, tags and profiles; summary figures added up.
pub fn merge(reports: &[Report]) -> Report {
    let mut tables = Tables::default();
    let mut leaks = Vec::new();
    let mut errors = Vec::new();
    let mut summary = serde_json::Map::new();
    let mut tags: BTreeMap<String, Tag> = BTreeMap::new();
    // By stack, tag and `K15_NEW` place: allocations, bytes, temporary.
    let mut profile_sites: BTreeMap<crate::report::SitePlace, [u64; 3]> = BTreeMap::new();
    let mut peak = None;
    let mut processes = Vec::new();
    for report in reports {
        let inputs = if report.processes.is_empty() {
            vec![Process {
                program: report.program.clone(),
                pid: report.pid,
            }]
        } else {
            report.processes.clone() // a merged report merged again
        };
        let this = inputs[0].clone();
        // Where this report's processes start in the merged list (a leak of a report not
        // merged before is its one process's).
        let first_process = processes.len();
        processes.extend(inputs);
        let site_ids: Vec<usize> = (0..report.sites.len())
            .map(|i| {
                let id = tables.site(report, i, &this);
                if !report.sites[i].processes.is_empty() {
                    let from = report.sites[i].processes.clone();
                    let merged = &mut tables.sites[id].processes;
                    merged.retain(|p| *p != this);
                    merged.extend(
                        from.into_iter()
                            .filter(|p| !merged.contains(p))
                            .collect::<Vec<_>>(),
                    );
                }
                id
            })
            .collect();
        leaks.extend(report.leaks.iter().map(|l| {
            let mut leak = l.clone();
            leak.site = site_ids[l.site];
            leak.process = Some(first_process + l.process.unwrap_or(0));
            leak
        }));
        for error in &report.errors {
            let mut error = error.clone();
            for field in crate::report::ERROR_STACKS {
                if let Some(stack) = error.stack(field) {
                    let id = tables.stack(report, Some(stack)).expect("a stack");
                    error.fields.insert(field.to_owned(), id.into());
                }
            }
            if !error.fields.contains_key("processes") {
                error.fields.insert(
                    "processes".to_owned(),
                    serde_json::to_value([&this]).expect("serializes"),
                );
            }
            errors.push(error);
        }
        for (name, value) in &report.summary {
            if let Some(n) = value.as_u64() {
                let sum = summary
                    .get(name)
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
                    .saturating_add(n);
                summary.insert(name.clone(), sum.into());
            }
        }
        for tag in &report.tags {
            let merged = tags.entry(tag.name.clone()).or_insert_with(|| Tag {
                budget_bytes: tag.budget_bytes,
                ..Tag {
                    name: tag.name.clone(),
                    live_blocks: 0,
                    live_bytes: 0,
                    peak_bytes: 0,
                    total_allocations: 0,
                    total_bytes: 0,
                    budget_bytes: 0,
                }
            });
            merged.live_blocks = merged.live_blocks.saturating_add(tag.live_blocks);
            merged.live_bytes = merged.live_bytes.saturating_add(tag.live_bytes);
            merged.peak_bytes = merged.peak_bytes.max(tag.peak_bytes);
            merged.total_allocations = merged
                .total_allocations
                .saturating_add(tag.total_allocations);
            merged.total_bytes = merged.total_bytes.saturating_add(tag.total_bytes);
        }
        if let Some(profile) = &report.profile {
            for s in &profile.sites {
                let place = crate::report::SitePlace {
                    stack: tables.stack(report, s.place.stack),
                    ..s.place.clone()
                };
                let totals = profile_sites.entry(place).or_default();
                for (total, n) in totals.iter_mut().zip([s.allocations, s.bytes, s.temporary]) {
                    *total = total.saturating_add(n);
                }
            }
            // The largest process's peak stands for all: peaks of processes do not add up.
            if let Some(p) = &profile.peak {
                if peak
                    .as_ref()
                    .is_none_or(|old: &crate::report::Peak| old.bytes < p.bytes)
                {
                    let mut p = p.clone();
                    for s in &mut p.sites {
                        s.place.stack = tables.stack(report, s.place.stack);
                    }
                    peak = Some(p);
                }
            }
        }
    }
    // The peak is one process's, not a sum.
    if let Some(max) = reports.iter().map(|r| r.figure("peak_bytes")).max() {
        summary.insert("peak_bytes".to_owned(), max.into());
    }
    let profile = (!profile_sites.is_empty() || peak.is_some()).then(|| {
        let mut sites: Vec<crate::report::ProfileSite> = profile_sites
            .into_iter()
            .map(
                |(place, [allocations, bytes, temporary])| crate::report::ProfileSite {
                    place,
                    allocations,
                    bytes,
                    temporary,
                },
            )
            .collect();
        sites.sort_by_key(|s| std::cmp::Reverse(s.allocations));
        Profile { peak, sites }
    });
    let format = reports
        .iter()
        .filter_map(|r| FORMATS.iter().position(|f| *f == r.format))
        .max()
        .map_or(FORMATS[0], |i| FORMATS[i]);
    let programs: Vec<&Option<String>> = processes.iter().map(|p| &p.program).collect();
    let same_program = programs.windows(2).all(|w| w[0] == w[1]);
    Report {
        format: format.to_owned(),
        program: if same_program {
            programs.first().and_then(|p| (*p).clone())
        } else {
            None
        },
        pid: 0,
        summary,
        sites: tables.sites,
        leaks,
        errors,
        suppressions: Vec::new(),
        frames: tables.frames,
        stacks: tables.stacks,
        tags: tags.into_values().collect(),
        profile,
        timeline: None,
        processes,
    }
}
