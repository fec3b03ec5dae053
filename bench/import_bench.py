#!/usr/bin/python3
"""Times `fastllm-opt import` on a GPT-2 124M-size export and reports its peak memory.

The model (12 layers, d 768, 12 heads, vocab 50257, seq 1024, random weights,
constant folding on) is exported once with test/models/export_models.py and
cached. Each run is a fresh process; seconds are wall-clock, memory is the
child's peak RSS (getrusage). Targets (issue 2): under 3 s, and a peak under
1.5x the model file's size. This prints figures; it never passes or fails on
time.

Usage: bench/import_bench.py [--tool build/bin/fastllm-opt] [--cache DIR] [--runs N]
"""
import argparse
import os
import resource
import subprocess
import sys
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--tool", default=os.path.join(root, "build", "bin", "fastllm-opt"))
ap.add_argument("--cache", default=os.path.join(root, "build", "bench"))
ap.add_argument("--runs", type=int, default=3)
args = ap.parse_args()

os.makedirs(args.cache, exist_ok=True)
model = os.path.join(args.cache, "gpt2-124m.onnx")
if not os.path.exists(model):
    print("exporting GPT-2 124M (once; about a minute)...", flush=True)
    subprocess.run([sys.executable, os.path.join(root, "test", "models", "export_models.py"),
                    "--model", "gpt2", "--out", model + ".tmp", "--fold", "on",
                    "--layers", "12", "--d-model", "768", "--heads", "12",
                    "--vocab", "50257", "--seq", "1024"], check=True,
                   stdout=subprocess.DEVNULL)
    os.replace(model + ".tmp", model)
size = os.path.getsize(model)


def run(extra):
    """One import in a fresh process: (seconds, peak RSS bytes)."""
    # RUSAGE_CHILDREN's maxrss is the largest child so far, so each
    # measurement runs through a throwaway intermediate process.
    code = ("import resource,subprocess,sys,time;t=time.perf_counter();"
            "subprocess.run(sys.argv[1:],check=True,stdout=subprocess.DEVNULL);"
            "print(time.perf_counter()-t,"
            "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss*1024)")
    out = subprocess.run([sys.executable, "-c", code, args.tool, "import", model,
                          "--bind-dim", "batch=4", "--bind-dim", "seq=1024"] + extra,
                         check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), int(out[1])


print(f"model: {model} ({size / 1e6:.1f} MB), {os.cpu_count()} cores")
for label, extra in (("import (parse + build + verify IR)", ["--no-ir"]),
                     ("import + write bytecode", ["--emit-bytecode", "-o", os.devnull])):
    results = [run(extra) for _ in range(args.runs)]
    secs = sorted(r[0] for r in results)
    peak = max(r[1] for r in results)
    print(f"{label}: {secs[len(secs) // 2]:.2f} s median (min {secs[0]:.2f}, "
          f"{args.runs} runs); peak RSS {peak / 1e6:.0f} MB = {peak / size:.2f}x file "
          f"(targets: < 3 s, < 1.5x)")
