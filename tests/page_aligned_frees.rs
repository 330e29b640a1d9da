//! `free` of page-aligned blocks from glibc's thread arenas with `malloc=0` (the default): the
//! search for a large block of the tracker's own in the pages before the pointer stops at an
//! unreadable page (an arena's `PROT_NONE` reserve) instead of reading it.

mod support;

#[test]
fn page_aligned_glibc_blocks_of_thread_arenas_are_freed_without_a_crash() {
    let dir = support::scratch("page_aligned_frees");
    let exe = support::build(
        &dir,
        "page_aligned_frees",
        &["tests/cpp/page_aligned_frees.cpp"],
        &[],
    );
    // Where arenas land differs from run to run; before the fix every run crashed.
    for attempt in 0..3 {
        let run = support::run(&exe, "malloc=0");
        assert!(
            run.output.status.success() && run.stdout().contains("survived"),
            "run {attempt}: {:?}\n{}\n{}",
            run.output.status,
            run.stdout(),
            run.stderr()
        );
        assert!(
            run.stderr().contains("0 memory errors"),
            "run {attempt}: glibc's blocks went back to glibc\n{}",
            run.stderr()
        );
    }
}
