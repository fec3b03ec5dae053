#!/usr/bin/python3
"""Planned activation memory of GPT-style models with registered mask
buffers, with and without causal-attention fusion.

The model is test/EndToEnd/user_models.py's GPTStyleLM (4 layers, d 128,
4 heads, context 1024, vocab 512, dropout 0.0, tied head) with its causal
mask in one of the two buffer forms common in model code: `buffer`, a float
buffer of ones `tril(ones).reshape(1, 1, C, C)` read as
`masked_fill(keep[:, :, :T, :T] == 0, -inf)`; `additive`, a buffer
`full((C, C), -inf).triu(1)` read as `scores + mask[:T, :T]`. Each is
exported with torch.onnx.export's defaults (eval, constant folding), in
training mode with folding, and both with dynamic batch and sequence axes
bound at compile; then compiled (`--emit mlir`) twice from the same import:

    frozen   as imported: the mask buffers frozen, fastllm-fuse reads them
             and writes model.causal_attention (no T x T tensor);
    train    the same with the buffers made trainable (their `frozen` marks
             dropped), so that no fusion reads them: softmax(mask(q k^T)) v
             op by op, as before masks were read at compile time (the
             mask's own gradient adds no activation peak).

Prints, per export and for both, the layers whose attention fused and
plan.json's activations_bytes (peak, liveness-shared). A static export
folds the `keep[:, :, :T, :T] == 0` comparison into a bool constant, which
fuses either way.

    /usr/bin/python3 bench/mask_fusion_memory.py [--batch 8] [--seq 256]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "test", "EndToEnd"))
import user_models  # noqa: E402  (the test models, shared with user_exports.py)

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH = 512, 1024, 4, 4, 128


def make_model(additive):
    return user_models.GPTStyleLM(vocab=VOCAB, context=CONTEXT, depth=LAYERS, heads=HEADS,
                                  width=WIDTH, p_drop=0.0,
                                  mask="additive" if additive else "keep")


def export(path, additive, training, dynamic, batch, seq):
    torch.manual_seed(0)
    x = torch.zeros(batch, seq, dtype=torch.long)
    kwargs = {}
    if training:
        kwargs.update(training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=True)
    if dynamic:
        axes = {0: "batch", 1: "seq"}
        kwargs["dynamic_axes"] = {"idx": axes, "targets": axes}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(make_model(additive), (x, x), path, input_names=["idx", "targets"],
                          output_names=["loss"], **kwargs)


def compile_plan(tool, mlir, out, batch, seq):
    subprocess.run([tool, "compile", mlir, "-o", out, "--batch-size", str(batch),
                    "--seq-len", str(seq), "--emit", "mlir"], check=True,
                   capture_output=True, text=True)
    plan = json.load(open(os.path.join(out, "plan.json")))["memory_per_rank"]
    fused = open(os.path.join(out, "plan.mlir")).read().count("model.causal_attention_grad ")
    return fused, plan["activations_bytes"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "bin", "fastllm-opt"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="mask-fusion-memory-")
    print(f"GPT-style: {LAYERS} layers, d {WIDTH}, {HEADS} heads, context {CONTEXT}, "
          f"batch {args.batch}, seq {args.seq}; activations (peak, MiB)")
    print(f"{'mask':9} {'export':14} {'layers fused':>14} {'activations':>22}")
    print(f"{'':9} {'':14} {'frozen':>7}{'train':>7} {'frozen':>11}{'train':>11}")
    for additive in (False, True):
        for training in (False, True):
            for dynamic in (False, True):
                label = ("training" if training else "default") + ("+dyn" if dynamic else "")
                base = os.path.join(work, ("additive" if additive else "buffer") + "-" +
                                    label.replace("+", "-"))
                export(base + ".onnx", additive, training, dynamic, args.batch, args.seq)
                bind = (["--bind-dim", f"batch={args.batch}", "--bind-dim", f"seq={args.seq}"]
                        if dynamic else [])
                subprocess.run([args.tool, "import", base + ".onnx", "-o", base + ".mlir"] + bind,
                               check=True, capture_output=True)
                text = open(base + ".mlir").read()
                open(base + ".unfrozen.mlir", "w").write(
                    re.sub(r'frozen, model\.constant_reason = "[^"]*"(, )?', "", text)
                    .replace(" {}", ""))
                fused, act = compile_plan(args.tool, base + ".mlir", base + "-fused",
                                          args.batch, args.seq)
                fused_unfrozen, act_unfrozen = compile_plan(
                    args.tool, base + ".unfrozen.mlir", base + "-unfrozen", args.batch, args.seq)
                print(f"{'additive' if additive else 'buffer':9} {label:14} {fused:7}"
                      f"{fused_unfrozen:7} {act / 2**20:11.2f}{act_unfrozen / 2**20:11.2f}")
    print(f"(work folder {work})")


if __name__ == "__main__":
    sys.exit(main())
