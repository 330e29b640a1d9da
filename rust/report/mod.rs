//! The leak report: a snapshot of the live lists, grouped by allocation site, written as text
//! (LeakSanitizer-like) and as JSON (`k15-leaks/1`).

pub mod at_exit;
pub mod json;
pub mod text;

use crate::ffi::BlockKind;
use crate::stack::{self, StackId};
use crate::symbolize::{Frame, Symbolizer};
use crate::tracker::errors::{self, MemoryError};
use crate::tracker::guard::Inside;
use crate::tracker::header::BlockHeader;
use crate::tracker::live_list::StoppedWorld;
use std::collections::HashMap;

/// One block still live when the snapshot was taken.
#[derive(Clone, Debug)]
pub struct Leak {
    pub address: usize,
    pub size: usize,
    pub kind: BlockKind,
    pub file: Option<String>,
    pub line: u32,
    pub seq: u32,
    pub thread: u32,
    pub stack: StackId,
    /// The engine allocator that served the block (`rust/engine`), if not `new`/Rust/Bullet.
    pub allocator: Option<&'static str>,
}

impl Leak {
    /// SPEC's `language`: who allocated the block.
    pub fn language(&self) -> &'static str {
        if let Some(name) = self.allocator {
            return name;
        }
        match self.kind {
            BlockKind::Rust => "rust",
            BlockKind::Bullet => "bullet",
            _ => "c++",
        }
    }
}

/// Leaks that share a stack, kind and `K15_NEW` site: one entry of the text report.
pub struct Site<'a> {
    pub leaks: Vec<&'a Leak>,
    pub total_bytes: usize,
}

/// Everything a report shows, symbolized.
pub struct Report {
    pub leaks: Vec<Leak>,
    /// The first errors (`errors::MAX_KEPT_ERRORS`), in order.
    pub errors: Vec<MemoryError>,
    /// All errors, listed or not.
    pub error_count: usize,
    /// Blocks the Rust runtime allocates once for itself before `main` and keeps (see
    /// [`is_rust_runtime_setup`]): live at exit, but no leak of the program's.
    pub runtime_blocks: usize,
    pub stats: crate::ffi::Stats,
    stacks: HashMap<StackId, Vec<Frame>>,
}

impl Report {
    /// Snapshots the live lists, the engine allocators' live and retired blocks and the errors, and
    /// symbolizes every stack they name.
    pub fn collect() -> Report {
        let mut leaks = Vec::new();
        let world = StoppedWorld::stop(crate::tracker::guard::thread_number());
        for held in world.shards() {
            leaks.extend(held.live_blocks().map(|header| {
                // SAFETY: headers on a held list are live and stay so while the world is stopped.
                let h = unsafe { &*header };
                // SAFETY: the `file` of a live block is null or a `__FILE__` literal.
                let file = unsafe { crate::sys::c_str(h.file) };
                Leak {
                    address: BlockHeader::user_ptr(header) as usize,
                    size: h.size,
                    kind: h.kind,
                    file: file.map(str::to_owned),
                    line: h.line,
                    seq: h.seq,
                    thread: h.thread,
                    stack: h.alloc_stack,
                    allocator: None,
                }
            }));
        }
        drop(world);
        leaks.sort_by_key(|l| (l.thread, l.seq));
        crate::engine::for_each_live_block(&mut |info, block| {
            leaks.push(Leak {
                address: block.address,
                size: block.size,
                kind: BlockKind::New,
                file: None,
                line: 0,
                seq: 0,
                thread: 0,
                stack: StackId(block.tag),
                allocator: Some(info.name),
            })
        });
        let (errors, error_count) = errors::all();
        let mut symbolizer = Symbolizer::new();
        let mut stacks = HashMap::new();
        let ids = leaks
            .iter()
            .map(|l| l.stack)
            .chain(errors.iter().flat_map(|e| [e.alloc_stack, e.free_stack]));
        for id in ids {
            stacks
                .entry(id)
                .or_insert_with(|| symbolizer.symbolize_stack(&stack::frames(id)));
        }
        let before = leaks.len();
        leaks.retain(|leak| !is_rust_runtime_setup(&stacks[&leak.stack]));
        let runtime_blocks = before - leaks.len();
        Report {
            leaks,
            errors,
            error_count,
            runtime_blocks,
            stats: crate::tracker::stats(),
            stacks,
        }
    }

    pub fn leaked_bytes(&self) -> usize {
        self.leaks.iter().map(|l| l.size).sum()
    }

    pub fn frames(&self, id: StackId) -> &[Frame] {
        self.stacks.get(&id).map_or(&[], Vec::as_slice)
    }

    /// Leaks grouped by allocation site, largest total first.
    pub fn sites(&self) -> Vec<Site<'_>> {
        type SiteKey<'a> = (StackId, &'static str, u8, Option<&'a str>, u32);
        let mut by_site: HashMap<SiteKey<'_>, Site<'_>> = HashMap::new();
        for leak in &self.leaks {
            let key = (
                leak.stack,
                leak.language(),
                leak.kind.repr,
                leak.file.as_deref(),
                leak.line,
            );
            let site = by_site.entry(key).or_insert_with(|| Site {
                leaks: Vec::new(),
                total_bytes: 0,
            });
            site.leaks.push(leak);
            site.total_bytes += leak.size;
        }
        let mut sites: Vec<Site<'_>> = by_site.into_values().collect();
        sites.sort_by(|a, b| {
            b.total_bytes.cmp(&a.total_bytes).then_with(|| {
                (a.leaks[0].thread, a.leaks[0].seq).cmp(&(b.leaks[0].thread, b.leaks[0].seq))
            })
        });
        sites
    }
}

/// A stack made only by the Rust runtime's start-up (`std::rt::init` and what it calls, before
/// `main`), such as the main thread's stack-overflow guard info: LeakSanitizer suppresses the
/// same kind of blocks of its own runtime.
fn is_rust_runtime_setup(stack: &[Frame]) -> bool {
    let runtime = |f: &Frame| {
        let name = f.function.as_deref().unwrap_or("");
        ["std::", "core::", "alloc::", "<"]
            .iter()
            .any(|p| name.starts_with(p))
    };
    let before_main: Vec<&Frame> = stack
        .iter()
        .take_while(|f| f.function.as_deref() != Some("main"))
        .collect();
    before_main.len() < stack.len()
        && before_main.iter().any(|f| {
            f.function
                .as_deref()
                .is_some_and(|n| n.starts_with("std::rt::"))
        })
        && before_main.iter().all(|f| runtime(f))
}

/// Writes the text report to `text_path` and the JSON one to `json_path`.
pub fn write(report: &Report, text_path: &str, json_path: &str) -> std::io::Result<()> {
    std::fs::write(text_path, text::render(report))?;
    std::fs::write(json_path, json::render(report))
}

/// `write_leak_report(path)`: the report now, to `path` (+ `.json`) or the configured paths.
pub fn write_now(path: Option<&str>) -> bool {
    let _inside = Inside::enter();
    let report = Report::collect();
    let options = crate::options::get();
    let result = match path {
        Some(p) => write(&report, p, &format!("{p}.json")),
        None => write(&report, options.log_path.as_str(), &options.json_path()),
    };
    result.is_ok()
}
