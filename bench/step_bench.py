#!/usr/bin/python3
"""Training step time of a compiled GPT-2-style model against PyTorch eager.

Model (issue 3): GPT-2 style, d 256, 4 layers, 4 heads, seq 256, batch 8,
vocab --vocab (default 50257, GPT-2's), random weights. Both sides run a full
training step (forward, backward, AdamW) on the same machine with the same
number of threads (--threads, default: all cores), one after the other in
this run. Reported: median step time over --steps steps after --warmup
steps, and the ratio PyTorch / fastllm (> 1 means fastllm is faster). This
prints figures; it never passes or fails on time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# Debian's OpenBLAS 0.3.21 does not recognise recent x86 cores and falls back
# to its SSE3 ("Prescott") kernels, about 5x slower. PyTorch here does its
# GEMMs through that OpenBLAS; name the right core so the comparison is
# against PyTorch at its best (fastllm's kernels make the same choice).
if "OPENBLAS_CORETYPE" not in os.environ:
    flags = open("/proc/cpuinfo").read()
    os.environ["OPENBLAS_CORETYPE"] = "SkylakeX" if "avx512f" in flags else "Haswell"

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "models"))
import export_models  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--tool", default=os.path.join(ROOT, "build", "bin", "fastllm-opt"))
ap.add_argument("--vocab", type=int, default=50257)
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--warmup", type=int, default=3)
args = ap.parse_args()

B, T = 8, 256
work = tempfile.mkdtemp(prefix="step-bench-")
onnx_path = os.path.join(work, "gpt2.onnx")
argv = ["--model", "gpt2", "--out", onnx_path, "--fold", "on", "--layers", "4",
        "--d-model", "256", "--heads", "4", "--vocab", str(args.vocab), "--seq", str(T)]
cfg = export_models.parse_args(argv)
export_models.main(argv)
rng = np.random.default_rng(0)
data = rng.integers(0, args.vocab, 1 << 20).astype(np.uint16 if args.vocab < 65536 else np.uint32)
data_path = os.path.join(work, "tokens.bin")
data.tofile(data_path)
hp = ["--lr", "1e-4", "--sampler", "sequential"]

# fastllm: compile, then time its own steps (step_ms in the metrics).
subprocess.run([args.tool, "compile", onnx_path, "-o", os.path.join(work, "run"),
                "--batch-size", str(B), "--seq-len", str(T)], check=True)
metrics = os.path.join(work, "metrics.jsonl")
env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
subprocess.run([os.path.join(work, "run", "train"), "--data", data_path,
                "--data-dtype", "u16" if args.vocab < 65536 else "u32",
                "--steps", str(args.warmup + args.steps), "--metrics", metrics, "--overwrite"] + hp,
               check=True, env=env, stdout=subprocess.DEVNULL)
ours = [json.loads(l)["step_ms"] for l in open(metrics)][args.warmup:]
arena = json.loads(open(metrics).readline())["mem_bytes"]

# PyTorch eager: the same model, the same batch shape, AdamW.
torch.set_num_threads(args.threads)
model = export_models.build_model(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.tensor(data[:B * T].astype(np.int64)).view(B, T)
y = torch.tensor(data[1:B * T + 1].astype(np.int64)).view(B, T)
theirs = []
for i in range(args.warmup + args.steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    model(x, y).backward()
    opt.step()
    if i >= args.warmup:
        theirs.append((time.perf_counter() - t0) * 1e3)

a, b = statistics.median(ours), statistics.median(theirs)
print(f"GPT-2 style d256 x 4 layers, 4 heads, seq {T}, batch {B}, vocab {args.vocab}, "
      f"{args.threads} threads, median of {args.steps} steps after {args.warmup}, "
      f"OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']}")
print(f"  fastllm (CPU, fp32): {a:8.1f} ms/step  ({B * T / a * 1e3:8.0f} tok/s, arena {arena / 2**20:.0f} MiB)")
print(f"  PyTorch eager      : {b:8.1f} ms/step  ({B * T / b * 1e3:8.0f} tok/s)")
print(f"  ratio PyTorch/fastllm: {b / a:.2f} (target >= 1.0, goal 1.5)")
