#!/usr/bin/python3
"""Times `fastllm-opt compile` per phase and reports its peak memory.

Models (generated once, cached in --cache, never in the repository):
  gpt2   GPT-2 124M dimensions in test/EndToEnd/user_models.py's GPTStyleLM
         (default init, tied head, mask buffer), exported with
         torch.onnx.export's defaults into one .onnx; batch 4, seq 1024.
  0.94b  the same file's LlamaStyleLM (RMSNorm, rotary attention, SwiGLU
         with the FFN width rule of Llama-family code: 4d * 2/3 rounded up
         to 256), d 2048, 16 layers, 16 heads, vocab 32000, tied head;
         PyTorch writes it with external data (one file per tensor, as it
         does past 2 GB); batch 2, seq 1024.
  7b     Llama-2-7B dimensions (d 4096, 32 layers, 32 heads, FFN 11008,
         vocab 32000, untied head, fp32: 27 GB of external data), built by
         bench/llama_onnx_gen.py (only with --models 7b; needs 27 GB of disk).
  sweep  the 0.94b architecture at --sweep-width, 4 -> 32 layers (with
         --sweep), to show how time and memory grow with depth.

Each case runs `compile --time-phases` in a fresh process for --emit mlir,
source and binary; the table gives each phase's wall time (import, passes,
plan = plan.mlir + plan.json, source = the generated C++, weights =
weights.safetensors, build = the C++ compilers and linker; with --emit binary
the weights are written while the C++ builds, so those two overlap and the
total is less than the sum), the total, and
the peak RSS of the compiler process (getrusage RUSAGE_CHILDREN through a
throwaway intermediate process), best of --runs. A fastllm-opt without
--time-phases (an older build) gets the total only. It prints figures and
never passes or fails on time.

Usage: bench/compile_bench.py [--tool build/bin/fastllm-opt] [--cache DIR]
       [--models gpt2,0.94b[,7b]] [--emits mlir,source,binary] [--runs N]
       [--sweep] [--sweep-width 1024] [--onnx LABEL:PATH:BATCH:SEQ ...]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ["import", "passes", "plan", "source", "weights", "build"]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "bin", "fastllm-opt"))
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "fastllm-compile-bench"),
                    help="folder for the generated models (default: %(default)s)")
    ap.add_argument("--models", default="gpt2,0.94b",
                    help="comma-separated: gpt2, 0.94b, 7b (default: %(default)s)")
    ap.add_argument("--emits", default="mlir,source,binary")
    ap.add_argument("--runs", type=int, default=3, help="best of N (default: %(default)s)")
    ap.add_argument("--sweep", action="store_true", help="also the 4 -> 32 layer sweep")
    ap.add_argument("--sweep-width", type=int, default=1024)
    ap.add_argument("--sweep-layers", default="4,8,16,32")
    ap.add_argument("--onnx", action="append", default=[], metavar="LABEL:PATH:BATCH:SEQ",
                    help="also a model of your own (repeatable)")
    ap.add_argument("--keep-output", action="store_true",
                    help="keep the last compile's output folder in the cache")
    return ap.parse_args()


def load_user_models():
    """test/EndToEnd/user_models.py: the test models (GPT-, Llama-style...)."""
    sys.path.insert(0, os.path.join(ROOT, "test", "EndToEnd"))
    import user_models
    return user_models


def swiglu_width(dim, multiple=256):
    """The SwiGLU width Llama-family models use for `dim`: two thirds of 4d,
    rounded up to a multiple of `multiple`."""
    hidden = (8 * dim) // 3
    return multiple * ((hidden + multiple - 1) // multiple)


def llama_model(models, dim, layers, heads, vocab, seq, hidden=None):
    """LlamaStyleLM without grouping (as many key/value heads as query heads),
    with swiglu_width(dim) unless `hidden` says otherwise."""
    import torch
    torch.manual_seed(0)
    return models.LlamaStyleLM(vocab=vocab, context=seq, depth=layers, heads=heads,
                               kv_heads=heads, width=dim,
                               ffn_width=hidden or swiglu_width(dim))


def export(model, batch, seq, path):
    """torch.onnx.export with its defaults (eval mode, constant folding; external
    data past 2 GB), into `path`'s own folder, atomically."""
    import torch
    folder = os.path.dirname(path)
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    x = torch.zeros(batch, seq, dtype=torch.long)
    with torch.no_grad():
        torch.onnx.export(model, (x, x), os.path.join(tmp, os.path.basename(path)),
                          input_names=["idx", "targets"], output_names=["loss"])
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def ensure_model(args, name, layers=None):
    """Generates model `name` into the cache once; returns (path, batch, seq)."""
    if name == "gpt2":
        path, batch, seq = os.path.join(args.cache, "gpt2-124m", "model.onnx"), 4, 1024
    elif name == "0.94b":
        path, batch, seq = os.path.join(args.cache, "llama-0.94b", "model.onnx"), 2, 1024
    elif name == "7b":
        path, batch, seq = os.path.join(args.cache, "llama-7b", "model.onnx"), 1, 1024
    else:  # sweep
        path = os.path.join(args.cache, f"sweep-d{args.sweep_width}-l{layers}", "model.onnx")
        batch, seq = 2, 1024
    if os.path.exists(path):
        return path, batch, seq
    print(f"generating {name}{'' if layers is None else f' ({layers} layers)'} "
          f"into {os.path.dirname(path)} (once)...", flush=True)
    if name == "7b":
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "llama_onnx_gen.py"),
                        "--out", path, "--dim", "4096", "--layers", "32", "--heads", "32",
                        "--ffn", "11008", "--vocab", "32000", "--batch", str(batch),
                        "--seq", str(seq), "--check"], check=True)
        return path, batch, seq
    models = load_user_models()
    import torch
    if name == "gpt2":
        torch.manual_seed(0)
        model = models.GPTStyleLM(vocab=50257, context=1024, depth=12, heads=12, width=768)
    elif name == "0.94b":
        model = llama_model(models, 2048, 16, 16, 32000, seq)
    else:
        model = llama_model(models, args.sweep_width, layers, max(1, args.sweep_width // 128),
                            32000, seq)
    model.eval()
    export(model, batch, seq, path)
    return path, batch, seq


def folder_bytes(path):
    """The model's bytes: the .onnx and every file beside it."""
    folder = os.path.dirname(path)
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def largest_tensor_bytes(path):
    import onnx
    model = onnx.load(path, load_external_data=False)
    largest = 0
    for t in model.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        largest = max(largest, n * 4)
    return largest


def run_once(args, model, batch, seq, emit, out):
    """One compile in a fresh process: (phase seconds, total seconds, peak RSS)."""
    code = ("import resource,subprocess,sys,time;t=time.perf_counter();"
            "p=subprocess.run(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=subprocess.PIPE,"
            "text=True);w=time.perf_counter()-t;sys.stdout.write(p.stderr);"
            "print('RESULT',p.returncode,w,"
            "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss*1024)")
    cmd = [args.tool, "compile", model, "-o", out, "--batch-size", str(batch),
           "--seq-len", str(seq), "--emit", emit]
    if args.time_phases:
        cmd.append("--time-phases")
    text = subprocess.run([sys.executable, "-c", code] + cmd, check=True,
                          capture_output=True, text=True).stdout
    result = text.strip().splitlines()[-1].split()
    if result[1] != "0":
        errors = [l for l in text.splitlines() if "error" in l]
        print(f"compile failed ({' '.join(cmd)}): {errors[:3]}", file=sys.stderr)
        return None
    phases = {m.group(1): float(m.group(2))
              for m in re.finditer(r"^phase (\w+)\s+([0-9.]+) s", text, re.M)}
    return phases, float(result[2]), int(result[3])


def measure(args, label, model, batch, seq, rows):
    size = folder_bytes(model)
    largest = largest_tensor_bytes(model)
    out = os.path.join(args.cache, "out")
    for emit in args.emits.split(","):
        results = []
        for _ in range(args.runs):
            shutil.rmtree(out, ignore_errors=True)
            r = run_once(args, model, batch, seq, emit, out)
            if r is None:
                break
            results.append(r)
        if not results:
            rows.append((label, emit + " (failed)", {}, 0.0, 0, size, largest))
            print_row(rows[-1], flush=True)
            continue
        # The fastest run's phases; the largest peak of all runs.
        phases, total, _ = min(results, key=lambda r: r[1])
        peak = max(r[2] for r in results)
        rows.append((label, emit, phases, total, peak, size, largest))
        print_row(rows[-1], flush=True)
    if not args.keep_output:
        shutil.rmtree(out, ignore_errors=True)


HEADER = ("| model | weights | largest tensor | emit | " + " | ".join(PHASES) +
          " | total | peak RSS | RSS / weights |")


def print_row(row, flush=False):
    label, emit, phases, total, peak, size, largest = row
    cells = [label, f"{size / 1e9:.2f} GB", f"{largest / 1e6:.0f} MB", emit]
    cells += [f"{phases[p]:.2f}" if p in phases else "-" for p in PHASES]
    cells += [f"{total:.2f} s", f"{peak / 1e9:.2f} GB", f"{peak / size:.2f}x"]
    print("| " + " | ".join(cells) + " |", flush=flush)


def main():
    args = parse_args()
    os.makedirs(args.cache, exist_ok=True)
    if os.path.commonpath([os.path.realpath(args.cache), ROOT]) == ROOT:
        sys.exit("--cache must be outside the repository")
    help_text = subprocess.run([args.tool, "compile", "--help"], capture_output=True,
                               text=True).stdout
    args.time_phases = "--time-phases" in help_text
    load = os.getloadavg()
    print(f"tool: {args.tool}; {os.cpu_count()} cores, load {load[0]:.2f}; "
          f"best of {args.runs} (wall seconds per phase; peak RSS of the compile)")
    cases = [(m, ensure_model(args, m)) for m in args.models.split(",") if m]
    for spec in args.onnx:
        label, path, batch, seq = spec.rsplit(":", 3)
        cases.append((label, (path, int(batch), int(seq))))
    if args.sweep:
        for layers in args.sweep_layers.split(","):
            cases.append((f"d{args.sweep_width} x {layers} layers",
                          ensure_model(args, "sweep", int(layers))))
    print(HEADER)
    print("|" + " --- |" * (HEADER.count("|") - 1))
    rows = []
    for label, (model, batch, seq) in cases:
        measure(args, label, model, batch, seq, rows)
    print("\nsummary (markdown):")
    print(HEADER)
    print("|" + " --- |" * (HEADER.count("|") - 1))
    for row in rows:
        print_row(row)


if __name__ == "__main__":
    main()
