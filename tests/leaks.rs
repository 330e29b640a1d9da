//! The sample engine: exactly its three deliberate leaks, with size, array flag, file and line.

mod support;

#[test]
fn engine_sample_reports_exactly_its_three_leaks() {
    let dir = support::scratch("leaks_engine");
    let exe = support::build(&dir, "engine", &support::ENGINE_SAMPLE, &[]);
    let run = support::run(&exe, "");
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(
        run.stdout().starts_with("engine: 9 entities"),
        "{}",
        run.stdout()
    );

    let world = "samples/engine/world.cpp";
    let header = "samples/engine/aligned_allocator.h";
    let mut expected = vec![
        (
            64 * 12,
            true,
            Some(world.to_owned()),
            support::line_of(world, "K15_NEW Vec3[64]"),
        ),
        (
            56,
            false,
            Some(world.to_owned()),
            support::line_of(world, "K15_NEW Entity;"),
        ),
        (
            100 * 4 + 112,
            false,
            Some(header.to_owned()),
            support::line_of(header, "__FILE__, __LINE__"),
        ),
    ];
    expected.sort();
    assert_eq!(run.leak_set(), expected, "report:\n{}", run.text);

    // The job buffer leaked on a worker thread, the others on the main thread (number 1).
    for leak in run.leaks() {
        let on_worker = leak["file"].as_str() == Some(header);
        assert_eq!(leak["thread"].as_u64().unwrap() != 1, on_worker, "{leak}");
        assert_eq!(leak["language"], "c++");
        assert!(leak["seq"].as_u64().unwrap() > 0);
    }
    let summary = &run.json["summary"];
    assert_eq!(summary["leaked_blocks"], 3);
    assert_eq!(summary["leaked_bytes"], 1336);
    assert_eq!(summary["errors"], 0);
    assert!(summary["total_allocations"].as_u64().unwrap() > 50);
    assert!(summary["peak_bytes"].as_u64().unwrap() >= 1336);
    assert_eq!(run.json["format"], "k15-leaks/3");
    assert_eq!(run.json["program"], exe.to_str().unwrap());

    // The text report: largest site first, each with its kind.
    let text = &run.text;
    let first = text
        .find("Direct leak of 768 bytes in 1 block (new[])")
        .expect(text);
    let second = text
        .find("Direct leak of 512 bytes in 1 block (new)")
        .expect(text);
    let third = text
        .find("Direct leak of 56 bytes in 1 block (new)")
        .expect(text);
    assert!(first < second && second < third, "{text}");
    assert!(
        text.contains("SUMMARY: k15-memory: 1336 bytes leaked in 3 blocks; 0 memory errors"),
        "{text}"
    );
    assert!(
        run.stderr()
            .contains("k15-memory: 3 leaked blocks (1336 bytes)"),
        "{}",
        run.stderr()
    );
}
