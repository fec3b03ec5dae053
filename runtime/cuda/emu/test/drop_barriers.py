#!/usr/bin/python3
"""Proves that the emulation's schedules catch a missing barrier.

Usage: drop_barriers.py KERNEL_TESTS DEVICE_TESTS

For every `__syncthreads()` in the kernel library (runtime/cuda/Kernels.cuh
and the sources and headers of runtime/cuda/kernels/, run with the emulated
kernel tests) and in runtime/cuda/Device.cu (the device tests), the tests
run with that one barrier compiled out (FASTLLM_CUDA_EMU_DROP_BARRIER=
FILE:LINE, FILE the source's base name, which must therefore name one file),
under each schedule (inorder, adversarial). A barrier is caught when some
test then fails (a wrong result, or the emulator's report of a broken
barrier or warp operation).

Every barrier must be caught by at least one schedule, except the few that
the tests' shapes never need, listed in NOT_EXERCISED with the reason (keyed
by file, kernel and the barrier's rank in the kernel, so that edits
elsewhere do not move them). The tests must pass with no barrier dropped,
under both schedules. Prints one line per barrier (which schedules caught
it) and `drop barriers: P passed, F failed`.
"""
import glob
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CUDA = os.path.dirname(os.path.dirname(HERE))
SCHEDULES = ("inorder", "adversarial")

# The sources each test binary runs: the kernel library's, and the device's.
KERNEL_SOURCES = [os.path.join(CUDA, "Kernels.cuh")] + sorted(
    glob.glob(os.path.join(CUDA, "kernels", "*.cu"))
    + glob.glob(os.path.join(CUDA, "kernels", "*.cuh")))
DEVICE_SOURCES = [os.path.join(CUDA, "Device.cu")]

# (file, kernel, n-th barrier in it) -> why no test can notice it missing.
NOT_EXERCISED = {
    ("DataMovement.cu", "transposeTilesKernel", 2): "guards the tile against "
    "the next grid-stride iteration; the tests' grids have a block per tile",
    ("Reduce.cu", "reduceStridedKernel", 2): "guards `partial` against the "
    "next grid-stride iteration; the tests' grids have a block per 32 outputs",
    ("Norms.cu", "normColumnSumsKernel", 2): "guards `partial` against the "
    "next grid-stride iteration; the tests' grids have a block per 32 columns",
    ("Reduce.cu", "reduceColumnsKernel", 2): "guards `partial` against the "
    "next grid-stride iteration; the tests' grids have a block per 256 "
    "columns",
    ("Losses.cu", "rowMaxSum", 1): "guards `warps` against the block's next "
    "row (grid-stride); the tests' grids have a block per row",
}


def enclosing_function(lines, index):
    """The name of the function whose body holds lines[index]."""
    for i in range(index, -1, -1):
        line = lines[i]
        if not line or line[0] in " \t/#}" or line.startswith("template"):
            continue
        names = re.findall(r"(\w+)\(", line)
        names = [n for n in names if n != "__launch_bounds__"]
        if not names and i + 1 < len(lines):
            names = re.findall(r"(\w+)\(", lines[i + 1])
        if names:
            return names[0] if names[0] not in ("void", "T") else names[-1]
    return "?"


def barriers(path):
    """[(line number, kernel, rank in kernel)] of the __syncthreads in path."""
    lines = open(path).read().split("\n")
    found, counts = [], {}
    for i, line in enumerate(lines):
        if "__syncthreads()" in line and not line.strip().startswith("//"):
            kernel = enclosing_function(lines, i)
            counts[kernel] = counts.get(kernel, 0) + 1
            found.append((i + 1, kernel, counts[kernel]))
    return found


def fails(binary, schedule, drop=None):
    env = dict(os.environ, FASTLLM_CUDA_EMU_SCHEDULE=schedule)
    if drop:
        env["FASTLLM_CUDA_EMU_DROP_BARRIER"] = drop
    proc = subprocess.run([binary, "--gtest_fail_fast", "--gtest_brief=1"],
                          capture_output=True, text=True, env=env, timeout=600)
    return proc.returncode != 0, (proc.stdout + proc.stderr)


def main():
    kernel_tests, device_tests = sys.argv[1], sys.argv[2]
    passed = failed = 0

    def report(ok, text):
        nonlocal passed, failed
        print(f"{'PASS' if ok else 'FAIL'} {text}", flush=True)
        passed += ok
        failed += not ok

    names = [os.path.basename(p) for p in KERNEL_SOURCES + DEVICE_SOURCES]
    repeated = sorted({n for n in names if names.count(n) > 1})
    report(not repeated, "each source's base name names one file"
           + (f": {', '.join(repeated)} do not" if repeated else ""))
    listed = set()
    for what, sources, binary in (("kernel", KERNEL_SOURCES, kernel_tests),
                                  ("device", DEVICE_SOURCES, device_tests)):
        for schedule in SCHEDULES:
            bad, out = fails(binary, schedule)
            report(not bad, f"{what} tests pass with every barrier, schedule {schedule}"
                   + ("" if not bad else ":\n" + out[-1500:]))
        for path in sources:
            source = os.path.basename(path)
            for line, kernel, nth in barriers(path):
                caught = [s for s in SCHEDULES if fails(binary, s, f"{source}:{line}")[0]]
                why = NOT_EXERCISED.get((source, kernel, nth))
                listed.add((source, kernel, nth))
                where = f"{source}:{line} ({kernel}, barrier {nth})"
                if why:
                    # A listed barrier that is caught after all should leave the list.
                    report(not caught, f"{where}: not exercised ({why})"
                           + (f"; but caught by {', '.join(caught)}: unlist it" if caught else ""))
                else:
                    report(bool(caught), f"{where}: caught by "
                           + (", ".join(caught) if caught else "NO schedule"))
    # A listed barrier that no longer exists (moved, renamed) must be re-keyed.
    for key in sorted(set(NOT_EXERCISED) - listed):
        report(False, f"NOT_EXERCISED names {key}, which is no barrier: re-key it")
    print(f"drop barriers: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
