#!/usr/bin/python3
"""Reads the hot CUDA kernels' PTX and resource usage, so that a change that
would slow them on a GPU shows without one.

Usage: ptx_check.py NVCC ROOT [NVCC FLAGS...]

Compiles runtime/cuda/kernels/{FlashAttention,Losses,Reduce,Norms}.cu to
PTX with the build's nvcc flags, then checks, for the bf16 instantiations
(GPT-2's hot path) of the kernels listed in RULES:

  - the instructions each must use (tensor-core mma.sync, ldmatrix, cp.async
    for the attention tiles; 16-byte global loads and stores, ld/st .v4,
    for the row and column kernels);
  - no 64-bit division or remainder (div/rem .s64/.u64) where listed: a
    per-element index computed in 64 bits;
  - and, through ptxas -v for the build's architecture, that no kernel of
    these files spills registers to local memory.

Prints one PASS/FAIL line per check and `ptx check: P passed, F failed`;
exits 1 on any failure.
"""
import os
import re
import subprocess
import sys
import tempfile

SOURCES = ["FlashAttention", "Losses", "Reduce", "Norms"]

# (source, kernel name fragment, bf16 only, required patterns, forbid 64-bit
# division). A kernel name fragment matches the mangled entry names.
MMA = [r"mma\.sync\.aligned\.m16n8k16", r"ldmatrix\.sync", r"cp\.async\.cg"]
V4_LOAD = [r"ld\.global(\.nc)?\.v4"]
V4_STORE = [r"st\.global\.v4"]
RULES = [
    ("FlashAttention", "flashForwardKernel", False, MMA, True),
    ("FlashAttention", "flashKeyValueGradKernel", False, MMA, True),
    ("FlashAttention", "flashQueryGradKernel", False, MMA, True),
    ("FlashAttention", "flashRowDotKernel", False, V4_LOAD, True),
    ("Losses", "crossEntropyRowsKernel", True, V4_LOAD, True),
    ("Losses", "crossEntropyGradKernel", True, V4_LOAD + V4_STORE, True),
    ("Reduce", "reduceColumnsKernel", True, V4_LOAD, False),
    ("Norms", "normWarpKernel", True, V4_LOAD + V4_STORE, True),
    ("Norms", "normGradRowsWarpKernel", True, V4_LOAD + V4_STORE, True),
]
DIV64 = r"\b(div|rem)\.(s|u)64\b"


def entries(ptx):
    """{mangled entry name: its body} of a PTX file."""
    found = {}
    for part in re.split(r"\n(?=(?:\.visible |\.weak )?\.entry )", ptx)[1:]:
        name = re.search(r"\.entry (\S+)\(", part).group(1)
        found[name] = part
    return found


def main():
    nvcc, root, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    ptxas = os.path.join(os.path.dirname(nvcc), "ptxas")
    arch = next((f.split("=", 1)[1] for f in flags if f.startswith("-arch=")), "sm_90")
    results = []

    def check(ok, what):
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'} {what}", flush=True)

    with tempfile.TemporaryDirectory(prefix="ptx-check-") as work:
        ptx = {}
        for src in SOURCES:
            out = os.path.join(work, src + ".ptx")
            subprocess.run([nvcc, *flags, "-ptx",
                            os.path.join(root, "runtime/cuda/kernels", src + ".cu"),
                            "-o", out], check=True)
            ptx[src] = open(out).read()
            usage = subprocess.run([ptxas, f"-arch={arch}", "-v", out, "-o",
                                    os.path.join(work, src + ".cubin")],
                                   check=True, capture_output=True, text=True).stderr
            spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", usage)
            check(spills and all(s == "0" and l == "0" for s, l in spills),
                  f"{src}.cu: {len(spills)} kernels, none spills registers")
        for src, fragment, bf16, needs, noDiv in RULES:
            kernels = {n: body for n, body in entries(ptx[src]).items()
                       if fragment in n and (not bf16 or "nv_bfloat16" in n)}
            if not kernels:
                check(False, f"{fragment}: no such kernel in {src}.cu's PTX")
                continue
            for pattern in needs:
                missing = [n for n, b in kernels.items() if not re.search(pattern, b)]
                check(not missing, f"{fragment} ({len(kernels)} instantiations) uses "
                      f"{pattern}" + (f"; not in {missing[0]}" if missing else ""))
            if noDiv:
                dividing = [n for n, b in kernels.items() if re.search(DIV64, b)]
                check(not dividing, f"{fragment}: no 64-bit division or remainder" +
                      (f"; {dividing[0]} has one" if dividing else ""))
    failed = results.count(False)
    print(f"ptx check: {len(results) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
