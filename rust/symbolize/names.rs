//! Demangling of symbol-table names and the own-frame filter (tracker and allocator wrappers).

use std::borrow::Cow;

/// Demangles a symbol-table name, whose language is unknown.
///
/// Rust is tried first: legacy Rust names (`_ZN...17h<hash>E`) are valid Itanium names too,
/// and only the Rust demangler drops the `::h<hash>` suffix (style anchors 9.6).
pub(crate) fn demangle_symbol(raw: &str) -> String {
    demangle(Cow::Borrowed(raw), None)
}

/// Demangles a mangled name (`_Z...`: C++ and legacy Rust; `_R...`: Rust v0) of `language` (as
/// DWARF gives it; `None`: unknown) and returns any other name as it is: a C function `f`,
/// `i` or `Pc` is itself, not the type (`float`, `int`, `char*`) an Itanium demangler reads
/// into it, so the report shows it and suppressions match it by its name.
pub(crate) fn demangle(raw: Cow<'_, str>, language: Option<addr2line::gimli::DwLang>) -> String {
    if raw.starts_with("_Z") || raw.starts_with("_R") {
        addr2line::demangle_auto(raw, language).into_owned()
    } else {
        raw.into_owned()
    }
}

/// Whether a frame is the tracker's own thread start (`cpp/threads.cpp`), which lies between
/// glibc's `start_thread` and the program's start routine in the stack of every thread the
/// program starts: the stacks shown leave it out wherever it is.
pub fn is_thread_start_of_ours(function: &str) -> bool {
    // Asked of every frame shown: a compare of the name's end first (a substring search per
    // frame cost a sixth of a 20,000-stack report), the parse only for a candidate.
    function.ends_with("start_in_the_record(void*)")
        && qualified_name(function) == "k15::memory::detail::start_in_the_record"
}

/// Whether a demangled function name belongs to the tracker or to an allocator wrapper, so
/// that a report starts at the frame the user wrote.
///
/// Matches the `k15_memory::` crate and `k15::memory::detail`, every global or class-level
/// `operator new`/`new[]` (Bullet's `BT_DECLARE_ALIGNED_ALLOCATOR` ones included) and
/// `operator delete`/`delete[]` (the top of a free stack), Rust's allocator shims
/// (`__rust_alloc`, `__rg_alloc`, `__rdl_alloc` and their realloc/dealloc/zeroed forms), the
/// `alloc` crate (`alloc::alloc::*`, `alloc::raw_vec::*`, `Vec`/`Box`/`String` growth paths),
/// `core::alloc`/`std::alloc` and any `GlobalAlloc`/`Allocator` impl, Bullet's
/// `btAlignedAlloc*`/`btAlignedFree*` functions, `btAlignedAllocator` and
/// `btAlignedObjectArray::allocate` (Bullet's `raw_vec`), Box2D's `b2Alloc`/`b2Free` and
/// ImGui's `MemAlloc`/`MemFree`, and libstdc++'s allocator classes and `_M_allocate*` helpers.
pub fn is_allocator_frame(function: &str) -> bool {
    let name = qualified_name(function);
    const PREFIXES: &[&str] = &[
        "k15_memory::",
        "k15::memory::detail::",
        "alloc::",
        "core::alloc::",
        "std::alloc::",
        "btAlignedAllocator<",
        "std::allocator<",
        "std::allocator_traits<",
        "std::__new_allocator<",
        "__gnu_cxx::new_allocator<",
    ];
    const ALLOCATOR_TRAITS: &[&str] = &[
        " as core::alloc::global::GlobalAlloc>::",
        " as core::alloc::Allocator>::",
        // The alloc crate's own traits (`<u8 as alloc::vec::spec_from_elem::SpecFromElem>`):
        // Vec and String building their buffers.
        " as alloc::",
    ];
    const OPERATORS: &[&str] = &[
        "operator new",
        "operator new[]",
        "operator delete",
        "operator delete[]",
    ];
    const BULLET: &[&str] = &[
        "btAlignedAllocInternal",
        "btAlignedAllocDefault",
        "btAlignedFreeInternal",
        "btAlignedFreeDefault",
    ];
    // Engines' own wrappers over `malloc` or `k15::memory::allocate`: their caller allocates.
    const ENGINE_HOOKS: &[&str] = &[
        "ImGui::MemAlloc",
        "ImGui::MemFree",
        "b2Alloc",
        "b2Alloc_Default",
        "b2Free",
        "b2Free_Default",
    ];
    // Rust trait impls read `<Type as Trait>::method`: the type decides whose frame it is.
    let path = name.strip_prefix('<').unwrap_or(name);
    let last = name.rsplit("::").next().unwrap_or(name);
    PREFIXES.iter().any(|prefix| path.starts_with(prefix))
        || ALLOCATOR_TRAITS.iter().any(|infix| name.contains(infix))
        || OPERATORS.contains(&last)
        || BULLET.contains(&name)
        || ENGINE_HOOKS.contains(&name)
        || is_rust_alloc_shim(name.strip_prefix("__rustc::").unwrap_or(name))
        || (name.starts_with("std::") && last.starts_with("_M_allocate"))
        || (name.starts_with("btAlignedObjectArray<") && last == "allocate")
}

/// The patterns of `alloc_fns=` (by commas; blanks around them and empty ones dropped).
pub fn alloc_fn_patterns(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Whether `function` (demangled) is one of the program's own allocation wrappers: a pattern of
/// `alloc_fns=` matches its whole qualified name (parameters and return type left out, as
/// valgrind's `--alloc-fns` matches) or its whole name as shown.
pub fn is_alloc_fn(function: &str, patterns: &[String]) -> bool {
    let name = qualified_name(function);
    patterns
        .iter()
        .any(|p| super::glob::matches_whole(p, name) || super::glob::matches_whole(p, function))
}

/// `__rust_alloc` and friends: the symbols rustc generates to reach `#[global_allocator]`.
fn is_rust_alloc_shim(name: &str) -> bool {
    ["__rust_", "__rg_", "__rdl_"].iter().any(|prefix| {
        name.strip_prefix(prefix)
            .is_some_and(|op| matches!(op, "alloc" | "alloc_zeroed" | "realloc" | "dealloc"))
    })
}

/// The qualified name of a demangled function: the parameter list and, for function
/// templates, the return type removed (`void k15::memory::detail::f<int>(int) const` gives
/// `k15::memory::detail::f<int>`; `A::operator new[](unsigned long)` gives
/// `A::operator new[]`). Rust names have neither and come back unchanged.
fn qualified_name(function: &str) -> &str {
    let bytes = function.as_bytes();
    // Nesting of <...> and {...} ({lambda(int)#1}); parentheses inside them are not the
    // parameter list.
    let mut depth = 0usize;
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let rest = &function[i..];
        if rest.starts_with("(anonymous namespace)") {
            i += "(anonymous namespace)".len();
            continue;
        }
        if rest.starts_with("operator")
            && !is_ident_byte(i.checked_sub(1).map(|j| bytes[j]))
            && !is_ident_byte(bytes.get(i + 8).copied())
        {
            // Operator names contain the characters the depth count and the return-type
            // split rely on: `operator<<`, `operator()`, `operator new[]`.
            i += 8;
            if function[i..].starts_with("()") {
                i += 2;
            } else {
                i += function[i..]
                    .bytes()
                    .take_while(|b| b" <>=!+-*/%^&|~[],".contains(b))
                    .count();
                // `operator new`, `operator delete`, conversion operators: one word more.
                if bytes.get(i - 1) == Some(&b' ') {
                    i += function[i..]
                        .bytes()
                        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
                        .count();
                    i += function[i..]
                        .bytes()
                        .take_while(|b| b"[]".contains(b))
                        .count();
                }
            }
            continue;
        }
        match bytes[i] {
            b'<' | b'{' => depth += 1,
            b'>' | b'}' => depth = depth.saturating_sub(1),
            b'(' if depth == 0 => return &function[start..i],
            b' ' if depth == 0 => start = i + 1,
            _ => {}
        }
        i += 1;
    }
    &function[start..]
}

fn is_ident_byte(byte: Option<u8>) -> bool {
    byte.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_fns_match_whole_qualified_names() {
        let patterns = alloc_fn_patterns(" JPH::*AllocateImpl , JPH::STLAllocator*,,my_alloc");
        assert_eq!(patterns.len(), 3);
        for name in [
            "JPH::AllocateImpl(unsigned long)",
            "JPH::AlignedAllocateImpl(unsigned long, unsigned long)",
            "JPH::STLAllocator<JPH::Body*>::allocate(unsigned long)",
            "my_alloc",
            "my_alloc(unsigned long)",
        ] {
            assert!(is_alloc_fn(name, &patterns), "{name} should be dropped");
        }
        for name in ["JPH::Body::Body()", "my_alloc_checked(int)", "not_my_alloc"] {
            assert!(!is_alloc_fn(name, &patterns), "{name} should be kept");
        }
    }

    #[test]
    fn only_the_trackers_thread_start_is_hidden_anywhere() {
        assert!(is_thread_start_of_ours(
            "k15::memory::detail::start_in_the_record(void*)"
        ));
        assert!(!is_thread_start_of_ours(
            "(anonymous namespace)::start_in_the_record(void*)"
        ));
        assert!(!is_thread_start_of_ours("start_thread"));
    }

    #[test]
    fn qualified_names() {
        assert_eq!(qualified_name("World::spawn(int)"), "World::spawn");
        assert_eq!(
            qualified_name("void k15::memory::detail::f<int>(int) const"),
            "k15::memory::detail::f<int>"
        );
        assert_eq!(
            qualified_name("btSphereShape::operator new[](unsigned long)"),
            "btSphereShape::operator new[]"
        );
        assert_eq!(
            qualified_name("operator new(unsigned long, std::align_val_t)"),
            "operator new"
        );
        assert_eq!(
            qualified_name("std::ostream::operator<<(int)"),
            "std::ostream::operator<<"
        );
        assert_eq!(
            qualified_name("Foo::operator()(int) const"),
            "Foo::operator()"
        );
        assert_eq!(
            qualified_name("(anonymous namespace)::g(std::map<int, long>)"),
            "(anonymous namespace)::g"
        );
        assert_eq!(
            qualified_name("main::{lambda(int)#1}::operator()(int) const"),
            "main::{lambda(int)#1}::operator()"
        );
        assert_eq!(
            qualified_name("<k15_memory::TrackedAlloc as core::alloc::global::GlobalAlloc>::alloc"),
            "<k15_memory::TrackedAlloc as core::alloc::global::GlobalAlloc>::alloc"
        );
        assert_eq!(
            qualified_name("alloc::vec::Vec<T,A>::push"),
            "alloc::vec::Vec<T,A>::push"
        );
    }

    #[test]
    fn own_frames() {
        for name in [
            "k15_memory::tracker::allocate",
            "k15_memory::stack::capture::<32>",
            "<k15_memory::TrackedAlloc as core::alloc::global::GlobalAlloc>::alloc",
            "k15::memory::detail::allocate(unsigned long, bool)",
            "void* k15::memory::detail::checked<char>(unsigned long)",
            "operator new(unsigned long)",
            "operator new[](unsigned long)",
            "operator new(unsigned long, std::align_val_t)",
            "operator new(unsigned long, std::nothrow_t const&)",
            "operator new(unsigned long, char const*, int)",
            "operator delete(void*, unsigned long)",
            "operator delete[](void*)",
            "btSphereShape::operator new(unsigned long)",
            "btCollisionObject::operator new[](unsigned long)",
            "btAlignedAllocInternal(unsigned long, int)",
            "btAlignedAllocDefault",
            "b2Alloc_Default(int)",
            "ImGui::MemAlloc(unsigned long)",
            "btAlignedFreeInternal(void*)",
            "btAlignedAllocator<btVector3, 16u>::allocate(int, btVector3 const**)",
            "btAlignedObjectArray<btBroadphasePair>::allocate(int)",
            "__rust_alloc",
            "__rust_realloc",
            "__rustc::__rust_alloc_zeroed",
            "__rg_alloc",
            "__rdl_dealloc",
            "std::alloc::__default_lib_allocator::__rdl_alloc",
            "alloc::alloc::alloc",
            "alloc::alloc::exchange_malloc",
            "<alloc::alloc::Global as core::alloc::Allocator>::allocate",
            "alloc::raw_vec::RawVec<T,A>::grow_one",
            "alloc::raw_vec::finish_grow",
            "<std::alloc::System as core::alloc::global::GlobalAlloc>::alloc",
            "<my_game::Arena as core::alloc::global::GlobalAlloc>::alloc",
            "std::__new_allocator<int>::allocate(unsigned long, void const*)",
            "std::allocator_traits<std::allocator<int> >::allocate(std::allocator<int>&, unsigned long)",
            "std::_Vector_base<int, std::allocator<int> >::_M_allocate(unsigned long)",
        ] {
            assert!(is_allocator_frame(name), "{name} should be filtered");
        }
        for name in [
            "World::spawn(int)",
            "main",
            "my_game::spawn",
            "k15_memory_user::run",
            "operator newline(int)",
            "cooperator(int)",
            "Foo::operator==(Foo const&) const",
            "std::vector<k15::memory::detail::Block, std::allocator<k15::memory::detail::Block> >::push_back(k15::memory::detail::Block const&)",
            "btCollisionWorld::addCollisionObject(btCollisionObject*, int, int)",
            "btAlignedObjectArray<btBroadphasePair>::push_back(btBroadphasePair const&)",
            "__rust_begin_short_backtrace",
            "core::fmt::write",
            "std::thread::spawn",
        ] {
            assert!(!is_allocator_frame(name), "{name} should be kept");
        }
    }

    #[test]
    fn demangles_both_languages() {
        assert_eq!(demangle_symbol("_ZN5World5spawnEi"), "World::spawn(int)");
        assert_eq!(
            demangle_symbol("_ZN10k15_memory7tracker8allocate17h0123456789abcdefE"),
            "k15_memory::tracker::allocate"
        );
        assert_eq!(demangle_symbol("atoi"), "atoi");
        assert_eq!(
            demangle_symbol("_RNvCs15kBYyAo9fc_7mycrate7example"),
            "mycrate::example"
        );
    }

    #[test]
    fn c_names_that_read_as_type_codes_stay_themselves() {
        for name in ["f", "i", "v", "Pc", "Sa", "St", "d", "Ss"] {
            assert_eq!(demangle_symbol(name), name);
            assert_eq!(demangle(Cow::Borrowed(name), Some(gimli_cpp())), name);
        }
        assert_eq!(demangle(Cow::Borrowed("_Z1fv"), Some(gimli_cpp())), "f()");
    }

    fn gimli_cpp() -> addr2line::gimli::DwLang {
        addr2line::gimli::DW_LANG_C_plus_plus
    }
}
