//! `html_path=`: the JSON report just written, read back and written again as one HTML page.

/// Writes the page of the JSON report at `json_path` to `html_path`; the error is one line.
pub fn write(json_path: &str, html_path: &str) -> Result<(), String> {
    let json = std::fs::read_to_string(json_path).map_err(|e| format!("{json_path}: {e}"))?;
    let page = k15_memory_readers::html_from_report_json(&json).map_err(|e| e.to_string())?;
    std::fs::write(html_path, page).map_err(|e| format!("{html_path}: {e}"))
}
