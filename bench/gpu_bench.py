#!/usr/bin/python3
"""GPT-2 124M training throughput on one GPU: fastllm-opt vs PyTorch.

Exports GPT-2 124M (12 layers, d 768, 12 heads, seq 1024, vocab padded to
50304) with test/models/export_models.py, compiles it with
`fastllm-opt compile --target cuda` and trains --steps steps on a token file;
then trains the same PyTorch model on the same GPU in this process, eager and
with torch.compile (when this python has PyTorch with CUDA), and prints one
line per run:

    tokens/s   median over the steps after --warmup
    MFU        tokens/s * (6 N + 12 L d T) / 989e12, for N parameters, L
               layers, width d, sequence T (the PaLM estimate: 6N per token
               for the dense weights, 12 L d T for attention's two batched
               matmuls forward and backward), against the H100 SXM's dense
               BF16 peak of 989 TFLOP/s
    determinism  the fastllm binary runs twice on the same data: whether
               its losses repeat bit for bit (the metrics' %.9g values)
    memory     fastllm: the arena the plan sized (metrics mem_bytes, measured
               as the drop in free GPU memory); PyTorch:
               torch.cuda.max_memory_allocated

    /usr/bin/python3 bench/gpu_bench.py [--precision bf16] [--batch 8] [--steps 30]

It needs a GPU (nvidia-smi must list one) and says so otherwise. With
--precision bf16 (the default) fastllm-opt compiles with --precision bf16 and
PyTorch runs under torch.autocast(bfloat16); with fp32 both run in fp32.

Where the GPU machine cannot run fastllm-opt (no LLVM there), split it:
`--prepare DIR` (here: export and compile into DIR, without the 500 MB of
weights) and `--from DIR` (there: random weights from DIR's plan.json,
bench/random_weights.py, then the runs). scripts/gpu_bundle.sh does both
halves' packing.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "test", "models"))
import export_models  # noqa: E402

PEAK_FLOPS = 989e12
LAYERS, D, HEADS, SEQ, VOCAB = 12, 768, 12, 1024, 50304


def flops_per_token(n_params):
    return 6 * n_params + 12 * LAYERS * D * SEQ


def report(name, tokens_per_s, n_params, mem_bytes):
    mfu = tokens_per_s * flops_per_token(n_params) / PEAK_FLOPS
    print(f"{name:28s} {tokens_per_s:12.0f} tok/s   MFU {100 * mfu:5.1f} %   "
          f"memory {mem_bytes / 2**30:6.2f} GiB", flush=True)


def torch_run(cfg, batch, steps, warmup, compiled, bf16):
    import torch
    torch.manual_seed(0)
    model = export_models.build_model(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95),
                            weight_decay=0.1)
    step_fn = torch.compile(model) if compiled else model
    x = torch.randint(0, VOCAB, (batch, SEQ), device="cuda")
    y = torch.randint(0, VOCAB, (batch, SEQ), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for s in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = step_fn(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if s >= warmup:
            times.append(time.perf_counter() - start)
    n_params = sum(p.numel() for p in model.parameters())
    return batch * SEQ / statistics.median(times), n_params, \
        torch.cuda.max_memory_allocated()


def compile_bench(tool, work, batch, precision):
    """Exports GPT-2 124M into `work` and compiles it into work/run; returns
    the export's argv."""
    onnx_path = os.path.join(work, "gpt2-124m.onnx")
    argv = ["--model", "gpt2", "--out", onnx_path, "--fold", "on", "--layers", str(LAYERS),
            "--d-model", str(D), "--heads", str(HEADS), "--vocab", str(VOCAB),
            "--seq", str(SEQ)]
    export_models.main(argv)
    subprocess.run([tool, "compile", onnx_path, "-o", os.path.join(work, "run"),
                    "--target", "cuda", "--precision", precision, "--batch-size",
                    str(batch), "--seq-len", str(SEQ)], check=True)
    return argv


def from_prepared(prepared):
    """What --prepare left in `prepared`, with weights made for its plan when
    missing: (export argv, batch, precision, the run folder)."""
    meta = json.load(open(os.path.join(prepared, "bench.json")))
    out = os.path.join(prepared, "run")
    weights = os.path.join(out, "weights.safetensors")
    if not os.path.exists(weights):
        sys.path.insert(0, HERE)
        import random_weights
        random_weights.write(os.path.join(out, "plan.json"), weights)
    return meta["argv"], meta["batch"], meta["precision"], out


def token_file(work):
    """4M random GPT-2 token ids (uint16) in work/tokens.u16."""
    import array
    import random
    rng = random.Random(0)
    data = os.path.join(work, "tokens.u16")
    with open(data, "wb") as f:
        array.array("H", (rng.randrange(VOCAB) for _ in range(4 * 1024 * 1024))).tofile(f)
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "bin", "fastllm-opt"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--prepare", metavar="DIR",
                      help="only export and compile into DIR (no GPU needed)")
    mode.add_argument("--from", dest="prepared", metavar="DIR",
                      help="run what --prepare left in DIR")
    args = ap.parse_args()

    if args.prepare:
        os.makedirs(args.prepare, exist_ok=True)
        argv = compile_bench(args.tool, args.prepare, args.batch, args.precision)
        # Only what a run needs: the binary and its plan (weights are made
        # where it runs).
        run = os.path.join(args.prepare, "run")
        for name in ("weights.safetensors", "train_step.o", "plan.mlir"):
            if os.path.exists(os.path.join(run, name)):
                os.remove(os.path.join(run, name))
        os.remove(os.path.join(args.prepare, "gpt2-124m.onnx"))
        json.dump({"argv": argv, "batch": args.batch, "precision": args.precision},
                  open(os.path.join(args.prepare, "bench.json"), "w"))
        print(f"gpu_bench: prepared {args.prepare} (run it with --from)")
        return

    try:
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    except OSError:
        gpus = ""
    if "GPU" not in gpus:
        print("gpu_bench: needs a GPU (nvidia-smi lists none); nothing measured")
        sys.exit(1)
    print(gpus.strip().splitlines()[0])

    work = tempfile.mkdtemp(prefix="gpu-bench-")
    if args.prepared:
        argv, args.batch, args.precision, out = from_prepared(args.prepared)
    else:
        argv = compile_bench(args.tool, work, args.batch, args.precision)
        out = os.path.join(work, "run")
    cfg = export_models.parse_args(argv)
    plan = json.load(open(os.path.join(out, "plan.json")))
    n_params = sum(math.prod(p["shape"]) for p in plan["params"])
    data = token_file(work)
    metrics = os.path.join(out, "metrics.jsonl")
    runs = []
    for _ in range(2):  # the second run checks that the losses repeat bit for bit
        subprocess.run([os.path.join(out, "train"), "--data", data, "--steps",
                        str(args.steps), "--lr", "3e-4", "--metrics", metrics,
                        "--overwrite"], check=True)
        runs.append([json.loads(line) for line in open(metrics)])
    lines = runs[0][args.warmup:]
    step_s = statistics.median(line["step_ms"] for line in lines) / 1e3
    print(f"GPT-2 124M: {n_params} parameters, batch {args.batch} x seq {SEQ}, "
          f"FLOPs per token {flops_per_token(n_params):.3e}")
    report(f"fastllm-opt ({args.precision})", args.batch * SEQ / step_s, n_params,
           lines[0]["mem_bytes"])
    losses = [[line["loss"] for line in run] for run in runs]
    differ = [i + 1 for i, (a, b) in enumerate(zip(*losses)) if a != b]
    print(f"fastllm-opt determinism: two runs, {len(losses[0])} steps: " +
          ("losses identical" if not differ and len(losses[0]) == len(losses[1])
           else f"losses differ from step {differ[0] if differ else '?'}"))

    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:
        print("PyTorch with CUDA is not available to this python: no PyTorch figures")
        return
    bf16 = args.precision == "bf16"
    precision = "bf16 autocast" if bf16 else "fp32"
    for compiled in (False, True):
        tps, n, mem = torch_run(cfg, args.batch, args.steps, args.warmup, compiled, bf16)
        report(f"PyTorch {'torch.compile' if compiled else 'eager'} ({precision})", tps, n, mem)


if __name__ == "__main__":
    main()
