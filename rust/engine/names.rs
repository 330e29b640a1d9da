//! Allocator and type names as C strings that live for the process: copied once per distinct name (allocators are few).

use std::ffi::{CStr, CString};
use std::sync::{Mutex, MutexGuard, PoisonError};

static NAMES: Mutex<Vec<&'static CStr>> = Mutex::new(Vec::new());

/// Held by `fork` (see `tracker::fork`): a child must not find the table held by a thread that
/// was adding a name at the fork.
pub(crate) fn lock_for_fork() -> MutexGuard<'static, impl Sized> {
    NAMES.lock().unwrap_or_else(PoisonError::into_inner)
}

fn interned(name: &[u8]) -> &'static CStr {
    let name = name.split(|&byte| byte == 0).next().unwrap_or_default();
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&known) = names.iter().find(|known| known.to_bytes() == name) {
        return known;
    }
    let copy: &'static CStr = Box::leak(
        CString::new(name)
            .expect("cut at the first NUL")
            .into_boxed_c_str(),
    );
    names.push(copy);
    copy
}

/// A `'static` copy of `name` (cut at its first NUL; invalid UTF-8 replaced), shared by equal names.
pub fn static_name(name: &CStr) -> &'static str {
    let lossy = name.to_string_lossy();
    interned(lossy.as_bytes())
        .to_str()
        .expect("made from a str")
}

/// `name` as a NUL-terminated string that lives for the process.
pub fn c_name(name: &str) -> &'static CStr {
    interned(name.as_bytes())
}
