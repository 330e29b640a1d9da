//! Times symbolizing 10,000 unique addresses spread through this binary's code, cold and
//! warm, against GNU `addr2line -f -i -C` on the same addresses. Prints numbers, asserts none.
//!
//! `cargo run --release --example symbolize_bench [count]`

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use k15_memory::symbolize::Symbolizer;
use object::{Object, ObjectSection};

fn main() {
    let count: usize = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(10_000);

    // Where this binary is loaded: a throwaway symbolizer resolves `main`.
    let here = Symbolizer::new().resolve(main as *const () as usize)[0].clone();
    let bias = here.address - here.module_offset;
    let data = std::fs::read(&here.module).expect("read own executable");
    let file = object::File::parse(&*data).expect("parse own executable");
    let text = file.section_by_name(".text").expect(".text");
    let (start, size) = (text.address() as usize, text.size() as usize);
    println!(
        "module {} (.text {:.1} MiB, {} KiB DWARF info)",
        here.module,
        size as f64 / (1 << 20) as f64,
        file.section_by_name(".debug_info")
            .map_or(0, |s| s.size() / 1024)
    );

    // Unique probes spread evenly; +1 because resolve treats them as return addresses.
    let step = size / count;
    let first: Vec<usize> = (0..count).map(|i| bias + start + i * step + 1).collect();
    let second: Vec<usize> = first.iter().map(|a| a + step / 2).collect();

    // A typical report: a few hundred unique addresses, from a fresh symbolizer.
    let small: Vec<usize> = first.iter().step_by(count / 300).copied().collect();
    let time = Instant::now();
    let mut symbolizer = Symbolizer::new();
    for &address in &small {
        std::hint::black_box(symbolizer.resolve(address));
    }
    let report = time.elapsed().as_secs_f64() * 1e3;
    println!(
        "k15 cold, {} addresses (typical report): {report:.1} ms",
        small.len()
    );

    let time = Instant::now();
    let mut symbolizer = Symbolizer::new();
    let mut frames = 0;
    for &address in &first {
        frames += symbolizer.resolve(address).len();
    }
    let cold = time.elapsed().as_secs_f64() * 1e3;

    let time = Instant::now();
    for &address in &second {
        frames += symbolizer.resolve(address).len();
    }
    let warm = time.elapsed().as_secs_f64() * 1e3;

    let time = Instant::now();
    for &address in &first {
        std::hint::black_box(symbolizer.resolve(address));
    }
    let cached = time.elapsed().as_secs_f64() * 1e3;

    let per = |ms: f64| ms * 1e3 / count as f64;
    println!("{count} unique addresses, {frames} frames over both passes");
    println!(
        "k15 cold (snapshot + load + resolve): {cold:8.1} ms  ({:.2} us/address)",
        per(cold)
    );
    println!(
        "k15 warm (loaded, new addresses):     {warm:8.1} ms  ({:.2} us/address)",
        per(warm)
    );
    println!(
        "k15 cached (same addresses again):    {cached:8.1} ms  ({:.3} us/address)",
        per(cached)
    );

    let input: String = first
        .iter()
        .map(|a| format!("{:#x}\n", a - bias - 1))
        .collect();
    let time = Instant::now();
    let gnu = Command::new("addr2line")
        .args(["-f", "-i", "-C", "-e", &here.module])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            // Feed stdin from another thread: addr2line answers as it reads, and a full
            // stdout pipe would otherwise block both sides.
            let mut stdin = child.stdin.take().expect("piped stdin");
            let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
            let output = child.wait_with_output()?;
            writer.join().expect("stdin writer")?;
            Ok(output)
        });
    let gnu_ms = time.elapsed().as_secs_f64() * 1e3;
    match gnu {
        Ok(output) if output.status.success() => println!(
            "GNU addr2line -f -i -C (same {count}):  {gnu_ms:8.1} ms  ({:.2} us/address); k15 cold is {:.1}x faster",
            per(gnu_ms),
            gnu_ms / cold
        ),
        _ => println!("GNU addr2line not available: no comparison"),
    }
}
