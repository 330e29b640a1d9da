//! Dear ImGui (Debian's libimgui-dev) through `include/k15/imgui.h`: its blocks are tracked under
//! `"language": "imgui"` while the context lives, all given back by `DestroyContext`, and the
//! one block the program keeps is reported at its line.

mod support;

const SOURCE: &str = "samples/imgui/main.cpp";

#[test]
fn imgui_allocations_are_tracked_under_their_own_language() {
    let dir = support::scratch("imgui_sample");
    let exe = support::build(
        &dir,
        "imgui_sample",
        &[SOURCE, "-limgui", "-lstb"],
        &["-I", "/usr/include/imgui"],
    );
    let run = support::run(&exe, "");
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(run.stdout().contains("font atlas"), "{}", run.stdout());
    // While the context lived, ImGui's blocks were tracked under its name (with malloc=1, stb's
    // font rasterizer's would be beside them, as "c").
    let running = support::read_json(&dir.join("imgui_running.log.json"));
    let running = support::inflate(&running); // each leak with its site's fields
    let live: Vec<&serde_json::Value> = running["leaks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["language"] == "imgui")
        .collect();
    assert!(live.len() > 20, "{running:#}");
    assert!(live.iter().any(|l| l["stack"][0]["function"]
        .as_str()
        .unwrap_or("")
        .starts_with("ImFontAtlas")));
    // After DestroyContext only the kept block is left, at the program's line.
    assert_eq!(run.leaks().len(), 1, "{}", run.text);
    let leak = &run.leaks()[0];
    assert_eq!(leak["language"], "imgui");
    assert_eq!(leak["allocated_with"], "imgui");
    assert_eq!(leak["size"], 333);
    assert!(leak["file"].is_null());
    assert_eq!(leak["stack"][0]["function"], "main", "{}", run.text);
    assert_eq!(
        leak["stack"][0]["line"],
        support::line_of(SOURCE, "// LEAK")
    );
    assert!(
        run.text
            .contains("Direct leak of 333 bytes in 1 block (imgui) allocated from:"),
        "{}",
        run.text
    );
    assert_eq!(run.json["summary"]["errors"], 0);
}
