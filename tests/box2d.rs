//! A real Box2D world (Debian's libbox2d-dev, whose `b2Alloc` is `malloc`) with one leaked
//! debris world (`malloc=1`): its blocks are reported at the user's lines with Box2D's frames
//! above them, and valgrind counts the same blocks and bytes.

mod support;
use serde_json::Value;

const SOURCE: &str = "samples/box2d/main.cpp";

fn build(dir: &std::path::Path, name: &str, extra: &[&str]) -> std::path::PathBuf {
    support::build(dir, name, &[SOURCE, "-lbox2d"], extra)
}

fn through_user_code(leak: &Value) -> bool {
    leak["stack"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["function"].as_str() == Some("(anonymous namespace)::spawn_debris()"))
}

#[test]
fn the_leaked_world_and_its_box2d_blocks_are_reported_and_valgrind_agrees() {
    let dir = support::scratch("box2d_world");
    let exe = build(&dir, "box2d_world", &[]);
    let run = support::run(&exe, "malloc=1");
    assert!(run.output.status.success(), "{}", run.stderr());
    assert!(
        run.stdout().contains("debris bodies: 1"),
        "{}",
        run.stdout()
    );
    let ours: Vec<&Value> = run
        .leaks()
        .iter()
        .filter(|l| through_user_code(l))
        .collect();
    // The world itself (new) and Box2D's blocks under it (malloc, from libbox2d.so).
    let world: Vec<&&Value> = ours.iter().filter(|l| l["language"] == "c++").collect();
    assert_eq!(world.len(), 1, "{}", run.text);
    assert_eq!(
        world[0]["stack"][0]["function"],
        "(anonymous namespace)::spawn_debris()"
    );
    let body_chunk = ours
        .iter()
        .find(|l| {
            l["stack"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["function"] == "b2World::CreateBody(b2BodyDef const*)")
        })
        .expect("the body's block");
    assert_eq!(body_chunk["language"], "c");
    assert_eq!(body_chunk["allocated_with"], "malloc");
    let stack = body_chunk["stack"].as_array().unwrap();
    assert!(
        stack[0]["function"]
            .as_str()
            .unwrap()
            .starts_with("b2BlockAllocator::Allocate"),
        "Box2D's allocator is the innermost frame, b2Alloc left out: {}",
        run.text
    );
    let user = stack
        .iter()
        .find(|f| f["file"].as_str().is_some_and(|f| f.ends_with(SOURCE)))
        .unwrap();
    assert_eq!(
        user["line"],
        support::line_of(SOURCE, "body_def.position.Set") + 1
    );
    assert!(
        stack
            .iter()
            .any(|f| f["line"] == support::line_of(SOURCE, "// LEAK")),
        "{}",
        run.text
    );
    assert!(!run.text.contains("b2Alloc"), "{}", run.text);
    assert_eq!(run.json["summary"]["errors"], 0);

    let plain = build(&dir, "box2d_plain", &["-DK15_MEMORY_DISABLED"]);
    let text = support::valgrind_leak_check(&plain, &dir, &[]);
    let lost = support::valgrind_lost(&text);
    let our_bytes: u64 = ours.iter().map(|l| l["size"].as_u64().unwrap()).sum();
    assert_eq!(
        lost,
        (ours.len() as u64, our_bytes),
        "valgrind:\n{text}\nours:\n{}",
        run.text
    );
    assert!(ours.len() > 5, "{}", run.text);
}
