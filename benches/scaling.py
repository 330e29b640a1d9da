#!/usr/bin/env python3
"""Churn at 1 to 16 threads, and yaml-cpp's suite, on a machine with many cores.

A many-core machine lent for a few minutes has no Rust toolchain and no network: `prepare`
builds everything here into one folder, `run` runs it there with python3 alone.

    benches/scaling.py prepare DIR   # here, after `cargo build --release` (and, for yaml-cpp,
                                     # `cargo bench --bench real_code`, which builds its suite)
    benches/scaling.py run DIR       # there; figures on stdout and in $OUT/scaling.txt

churn (benches/programs/churn.cpp, -O2) prints nanoseconds per pair, wall time over the
pairs of one thread: flat as threads are added means linear scaling. Each row is the best of
three runs, ratios to glibc in the same row. yaml-cpp: interleaved rounds, CPU time (user +
system) as `cargo bench --bench real_code` measures it; the tracked suite's DWARF is
compressed to fit the transfer, so its default row pays for decompressing at exit (the
`report=0` row is the allocation path alone).
"""
import os
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
YAML_TESTS = os.path.join(REPO, "target/tmp/real_code/build/test")
MIMALLOC = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"
LIBLSAN = "/usr/lib/x86_64-linux-gnu/liblsan.so.0"
THREADS = (1, 2, 4, 8, 16)
PAIRS = 2000000


def sh(*argv):
    subprocess.run(argv, check=True, cwd=REPO)


def prepare(out):
    os.makedirs(out, exist_ok=True)
    lib = os.path.join(REPO, "target/release/libk15_memory.a")
    churn = ["-std=c++17", "-g", "-O2", "-I", "include", "benches/programs/churn.cpp"]
    link = ["-lpthread", "-ldl", "-o"]
    sh("g++", *churn, "-DK15_MEMORY_DISABLED", *link, f"{out}/churn_plain")
    sh("g++", *churn, lib, *link, f"{out}/churn_k15")
    sh("objcopy", "--compress-debug-sections=zlib", f"{out}/churn_k15")
    if shutil.which("clang++-14"):
        sh("clang++-14", *churn, "-fsanitize=leak", "-DK15_MEMORY_DISABLED", *link,
           f"{out}/churn_lsan")
    for runtime in (MIMALLOC, LIBLSAN):  # the other machine may have neither
        if os.path.exists(runtime):
            shutil.copy(runtime, out)
    # The suites as `cargo bench --bench real_code` linked them; only the tracked one keeps
    # its DWARF (compressed), which its report reads.
    for name, strip in (("yaml-cpp-tests", "--strip-debug"),
                        ("yaml-cpp-tests-k15", "--compress-debug-sections=zlib"),
                        ("yaml-cpp-tests-lsan", "--strip-debug")):
        if os.path.exists(os.path.join(YAML_TESTS, name)):
            sh("objcopy", strip, os.path.join(YAML_TESTS, name), f"{out}/{name}")


def run_once(argv, env_extra, cwd):
    env = dict(os.environ)
    env.update(env_extra)
    start = time.perf_counter()
    child = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
    out = child.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(child.pid, 0)
    return {"wall": time.perf_counter() - start, "cpu": usage.ru_utime + usage.ru_stime,
            "rss_kib": usage.ru_maxrss, "status": status, "stdout": out}


def run(folder):
    log = open(os.path.join(os.environ.get("OUT", folder), "scaling.txt"), "w")

    def say(line):
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    cpu = [l for l in open("/proc/cpuinfo") if l.startswith("model name")]
    say(f"{os.cpu_count()} cores: {cpu[0].split(':')[1].strip() if cpu else '?'}; "
        f"kernel {os.uname().release}")
    exe = lambda name: os.path.join(folder, name)
    tracker = lambda options: {"K15_MEMORY_OPTIONS": "report=0:" + options}
    churn = [("glibc", "churn_plain", {}),
             ("mimalloc", "churn_plain", {"LD_PRELOAD": exe("libmimalloc.so.2")}),
             ("k15 stacks off", "churn_k15", tracker("stack_depth=0")),
             ("k15 DWARF", "churn_k15", tracker("")),
             ("k15 frame pointers", "churn_k15", tracker("unwinder=frame_pointer")),
             ("LeakSanitizer", "churn_lsan", {})]
    churn = [c for c in churn if os.path.exists(exe(c[1]))
             and ("LD_PRELOAD" not in c[2] or os.path.exists(c[2]["LD_PRELOAD"]))]
    for shared in (False, True):
        say(f"\nchurn -O2, {PAIRS} new[]/delete[] pairs a thread, ns a pair (best of 3), "
            f"ratio to glibc{'; every iteration also stores to one shared line' if shared else ''}")
        say("threads " + "".join(f"{name:>22}" for name, _, _ in churn))
        for threads in THREADS:
            best = {}
            for _ in range(3):
                for name, program, env in churn:
                    argv = [exe(program), str(threads), str(PAIRS), "new"]
                    taken = run_once(argv + (["shared"] if shared else []), env, folder)
                    for line in taken["stdout"].splitlines():
                        if line.startswith("ns_per_pair "):
                            ns = float(line.split()[1])
                            best[name] = min(best.get(name, ns), ns)
            base = best.get("glibc", float("nan"))
            say(f"{threads:>7} " + "".join(
                f"{best[n]:>14.1f} ({best[n] / base:4.2f}x)" if n in best else f"{'-':>22}"
                for n, _, _ in churn))

    yaml = [("plain glibc", "yaml-cpp-tests", {}),
            ("k15 stack_depth=0", "yaml-cpp-tests-k15", {"K15_MEMORY_OPTIONS": "stack_depth=0"}),
            ("k15 default (report, -gz DWARF)", "yaml-cpp-tests-k15", {}),
            ("k15 DWARF stacks, report=0", "yaml-cpp-tests-k15", tracker("")),
            ("k15 frame pointers, report=0", "yaml-cpp-tests-k15",
             tracker("unwinder=frame_pointer")),
            ("LeakSanitizer (g++)", "yaml-cpp-tests-lsan", {"LD_LIBRARY_PATH": folder})]
    yaml = [y for y in yaml if os.path.exists(exe(y[1]))]
    if not yaml or yaml[0][1] != "yaml-cpp-tests":
        return
    rounds = int(os.environ.get("K15_BENCH_ROUNDS", "15"))
    scratch = os.path.join(folder, "yaml_runs")
    os.makedirs(scratch, exist_ok=True)
    taken = {name: [] for name, _, _ in yaml}
    for _ in range(rounds):
        for name, program, env in yaml:
            result = run_once([exe(program), "--gtest_brief=1"], env, scratch)
            if result["status"] != 0:
                say(f"  {name}: exit status {result['status']:#x}")
            taken[name].append(result)
    say(f"\nyaml-cpp's suite, {rounds} interleaved rounds: CPU time best and median, median of "
        "the rounds' ratios to plain (quartiles), least peak RSS and its ratio")
    base = taken["plain glibc"]
    base_rss = min(r["rss_kib"] for r in base)
    for name, runs in taken.items():
        cpu = sorted(r["cpu"] for r in runs)
        ratios = sorted(r["cpu"] / b["cpu"] for r, b in zip(runs, base))
        quartile = lambda q: ratios[round((len(ratios) - 1) * q)]
        rss = min(r["rss_kib"] for r in runs)
        say(f"  {name:<34} {cpu[0]:6.3f} s {statistics.median(cpu):6.3f} s "
            f"{quartile(0.5):5.2f}x ({quartile(0.25):.2f}-{quartile(0.75):.2f}x) "
            f"{rss / 1024:7.1f} MiB {rss / base_rss:5.2f}x")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("prepare", "run"):
        sys.exit(__doc__)
    (prepare if sys.argv[1] == "prepare" else run)(os.path.abspath(sys.argv[2]))
