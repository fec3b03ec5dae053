#!/usr/bin/python3
"""Planned activation memory of nanoGPT-style models with registered mask
buffers, with and without causal-attention fusion.

The model is nanoGPT's GPT (4 layers, d 128, 4 heads, block 1024, vocab 512,
no dropout, tied head) with its attention mask as third-party code writes
it: `buffer`, nanoGPT's `register_buffer("bias", tril(ones).view(1, 1, B, B))`
read as `masked_fill(bias[:, :, :T, :T] == 0, -inf)`; `additive`, Llama's
`register_buffer("mask", full((B, B), -inf).triu(1))` read as
`scores + mask[:T, :T]`. Each is exported with torch.onnx.export's defaults
(eval, constant folding), in training mode with folding, and both with
dynamic batch and sequence axes bound at compile; then compiled (`--emit
mlir`) twice from the same import:

    frozen   as imported: the mask buffers frozen, fastllm-fuse reads them
             and writes model.causal_attention (no T x T tensor);
    train    the same with the buffers made trainable (their `frozen` marks
             dropped), so that no fusion reads them: softmax(mask(q k^T)) v
             op by op, as before masks were read at compile time (the
             mask's own gradient adds no activation peak).

Prints, per export and for both, the layers whose attention fused and
plan.json's activations_bytes (peak, liveness-shared). A static export
folds nanoGPT's `bias[:, :, :T, :T] == 0` into a bool constant, which fuses
either way.

    /usr/bin/python3 bench/mask_fusion_memory.py [--batch 8] [--seq 256]
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VOCAB, BLOCK, LAYERS, HEADS, EMBD = 512, 1024, 4, 4, 128


class CausalSelfAttention(nn.Module):
    def __init__(self, additive):
        super().__init__()
        self.c_attn = nn.Linear(EMBD, 3 * EMBD)
        self.c_proj = nn.Linear(EMBD, EMBD)
        self.additive = additive
        if additive:
            self.register_buffer("mask", torch.full((BLOCK, BLOCK), float("-inf")).triu(1))
        else:
            self.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK))
                                 .view(1, 1, BLOCK, BLOCK))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(EMBD, dim=2)
        k = k.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        q = q.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        v = v.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.additive:
            att = att + self.mask[:T, :T]
        else:
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, additive):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(EMBD), nn.LayerNorm(EMBD)
        self.attn = CausalSelfAttention(additive)
        self.c_fc, self.c_proj = nn.Linear(EMBD, 4 * EMBD), nn.Linear(4 * EMBD, EMBD)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, additive):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, EMBD), nn.Embedding(BLOCK, EMBD)
        self.h = nn.ModuleList([Block(additive) for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(EMBD)
        self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


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
        torch.onnx.export(GPT(additive), (x, x), path, input_names=["idx", "targets"],
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
    print(f"nanoGPT-style: {LAYERS} layers, d {EMBD}, {HEADS} heads, block {BLOCK}, "
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
