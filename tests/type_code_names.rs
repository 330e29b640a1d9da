//! Only mangled names are demangled: C functions named like Itanium type codes (`f`, `i`, `v`,
//! `Pc`, `Sa`) are shown as themselves, not as `float`, `int`, `void`, `char*` or
//! `std::allocator`, and a suppression of one by its name matches it alone
//! (`tests/cpp/type_code_names.cpp`, at `-O0` and `-O2`).

mod support;

const SOURCE: &str = "tests/cpp/type_code_names.cpp";

#[test]
fn c_functions_named_like_type_codes_are_reported_and_suppressed_by_their_names() {
    let dir = support::scratch("type_code_names");
    let rules = dir.join("f.supp");
    std::fs::write(&rules, "leak:^f$\n").unwrap();
    for build in ["-O0", "-O2"] {
        let exe = support::build(
            &dir,
            &format!("type_code_names{build}"),
            &[SOURCE],
            &[build],
        );
        let run = support::run(&exe, "");
        assert!(run.output.status.success(), "{}", run.stderr());
        for (size, name) in [(11, "f"), (12, "i"), (13, "v"), (14, "Pc"), (15, "Sa")] {
            let leak = run
                .leaks()
                .iter()
                .find(|l| l["size"] == size)
                .unwrap_or_else(|| panic!("{build}: no {size}-byte leak:\n{}", run.text));
            assert_eq!(leak["stack"][0]["function"], name, "{build}:\n{}", run.text);
            let marker = format!("// LEAK {name}");
            assert_eq!(leak["stack"][0]["line"], support::line_of(SOURCE, &marker));
        }
        let suppressed = support::run(&exe, &format!("suppressions={}", rules.display()));
        let summary = &suppressed.json["summary"];
        assert_eq!(summary["suppressed_blocks"], 1, "{}", suppressed.text);
        assert_eq!(summary["suppressed_bytes"], 11, "{}", suppressed.text);
    }
}
