#!/usr/bin/env python3
"""Where the tracker's default costs go on a real suite, in instructions (valgrind).

    benches/overhead_split.py yaml-cpp|bullet   # after `cargo bench --bench real_code` built it

Runs the suite's programs as that benchmark linked them (layout 0) under cachegrind: plain,
the tracker's default, `report=0`, `stack_depth=0` and LeakSanitizer, each total over plain's;
then the tracked `report=0` run under callgrind, its self cost split by the source file of each
instruction's line (code inlined into the allocation entry points counts where it was written),
against plain's glibc allocator. The report at exit is the default's total less `report=0`'s.
Per allocation: over the tracker's count of allocations (the summary line of its report).
Takes 5 to 10 minutes a suite on a 2-core machine.
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITES = {
    "yaml-cpp": ("target/tmp/real_code/build/test/yaml-cpp-tests", ["--gtest_brief=1"]),
    "bullet": ("target/tmp/real_code_bullet/build/bullet_scenes", ["2"]),
}
# The tracker's parts, by the file under rust/ a line comes from.
COUNTERS = ("tags.rs", "frames.rs", "profile.rs", "timeline.rs", "checkpoints.rs", "tag_budgets.rs")
REPORT_DIRS = ("/rust/report/", "/rust/symbolize/", "/rust/process/")
INTERNING = ("depot.rs", "pending_stacks.rs")
GLIBC_ALLOCATOR = re.compile(
    r"^(malloc|free|calloc|realloc|cfree|_int_malloc|_int_free|_int_realloc|malloc_consolidate|"
    r"tcache_init|unlink_chunk|sysmalloc|alloc_perturb|__libc_(malloc|free|calloc|realloc))\b")
ROW = re.compile(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*?):(.*?)(?: \[.*\])?$")
PARTS = ("walk", "interning", "heap, header, entry", "tag and frame counters")


def part(file, function):
    """Which part of the overhead an instruction at `file` in `function` belongs to."""
    ours = file.startswith(REPO) and ("/rust/" in file or "/cpp/" in file)
    name = file.rsplit("/", 1)[-1]
    if ours:
        if any(d in file for d in REPORT_DIRS):
            return "report at exit"
        if name in INTERNING or "intern" in function:
            return "interning"
        if "/rust/stack/" in file:
            return "walk"
        return "tag and frame counters" if name in COUNTERS else "heap, header, entry"
    # The tracker's `malloc` and `free` (cpp/malloc.cpp) are the tracker's, not glibc's.
    if GLIBC_ALLOCATOR.match(function) or "/malloc/" in file:
        return "glibc allocator"
    # Library code (core, framehop, gimli) inlined into or called by the tracker's functions.
    if function.startswith("gimli::read::cfi") or "framehop" in function:
        return "walk"
    if "k15_memory" in function:
        if "intern" in function or "depot" in function or "pending_stacks" in function:
            return "interning"
        return "walk" if "::stack::" in function else "heap, header, entry"
    return "program, libc"


def self_costs(profile, annotate):
    """Instructions by part, from the self cost per file:function of `profile`."""
    # Every function: callgrind_annotate's threshold is a cumulative share, cg_annotate's a floor.
    if annotate == "callgrind_annotate":
        args = [annotate, "--inclusive=no", "--auto=no", "--threshold=100", profile]
    else:
        args = [annotate, "--auto=no", "--threshold=0", profile]
    lines = subprocess.run(args, check=True, capture_output=True, text=True).stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().endswith("file:function"))
    by_part = collections.Counter()
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith("---"):
            break
        row = ROW.match(line)
        if row:
            by_part[part(row.group(2), row.group(3))] += int(row.group(1).replace(",", ""))
    return by_part


def valgrind(tool, exe, args, options, out, scratch):
    """Instructions of one run of `exe` under `tool`, its profile written to `out`."""
    env = dict(os.environ, K15_MEMORY_OPTIONS=options)
    done = subprocess.run(["valgrind", f"--tool={tool}", f"--{tool}-out-file={out}"]
                          + (["--cache-sim=no"] if tool == "cachegrind" else []) + [exe] + args,
                          cwd=scratch, env=env, capture_output=True, text=True)
    refs = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    assert done.returncode == 0 and refs, f"{exe} under {tool} failed:\n{done.stderr[-2000:]}"
    return int(refs.group(1).replace(",", ""))


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in SUITES:
        sys.exit(__doc__)
    program, args = SUITES[sys.argv[1]]
    exe = os.path.join(REPO, program)
    with tempfile.TemporaryDirectory() as scratch:
        def profile(name):
            return os.path.join(scratch, name)
        log = f"log_path={profile('report')}"

        def total(variant, options, out="/dev/null"):
            return valgrind("cachegrind", f"{exe}-{variant}-layout0", args, options, out, scratch)
        totals = {
            "plain": total("plain", "", profile("plain")),
            "default": total("k15", log),
            "report=0": total("k15", "report=0"),
            "stack_depth=0": total("k15", f"{log}:stack_depth=0"),
            "LeakSanitizer": total("lsan", ""),
        }
        summary = open(profile("report")).read()
        allocations = int(re.search(r"(\d+) allocations in total", summary).group(1))
        valgrind("callgrind", f"{exe}-k15-layout0", args, "report=0", profile("tracked"), scratch)
        tracked = self_costs(profile("tracked"), "callgrind_annotate")
        plain = self_costs(profile("plain"), "cg_annotate")

    base = totals["plain"]
    print(f"{sys.argv[1]}: instructions (cachegrind), {allocations:,} allocations")
    for name, instructions in totals.items():
        print(f"  {name:<15} {instructions / 1e6:10.1f} M {instructions / base:7.3f}x "
              f"{(instructions - base) / allocations:7.0f}/alloc over plain")
    rows = [(p, tracked[p]) for p in PARTS] + [
        ("report at exit", totals["default"] - totals["report=0"] + tracked["report at exit"]),
        ("glibc allocator", tracked["glibc allocator"] - plain["glibc allocator"]),
        ("program, libc", tracked["program, libc"] - plain["program, libc"]),
    ]
    # What callgrind and cachegrind count differently (a few million: not the tracker's).
    rows.append(("unattributed", totals["default"] - base - sum(v for _, v in rows)))
    overhead = totals["default"] - base
    print("the default's overhead by part (callgrind of report=0; the report from the totals):")
    for name, value in rows:
        print(f"  {name:<24} {value / 1e6:8.1f} M {value / allocations:6.0f}/alloc "
              f"{100 * value / overhead:5.0f}%")
    print(f"  {'overhead':<24} {overhead / 1e6:8.1f} M {overhead / allocations:6.0f}/alloc")


if __name__ == "__main__":
    main()
