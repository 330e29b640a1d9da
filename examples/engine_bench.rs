//! Engine allocators against glibc malloc and mimalloc in the same run: small-object churn (1 and 2 threads) and
//! frame scratch.
//!
//! `cargo run --release --example engine_bench`. Prints nanoseconds per operation and how many times faster the
//! engine allocator is (other/engine). mimalloc is Debian's `libmimalloc.so.2`, loaded with `dlopen`; without
//! it those columns are skipped with a note.

use std::hint::black_box;
use std::time::{Duration, Instant};

use k15_memory::engine::{ClassSpec, Pool, PoolConfig, StackAllocator};

const BATCH: usize = 1000;
const ROUNDS: usize = 2000;
const VARIANTS: usize = 16;
const CHURN_OPS: usize = 2 * BATCH * ROUNDS;
const FRAMES: usize = 20_000;
const ALLOCS_PER_FRAME: usize = 200;

/// Source of the random operation streams (the same stream drives both contenders).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// An allocator under test: allocate `size` bytes aligned to 16, free.
trait Contender: Sync {
    fn alloc(&self, size: usize) -> *mut u8;
    fn free(&self, ptr: *mut u8);
}

struct Malloc;

impl Contender for Malloc {
    fn alloc(&self, size: usize) -> *mut u8 {
        // SAFETY: plain malloc; every block is freed below with free.
        unsafe { libc::malloc(size).cast() }
    }
    fn free(&self, ptr: *mut u8) {
        // SAFETY: `ptr` came from `libc::malloc` and is freed once.
        unsafe { libc::free(ptr.cast()) }
    }
}

/// mimalloc's `mi_malloc`/`mi_free`, from the shared library.
struct Mimalloc {
    malloc: unsafe extern "C" fn(usize) -> *mut libc::c_void,
    free: unsafe extern "C" fn(*mut libc::c_void),
}

impl Mimalloc {
    fn load() -> Option<Mimalloc> {
        // SAFETY: dlopen/dlsym with NUL-terminated names; the symbols have the C signatures declared here
        // (mimalloc.h), and the library stays loaded for the rest of the process.
        unsafe {
            let library = libc::dlopen(c"libmimalloc.so.2".as_ptr(), libc::RTLD_NOW);
            if library.is_null() {
                return None;
            }
            let malloc = libc::dlsym(library, c"mi_malloc".as_ptr());
            let free = libc::dlsym(library, c"mi_free".as_ptr());
            if malloc.is_null() || free.is_null() {
                return None;
            }
            Some(Mimalloc {
                malloc: std::mem::transmute::<
                    *mut libc::c_void,
                    unsafe extern "C" fn(usize) -> *mut libc::c_void,
                >(malloc),
                free: std::mem::transmute::<
                    *mut libc::c_void,
                    unsafe extern "C" fn(*mut libc::c_void),
                >(free),
            })
        }
    }
}

impl Contender for Mimalloc {
    fn alloc(&self, size: usize) -> *mut u8 {
        // SAFETY: mi_malloc; every block is freed below with mi_free.
        unsafe { (self.malloc)(size).cast() }
    }
    fn free(&self, ptr: *mut u8) {
        // SAFETY: `ptr` came from mi_malloc and is freed once.
        unsafe { (self.free)(ptr.cast()) }
    }
}

impl Contender for Pool {
    fn alloc(&self, size: usize) -> *mut u8 {
        Pool::alloc(self, size, 16)
            .expect("pool sized for the benchmark")
            .as_ptr()
    }
    fn free(&self, ptr: *mut u8) {
        Pool::free(self, ptr).expect("a live pool block");
    }
}

/// Rounds of: allocate `BATCH` blocks of 16..=256 bytes (touching each), then free them in a shuffled order.
/// The sizes and orders are precomputed, so the loop itself costs little and branches predictably.
fn churn(contender: &dyn Contender, seed: u64) -> Duration {
    let mut rng = Rng(seed);
    let variants: Vec<(Vec<usize>, Vec<usize>)> = (0..VARIANTS)
        .map(|_| {
            let sizes = (0..BATCH)
                .map(|_| 16 + (rng.next() % 241) as usize)
                .collect();
            let mut order: Vec<usize> = (0..BATCH).collect();
            for index in (1..BATCH).rev() {
                order.swap(index, (rng.next() % (index as u64 + 1)) as usize);
            }
            (sizes, order)
        })
        .collect();
    let mut blocks = vec![std::ptr::null_mut::<u8>(); BATCH];
    let start = Instant::now();
    for round in 0..ROUNDS {
        let (sizes, order) = &variants[round % VARIANTS];
        for (block, &size) in blocks.iter_mut().zip(sizes) {
            *block = contender.alloc(size);
            // SAFETY: the block has at least 16 bytes.
            unsafe { block.write(size as u8) };
        }
        for &index in order {
            contender.free(blocks[index]);
        }
    }
    start.elapsed()
}

/// Runs the calling thread on CPU `cpu` only, so "2 threads" means two cores working at once (unpinned, the
/// scheduler sometimes stacks both on one core, which hides all cross-core traffic).
fn pin_to_cpu(cpu: usize) {
    // SAFETY: `set` is a plain bit set, initialised by CPU_ZERO before use.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Nanoseconds per operation of `threads` threads churning at once on one contender.
fn churn_ns(contender: &dyn Contender, threads: usize) -> f64 {
    let elapsed: Vec<Duration> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || {
                    pin_to_cpu(thread);
                    churn(contender, 0x9E37 + thread as u64)
                })
            })
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect()
    });
    let slowest = elapsed.into_iter().max().unwrap();
    slowest.as_nanos() as f64 / CHURN_OPS as f64
}

/// Per frame: `ALLOCS_PER_FRAME` scratch blocks of 16..=512 bytes, all released at frame end.
fn frames_with_stack(stack: &mut StackAllocator) -> f64 {
    let mut rng = Rng(7);
    let start = Instant::now();
    for _ in 0..FRAMES {
        let mut frame = stack.scope();
        for _ in 0..ALLOCS_PER_FRAME {
            let block = frame
                .alloc(16 + (rng.next() % 497) as usize, 16)
                .expect("frame fits");
            black_box(block);
        }
    }
    start.elapsed().as_nanos() as f64 / (FRAMES * ALLOCS_PER_FRAME) as f64
}

/// The same frames with a general-purpose allocator: every block freed at frame end.
fn frames_with(contender: &dyn Contender) -> f64 {
    let mut rng = Rng(7);
    let mut blocks = Vec::with_capacity(ALLOCS_PER_FRAME);
    let start = Instant::now();
    for _ in 0..FRAMES {
        for _ in 0..ALLOCS_PER_FRAME {
            blocks.push(black_box(contender.alloc(16 + (rng.next() % 497) as usize)));
        }
        for block in blocks.drain(..) {
            contender.free(block);
        }
    }
    start.elapsed().as_nanos() as f64 / (FRAMES * ALLOCS_PER_FRAME) as f64
}

/// "name ns  other/engine ratio" for each contender that is present.
fn compare(engine_ns: f64, others: &[(&str, Option<f64>)]) -> String {
    others
        .iter()
        .map(|(name, ns)| match ns {
            Some(ns) => format!("  {name} {ns:6.2} ({:5.2}x)", ns / engine_ns),
            None => format!("  {name} skipped (libmimalloc.so.2 not found)"),
        })
        .collect()
}

fn main() {
    let classes: Vec<ClassSpec> = (4..=8)
        .map(|log2| ClassSpec {
            block_size: 1 << log2,
            block_count: 8 * BATCH,
        })
        .collect();
    let pool = Pool::new("bench", PoolConfig { classes: &classes }).expect("pool");
    let mimalloc = Mimalloc::load();
    println!("small objects, 16..256 bytes, batches of {BATCH} freed in random order, per thread");
    println!(
        "(ns/op, lower is better; in parentheses other/pool: how many times faster the pool is)"
    );
    for threads in [1, 2] {
        // Each contender runs once unmeasured, so first-touch page faults are not measured.
        let measure = |contender: &dyn Contender| {
            churn_ns(contender, threads);
            churn_ns(contender, threads)
        };
        let (pool_ns, malloc_ns) = (measure(&pool), measure(&Malloc));
        let mimalloc_ns = mimalloc.as_ref().map(|m| measure(m));
        let others = [("glibc", Some(malloc_ns)), ("mimalloc", mimalloc_ns)];
        println!(
            "  {threads} thread(s): pool {pool_ns:6.2}{}",
            compare(pool_ns, &others)
        );
    }
    let mut stack = StackAllocator::new("bench-frame", 1 << 20).expect("stack");
    frames_with_stack(&mut stack);
    frames_with(&Malloc);
    let stack_ns = frames_with_stack(&mut stack);
    let malloc_ns = frames_with(&Malloc);
    let mimalloc_ns = mimalloc.as_ref().map(|m| {
        frames_with(m);
        frames_with(m)
    });
    println!("frame scratch, {ALLOCS_PER_FRAME} blocks of 16..512 bytes per frame, freed at frame end (ns/alloc)");
    let others = [("glibc", Some(malloc_ns)), ("mimalloc", mimalloc_ns)];
    println!("  stack {stack_ns:6.2}{}", compare(stack_ns, &others));
}
