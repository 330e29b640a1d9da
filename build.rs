//! Builds the C++ side (`cpp/`) and the cxx bridge into one static library, linked whole so
//! that rustc-linked programs get the `operator new` replacements too (field notes: with
//! rustc's link order, libstdc++'s operators would otherwise win silently).

fn main() {
    let sources = [
        "cpp/new_delete.cpp",
        "cpp/api.cpp",
        "cpp/bullet_hooks.cpp",
        "cpp/engine.cpp",
        "cpp/take_over.cpp",
        "cpp/modules.cpp",
        "cpp/mappings.cpp",
        "cpp/malloc.cpp",
        "cpp/threads.cpp",
    ];
    cxx_build::bridge("rust/ffi.rs")
        .files(sources)
        .include("include")
        .std("c++17")
        .flag("-Wall")
        .flag("-Wextra")
        .flag("-fno-omit-frame-pointer")
        .flag("-g")
        .cargo_metadata(false)
        .compile("k15_memory_cpp");
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rustc-link-search=native={out_dir}");
    println!("cargo:rustc-link-lib=static:+whole-archive=k15_memory_cpp");
    println!("cargo:rustc-link-lib=stdc++");
    // libk15_memory.so for LD_PRELOAD: rustc's version script exports only Rust symbols, and GNU
    // ld refuses a second one; gold merges ours (cpp/exports.map: the C++ operators) with it.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-cdylib-link-arg={}", gold_linker_arg(&out_dir));
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={manifest_dir}/cpp/exports.map");
    for path in sources.iter().chain(&[
        "rust/ffi.rs",
        "cpp/entry.h",
        "cpp/exports.map",
        "include/k15/memory.h",
        "include/k15/bullet.h",
        "include/k15/engine.h",
        "include/k15/memory_c.h",
    ]) {
        println!("cargo:rerun-if-changed={path}");
    }
}

/// The link argument that makes the C++ driver link with gold: `-B` a directory whose `ld` is
/// `ld.gold`. (With `-fuse-ld=gold` rustc prints a deprecation warning on every build that
/// users would read as a problem of theirs; gold is needed for the one `.so` alone, see above.)
/// Without `ld.gold` in `PATH`, `-fuse-ld=gold`, whose link then says what is missing.
fn gold_linker_arg(out_dir: &str) -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let Some(gold) = std::env::split_paths(&path)
        .map(|dir| dir.join("ld.gold"))
        .find(|candidate| candidate.is_file())
    else {
        return "-fuse-ld=gold".to_owned();
    };
    let dir = std::path::Path::new(out_dir).join("gold-linker");
    std::fs::create_dir_all(&dir).expect("OUT_DIR is writable");
    let ld = dir.join("ld");
    let _ = std::fs::remove_file(&ld);
    std::os::unix::fs::symlink(&gold, &ld).expect("a symlink in OUT_DIR");
    format!("-B{}", dir.display())
}
