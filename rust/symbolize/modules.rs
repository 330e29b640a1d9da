//! The map a symbolizer looks frames up in: every module the process has mapped so far (from
//! `stack::history`), found by address and by when the stack was captured.

use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use crate::stack::StackId;
use crate::tracker::guard::Inside;

/// One module as a symbolizer sees it.
pub(crate) struct Module {
    /// The path shown in frames: the real path of the executable, or the loader's name.
    pub(crate) name: String,
    /// The file to read the debug info from; `None` for objects with no file (the vdso).
    pub(crate) file: Option<PathBuf>,
    /// `dlpi_addr`: runtime address minus the address stated in the file (0 for non-PIE).
    pub(crate) bias: usize,
    /// The executable (where `main` lies).
    pub(crate) is_main: bool,
    window: Range<u32>,
}

/// Every module the process has mapped so far, with their ranges, for lookup.
pub(crate) struct ModuleMap {
    pub(crate) modules: Vec<Module>,
    /// `(runtime range of one PT_LOAD segment, index into modules)`; ranges of modules loaded
    /// at different times may overlap.
    segments: Vec<(Range<usize>, usize)>,
}

impl ModuleMap {
    /// The history so far (brought up to date first).
    pub(crate) fn snapshot() -> Self {
        let _inside = Inside::enter(); // the history is the tracker's memory
        let history = crate::stack::history::up_to_date();
        let mut map = ModuleMap {
            modules: Vec::new(),
            segments: Vec::new(),
        };
        for (index, record) in history.iter().enumerate() {
            // A live module is read through its path (separate debug files are found beside
            // it); an unloaded one through the file kept open, which may since be replaced.
            let file = match &record.file {
                None => None,
                Some(file) if record.unloaded != u32::MAX => {
                    Some(PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())))
                }
                Some(_) if record.is_main => Some(PathBuf::from("/proc/self/exe")),
                Some(_) => Some(PathBuf::from(&record.name)),
            };
            map.modules.push(Module {
                name: record.name.clone(),
                file,
                bias: record.bias,
                is_main: record.is_main,
                window: record.loaded..record.unloaded,
            });
            map.segments
                .extend(record.segments.iter().map(|s| (s.clone(), index)));
        }
        map
    }

    /// Whether a module mapped now holds `address`.
    pub(crate) fn is_mapped_now(&self, address: usize) -> bool {
        self.segments.iter().any(|(range, index)| {
            range.contains(&address) && self.modules[*index].window.end == u32::MAX
        })
    }

    /// The module holding `address` when `stack` was captured: the one whose window holds the
    /// stack's id, else (a module found late) the latest one mapped there.
    pub(crate) fn find(&self, address: usize, stack: Option<StackId>) -> Option<usize> {
        let mut candidates = self
            .segments
            .iter()
            .filter(|(range, _)| range.contains(&address))
            .map(|(_, index)| *index);
        match stack {
            Some(id) => {
                let all: Vec<usize> = candidates.collect();
                all.iter()
                    .copied()
                    .find(|&i| self.modules[i].window.contains(&id.0))
                    .or(all.last().copied())
            }
            None => candidates.next_back(),
        }
    }
}
