#!/usr/bin/python3
"""Per-rank memory of a GPT-2-style model at dp 4 under ZeRO-1, 2 and 3.

Exports a GPT-2-style model (default: GPT-2 124M, 12 layers, d 768, 12
heads, vocab 50257), compiles it with `--dp 4 --zero-stage Z` for Z = 1, 2, 3
and prints the plan's per-rank memory next to the ZeRO arithmetic of docs/DESIGN.md
section 3, for Psi padded parameter elements, dp ranks, G and W the elements
of the gradient and weight slots (fp32 = 4 bytes):

    ZeRO-1  weights 4 Psi   + grads 4 Psi + shards 16 Psi / dp
    ZeRO-2  weights 4 Psi   + grads 4 G   + shards 16 Psi / dp
    ZeRO-3  weights 4 W     + grads 4 G   + shards 16 Psi / dp

(shards: fp32 master weights, AdamW m and v, reduced gradients), plus the
tokens and the liveness-shared activations. With --run-steps N it also trains
N steps with `mpirun -np 4` and prints the arena each rank allocated (metrics
mem_bytes) next to the plan's.

    /usr/bin/python3 bench/zero_memory.py [--small] [--seq 256] [--run-steps 1]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "test", "models"))
import export_models  # noqa: E402

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader"]
DP = 4


def mib(b):
    return f"{b / 1048576:9.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "bin", "fastllm-opt"))
    ap.add_argument("--small", action="store_true",
                    help="4 layers, d 256 (the step benchmark's model) instead of 124M")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1, help="micro-batch per rank")
    ap.add_argument("--run-steps", type=int, default=0)
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="zero-memory-")
    onnx_path = os.path.join(work, "gpt2.onnx")
    layers, d, heads = (4, 256, 4) if args.small else (12, 768, 12)
    export_models.main(["--model", "gpt2", "--out", onnx_path, "--fold", "on",
                        "--layers", str(layers), "--d-model", str(d), "--heads", str(heads),
                        "--vocab", "50257", "--seq", str(args.seq)])
    print(f"GPT-2 style: {layers} layers, d {d}, vocab 50257, seq {args.seq}, "
          f"micro-batch {args.batch}, dp {DP}, layers-per-stage 1\n")
    rows = []
    for zero in (1, 2, 3):
        out = os.path.join(work, f"zero{zero}")
        subprocess.run([args.tool, "compile", onnx_path, "-o", out, "--batch-size",
                        str(args.batch), "--seq-len", str(args.seq), "--dp", str(DP),
                        "--zero-stage", str(zero),
                        "--emit", "binary" if args.run_steps else "mlir"],
                       check=True, capture_output=True)
        plan = json.load(open(os.path.join(out, "plan.json")))
        m = plan["memory_per_rank"]
        psi = plan["plan"]["param_elements"]
        g = sum(s["elements"] for s in plan["grad_slots"])
        w = sum(s["elements"] for s in plan["weight_slots"])
        want = {1: (4 * psi, 4 * psi), 2: (4 * psi, 4 * g), 3: (4 * w, 4 * g)}[zero]
        shards = m["master_weights_shard_bytes"] + m["optimizer_shard_bytes"] + \
            m["gradient_shard_bytes"]
        ok = (m["weight_buffers_bytes"], m["gradient_buffers_bytes"]) == want and \
            shards == 16 * psi // DP
        measured = None
        if args.run_steps:
            data = os.path.join(work, "tokens.u16")
            if not os.path.exists(data):
                import array
                text = open("/usr/share/common-licenses/GPL-3", "rb").read()
                array.array("H", list(text)).tofile(open(data, "wb"))
            metrics = os.path.join(out, "metrics.jsonl")
            subprocess.run(MPIRUN + ["-np", str(DP), os.path.join(out, "train"), "--data", data,
                                     "--steps", str(args.run_steps), "--lr", "1e-4",
                                     "--metrics", metrics, "--overwrite"],
                           check=True, capture_output=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
            measured = json.loads(open(metrics).readline())["mem_bytes"]
        rows.append((zero, m, shards, ok, measured, psi, g, w))

    print("ZeRO  weights MiB  grads MiB  shards MiB  activations MiB  total MiB  "
          "arithmetic  measured arena")
    for zero, m, shards, ok, measured, psi, g, w in rows:
        meas = "-" if measured is None else \
            f"{mib(measured)} MiB ({'=' if measured == m['total_bytes'] else '!='} plan)"
        print(f"  {zero}   {mib(m['weight_buffers_bytes'])}  {mib(m['gradient_buffers_bytes'])}"
              f"  {mib(shards)}   {mib(m['activations_bytes'])}       {mib(m['total_bytes'])}"
              f"  {'holds' if ok else 'DIFFERS'}       {meas}")
    zero1, zero2, zero3 = (r[1]["total_bytes"] for r in rows)
    print(f"\nPsi = {rows[0][5]} elements; gradient slots G = {rows[1][6]} (ZeRO-2), "
          f"weight slots W = {rows[2][7]} (ZeRO-3, incl. the tie slot of the embedding "
          f"stage the head reads)")
    print(f"per-rank total falls ZeRO-1 -> 2 -> 3: {zero1 > zero2 > zero3} "
          f"({mib(zero1).strip()} -> {mib(zero2).strip()} -> {mib(zero3).strip()} MiB)")


if __name__ == "__main__":
    main()
