//! The report's `profile` (`profile=1`): the allocating sites with the most calls, and what was live at the process's peak, each site's stacks merged by their frames.

use crate::stack::StackId;
use crate::symbolize::Symbolizer;
use crate::tracker::profile::{Profile, SiteFigures};
use crate::tracker::tags::{self, TagId};
use std::collections::HashMap;

/// Sites the JSON lists in each list; the rest are summed in one line.
pub const LISTED: usize = 500;
/// Sites the text lists in each table.
pub const SHOWN: usize = 10;

/// One site's figures: its stack (merged with every stack of the same frames), or with stacks
/// off its `K15_NEW` place.
#[derive(Clone, Debug)]
pub struct ProfileSite {
    pub stack: StackId,
    pub file: Option<&'static str>,
    pub line: u32,
    pub tag: TagId,
    pub allocations: u64,
    pub bytes: u64,
    pub temporary: u64,
    pub peak_blocks: u64,
    pub peak_bytes: u64,
}

impl ProfileSite {
    pub fn tag_name(&self) -> Option<String> {
        (self.tag != 0).then(|| tags::name(self.tag))
    }

    fn add(&mut self, other: &ProfileSite) {
        self.allocations += other.allocations;
        self.bytes += other.bytes;
        self.temporary += other.temporary;
        self.peak_blocks += other.peak_blocks;
        self.peak_bytes += other.peak_bytes;
    }
}

/// The sites past [`LISTED`], summed.
#[derive(Clone, Debug, Default)]
pub struct Rest {
    pub sites: usize,
    pub allocations: u64,
    pub bytes: u64,
    pub temporary: u64,
    pub peak_blocks: u64,
    pub peak_bytes: u64,
}

impl Rest {
    fn of(sites: &[ProfileSite]) -> Rest {
        sites.iter().fold(Rest::default(), |mut rest, s| {
            rest.sites += 1;
            rest.allocations += s.allocations;
            rest.bytes += s.bytes;
            rest.temporary += s.temporary;
            rest.peak_blocks += s.peak_blocks;
            rest.peak_bytes += s.peak_bytes;
            rest
        })
    }
}

/// What the report shows of the profile.
#[derive(Clone, Debug, Default)]
pub struct ProfileReport {
    /// Most allocations first (then most bytes), [`LISTED`] at most.
    pub sites: Vec<ProfileSite>,
    pub other_sites: Rest,
    /// The sites that held blocks at the peak, most bytes first, [`LISTED`] at most.
    pub peak: Vec<ProfileSite>,
    pub other_peak: Rest,
    pub peak_bytes: u64,
    pub peak_frame: u64,
    /// Allocations of stacks that found no room in the tracker's table (in no site).
    pub uncounted: u64,
}

impl ProfileReport {
    /// The profile's stacks, for the symbolizer.
    pub fn stacks(profile: &Profile) -> impl Iterator<Item = StackId> + '_ {
        profile.sites.iter().map(|s| s.stack)
    }

    /// The report of `profile`, its stacks merged by `same_frames` (every stack to the first of
    /// its frames, as the leak sites are).
    pub fn new(
        profile: &Profile,
        same_frames: &HashMap<StackId, StackId>,
        symbolizer: &Symbolizer,
    ) -> ProfileReport {
        let mut merged: HashMap<(StackId, usize, u32, TagId), ProfileSite> = HashMap::new();
        for s in &profile.sites {
            let site = site_of(s, same_frames, symbolizer);
            let key = (
                site.stack,
                site.file.map_or(0, |f| f.as_ptr() as usize),
                site.line,
                site.tag,
            );
            merged
                .entry(key)
                .and_modify(|m| m.add(&site))
                .or_insert(site);
        }
        let mut sites: Vec<ProfileSite> = merged.into_values().collect();
        let mut peak: Vec<ProfileSite> = sites
            .iter()
            .filter(|s| s.peak_bytes > 0 || s.peak_blocks > 0)
            .cloned()
            .collect();
        sites.sort_by(|a, b| {
            (b.allocations, b.bytes, a.stack.0).cmp(&(a.allocations, a.bytes, b.stack.0))
        });
        peak.sort_by(|a, b| {
            (b.peak_bytes, b.peak_blocks, a.stack.0).cmp(&(a.peak_bytes, a.peak_blocks, b.stack.0))
        });
        let other_sites = Rest::of(sites.get(LISTED..).unwrap_or_default());
        let other_peak = Rest::of(peak.get(LISTED..).unwrap_or_default());
        sites.truncate(LISTED);
        peak.truncate(LISTED);
        ProfileReport {
            sites,
            other_sites,
            peak,
            other_peak,
            peak_bytes: profile.peak_bytes,
            peak_frame: profile.peak_frame,
            uncounted: profile.uncounted,
        }
    }
}

/// `s` as the report names it: its stack merged, its `K15_NEW` file read (from a module still
/// mapped).
fn site_of(
    s: &SiteFigures,
    same_frames: &HashMap<StackId, StackId>,
    symbolizer: &Symbolizer,
) -> ProfileSite {
    // SAFETY: a site's file is a `__FILE__` literal (or an engine allocator's name), here of a
    // module still mapped.
    let file = symbolizer
        .is_mapped(s.file as usize)
        .then(|| unsafe { crate::sys::c_str(s.file) })
        .flatten();
    ProfileSite {
        stack: same_frames.get(&s.stack).copied().unwrap_or(s.stack),
        file,
        line: s.line,
        tag: s.tag,
        allocations: s.allocations,
        bytes: s.bytes,
        temporary: s.temporary,
        peak_blocks: s.peak_blocks,
        peak_bytes: s.peak_bytes,
    }
}
