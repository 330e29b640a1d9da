//! Glob patterns on function and module names (`*`, `?`), shared by `suppressions=` and `alloc_fns=`.

/// LeakSanitizer's template match: `pattern` found anywhere in `name` unless anchored.
pub fn matches(pattern: &str, name: &str) -> bool {
    let (anchored_start, rest) = match pattern.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, pattern),
    };
    let (anchored_end, core) = match rest.strip_suffix('$') {
        Some(core) => (true, core),
        None => (false, rest),
    };
    let pattern = core.as_bytes();
    let name = name.as_bytes();
    if anchored_start {
        return glob_at(pattern, name, anchored_end);
    }
    (0..=name.len()).any(|start| glob_at(pattern, &name[start..], anchored_end))
}

/// `pattern` matches a prefix of `name` (all of it if `whole`).
fn glob_at(pattern: &[u8], name: &[u8], whole: bool) -> bool {
    match pattern.split_first() {
        None => !whole || name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|skip| glob_at(rest, &name[skip..], whole)),
        Some((&c, rest)) => match name.split_first() {
            Some((&n, tail)) if c == b'?' || c == n => glob_at(rest, tail, whole),
            _ => false,
        },
    }
}

/// `pattern` matches all of `name` (valgrind's `--alloc-fns` and `fun:` lines).
pub fn matches_whole(pattern: &str, name: &str) -> bool {
    glob_at(pattern.as_bytes(), name.as_bytes(), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_like_leak_sanitizer() {
        assert!(matches("SDL_*", "SDL_CreateWindow"));
        assert!(matches("SDL_*", "my::SDL_Init()"));
        assert!(matches("^SDL_*", "SDL_Init"));
        assert!(!matches("^SDL_*", "my::SDL_Init()"));
        assert!(matches("libfoo.so$", "/usr/lib/libfoo.so"));
        assert!(!matches("libfoo.so$", "/usr/lib/libfoo.so.1"));
        assert!(matches("Wor?d::load*", "engine::World::load_sky()"));
        assert!(!matches("World::save", "engine::World::load_sky()"));
        assert!(matches("*", ""));
    }

    #[test]
    fn whole_names_match_only_whole() {
        assert!(matches_whole(
            "JPH::*AllocateImpl",
            "JPH::AlignedAllocateImpl"
        ));
        assert!(matches_whole("JPH::*AllocateImpl", "JPH::AllocateImpl"));
        assert!(!matches_whole(
            "JPH::*AllocateImpl",
            "JPH::AllocateImplFast"
        ));
        assert!(!matches_whole("Allocate*", "JPH::AllocateImpl"));
        assert!(matches_whole(
            "JPH::STLAllocator*",
            "JPH::STLAllocator<int>::allocate"
        ));
    }
}
