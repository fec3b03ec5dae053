#!/usr/bin/python3
"""A GPT written the usual way, for consolidate.test.

  export DIR            writes DIR/model.onnx (torch.onnx.export's defaults:
                        eval mode, constant folding on) and DIR/data.u16
  check WEIGHTS METRICS STEP
                        loads WEIGHTS with tools/fastllm_weights.py into the
                        model as exported (strict load_state_dict; the run's
                        weights.safetensors beside WEIGHTS gives the initial
                        values that place `wpe`, which constant folding
                        renamed `onnx::Add_N`), and compares the
                        model's loss on the batch `train --sampler sequential`
                        draws at step STEP + 1 with the loss METRICS reports
                        for that step (the weights are those after STEP)
  garbage WEIGHTS       checks that a file with a generated name and a file
                        with a shape the model lacks are refused by name

The model: nn.Module blocks with default init, nn.Dropout(0.1) (an eval-mode
export drops it: training runs without it and so does the check), a causal
mask buffer, and the head tied to the token embedding.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "tools"))
from fastllm_weights import WeightsError, load_state_dict  # noqa: E402

VOCAB, DIM, SEQ, MICRO, DP = 64, 32, 16, 2, 2
TOKENS = 3000


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(DIM)
        self.c_attn = nn.Linear(DIM, 3 * DIM)
        self.c_proj = nn.Linear(DIM, DIM)
        self.ln_2 = nn.LayerNorm(DIM)
        self.fc = nn.Linear(DIM, 4 * DIM)
        self.proj = nn.Linear(4 * DIM, DIM)
        self.drop = nn.Dropout(0.1)
        self.register_buffer("mask", torch.tril(torch.ones(SEQ, SEQ)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, 4, C // 4).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // 4)
        att = att.masked_fill(self.mask[:T, :T] == 0, float("-inf"))
        y = (self.drop(F.softmax(att, dim=-1)) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.drop(self.c_proj(y))
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln_2(x)))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(SEQ, DIM)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList([Block() for _ in range(2)])
        self.ln_f = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1])
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def export(folder):
    torch.manual_seed(0)
    model = GPT()
    x = torch.zeros(MICRO, SEQ, dtype=torch.long)
    torch.onnx.export(model, (x, x), os.path.join(folder, "model.onnx"),
                      input_names=["idx", "targets"], output_names=["loss"])
    rng = np.random.default_rng(0)
    rng.integers(0, VOCAB, TOKENS, dtype=np.uint16).tofile(
        os.path.join(folder, "data.u16"))


def check(weights, metrics, step):
    # The model as exported (same seed): its values place, with the compiled
    # run's initial weights, the tensors constant folding renamed.
    torch.manual_seed(0)
    model = GPT().eval()
    initial = os.path.join(os.path.dirname(weights), "weights.safetensors")
    model.load_state_dict(load_state_dict(weights, model, initial=initial))
    assert model.lm_head.weight is model.wte.weight, "the tie was lost"
    data = np.fromfile(os.path.join(os.path.dirname(os.path.dirname(metrics)),
                                    "data.u16"),
                       dtype=np.uint16)
    # --sampler sequential: sample i of step s (0-based) starts at token
    # ((s * batch + i) * seq) mod (tokens - seq - 1); the global batch is
    # MICRO per rank on DP ranks.
    batch, n = MICRO * DP, len(data)
    offs = [((step * batch + i) * SEQ) % (n - SEQ - 1) for i in range(batch)]
    x = torch.tensor(np.stack([data[o:o + SEQ] for o in offs]).astype(np.int64))
    y = torch.tensor(np.stack([data[o + 1:o + SEQ + 1] for o in offs]).astype(np.int64))
    with torch.no_grad():
        ours = float(model(x, y))
    logged = [json.loads(line) for line in open(metrics)]
    theirs = next(r["loss"] for r in logged if r["step"] == step + 1)
    rel = abs(ours - theirs) / abs(theirs)
    verdict = "matches" if rel <= 1e-5 else "DIFFERS"
    print(f"step {step + 1} loss {verdict}: PyTorch {ours:.7f}, train {theirs:.7f}"
          f" (rel {rel:.1e})")
    return 0 if rel <= 1e-5 else 1


def garbage(weights):
    """A weight renamed to a generated name, and one with a wrong shape."""
    from fastllm_weights import read_safetensors
    tensors, _ = read_safetensors(weights)
    torch.manual_seed(0)
    model = GPT()
    folder = os.path.dirname(weights)
    initial = os.path.join(folder, "weights.safetensors")
    for label, edit in [("generated", lambda t: t.update({"onnx::MatMul_7": t.pop("h.0.fc.weight")})),
                        ("shape", lambda t: t.update({"h.0.fc.weight": t["h.0.fc.weight"].t()}))]:
        bad = dict(tensors)
        edit(bad)
        path = os.path.join(folder, f"bad-{label}.safetensors")
        write(path, bad)
        try:
            load_state_dict(path, model, initial=initial)
            print(f"{label}: accepted")
        except WeightsError as e:
            print(f"{label}: {str(e).split(': ', 1)[1]}")


def write(path, tensors):
    """A minimal safetensors writer (F32 only), independent of fastllm's."""
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        b = t.contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "export":
        export(sys.argv[2])
    elif cmd == "check":
        sys.exit(check(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    elif cmd == "garbage":
        garbage(sys.argv[2])
