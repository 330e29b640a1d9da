//! Tag budgets (`budgets=FILE`): a byte budget per tag, and the `tag_over_budget` crossings.
//!
//! The file holds one `TAG SIZE` a line (`Render/Textures 512M`; K, M, G suffixes), `#` starts a
//! comment; a bad line gets one line on stderr and is skipped. A budgeted tag's live bytes (its
//! children's included) are also kept in one process-wide counter, exact at every allocation: an
//! atomic add per allocation and free of the tag's blocks, paid only by tags with a budget.
//! Crossing the budget (live bytes from at most the budget to above it) is reported once; going
//! back under and over again is another crossing.

use super::tags::{self, TagId, MAX_TAGS};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Per tag: its budget in bytes, 0 for none.
static BUDGETS: [AtomicU64; MAX_TAGS] = [const { AtomicU64::new(0) }; MAX_TAGS];
/// Per budgeted tag: its live bytes, process-wide.
static LIVE_BYTES: [AtomicU64; MAX_TAGS] = [const { AtomicU64::new(0) }; MAX_TAGS];
/// Whether any tag has a budget: without, tagged allocations test this alone.
static ANY: AtomicBool = AtomicBool::new(false);

/// The budget of `tag`, 0 for none.
pub fn budget_of(tag: TagId) -> u64 {
    BUDGETS[tag as usize].load(Ordering::Relaxed)
}

/// Reads the budgets file at `path`; its problems go to stderr. Called once, inside the tracker,
/// before the first tracked allocation.
pub fn load(path: &str) {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            let line = format!("k15-memory: budgets={path}: cannot be read ({e}); no budgets\n");
            crate::sys::write_fd(2, line.as_bytes());
            return;
        }
    };
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default();
        let fields: Vec<&str> = line.split_whitespace().collect();
        match parse(&fields) {
            Some((tag, bytes)) => set(tag, bytes),
            None if fields.is_empty() => {}
            None => {
                let complaint = format!(
                    "k15-memory: budgets={path}:{}: `{}` is not `TAG SIZE` (Render/Textures 512M); skipped\n",
                    number + 1,
                    line.trim()
                );
                crate::sys::write_fd(2, complaint.as_bytes());
            }
        }
    }
}

/// A line's tag (interned) and bytes, if it is `TAG SIZE` with a size above 0.
fn parse(fields: &[&str]) -> Option<(TagId, u64)> {
    let [name, size] = fields else {
        return None;
    };
    let bytes = crate::options::parse_size(size.as_bytes()).filter(|&b| b > 0)?;
    match tags::intern(name.as_bytes()) {
        0 => None,
        tag => Some((tag, bytes as u64)),
    }
}

/// Gives `tag` a budget of `bytes` (a later line for the same tag wins).
fn set(tag: TagId, bytes: u64) {
    BUDGETS[tag as usize].store(bytes, Ordering::Relaxed);
    ANY.store(true, Ordering::Release);
}

/// Counts `size` more live bytes of `tag`, if it has a budget; the live bytes when they crossed
/// it.
#[inline(always)]
pub fn charge(tag: TagId, size: usize) -> Option<u64> {
    if !ANY.load(Ordering::Relaxed) {
        return None;
    }
    let budget = budget_of(tag);
    if budget == 0 {
        return None;
    }
    let size = size as u64;
    let live = LIVE_BYTES[tag as usize].fetch_add(size, Ordering::Relaxed) + size;
    (live > budget && live - size <= budget).then_some(live)
}

/// Counts `size` live bytes of `tag` freed, if it has a budget.
#[inline(always)]
pub fn credit(tag: TagId, size: usize) {
    if ANY.load(Ordering::Relaxed) && budget_of(tag) != 0 {
        LIVE_BYTES[tag as usize].fetch_sub(size as u64, Ordering::Relaxed);
    }
}

/// The tags whose budgets one allocation crossed and their live bytes then, innermost first: at most [`Crossed::MAX`]
/// (a deeper chain of budgeted tags crossed by the same allocation reports its first ones).
#[derive(Clone, Copy, Default)]
pub struct Crossed {
    tags: [(TagId, u64); Crossed::MAX],
    len: usize,
}

impl Crossed {
    pub const MAX: usize = 4;

    pub fn push(&mut self, tag: TagId, live_bytes: u64) {
        if self.len < Self::MAX {
            self.tags[self.len] = (tag, live_bytes);
            self.len += 1;
        }
    }

    pub fn tags(&self) -> &[(TagId, u64)] {
        &self.tags[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_a_tag_and_a_size() {
        let tag = tags::intern(b"BudgetParse/Textures");
        assert_eq!(
            parse(&["BudgetParse/Textures", "512M"]),
            Some((tag, 512 << 20))
        );
        assert_eq!(parse(&["BudgetParse/Textures", "100"]), Some((tag, 100)));
        for bad in [
            &["BudgetParse/Textures"][..],
            &["BudgetParse/Textures", "lots"],
            &["BudgetParse/Textures", "0"],
            &["a//b", "1K"],
            &["BudgetParse/Textures", "1K", "extra"],
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_budget_is_crossed_once_until_the_tag_goes_back_under() {
        let tag = tags::intern(b"BudgetCrossing");
        set(tag, 100);
        assert_eq!(charge(tag, 60), None);
        assert_eq!(charge(tag, 60), Some(120), "120 > 100: crossed");
        assert_eq!(charge(tag, 10), None, "still over: no second crossing");
        credit(tag, 60);
        credit(tag, 10);
        assert_eq!(charge(tag, 40), None, "100: at the budget, not over");
        assert_eq!(charge(tag, 10), Some(110), "over again: crossed again");
    }
}
