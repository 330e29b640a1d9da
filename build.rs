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
    println!("cargo:rustc-cdylib-link-arg=-fuse-ld=gold");
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
