#!/usr/bin/python3
"""eval_dropout.py export DIR TOOL | check WEIGHTS VAL METRICS K

export: a small GPT written the usual way, with nn.Dropout(0.1) after the
embeddings and on each block's MLP output, exported for training (dropout
kept) by tools/fastllm_export.py into DIR/model.onnx (batch 2, seq 16).
check: the last `val_loss` of METRICS equals PyTorch's loss of the same
weights (WEIGHTS, loaded with tools/fastllm_weights.py) in eval mode, the
mean over the K validation batches `train --sampler sequential` draws from
VAL (step k, sample i starts at ((k * G + i) * T) mod (N - T - 1)); and the
same weights in training mode give a clearly different loss (the check
could fail: dropout matters for this model)."""
import array
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tools"))
import fastllm_export  # noqa: E402
import fastllm_weights  # noqa: E402

VOCAB, DIM, SEQ, BATCH = 256, 32, 16, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(DIM)
        self.fc = nn.Linear(DIM, 4 * DIM)
        self.proj = nn.Linear(4 * DIM, DIM)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln(x)))))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(SEQ, DIM)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def main():
    if sys.argv[1] == "export":
        out, tool = sys.argv[2], sys.argv[3]
        os.makedirs(out, exist_ok=True)
        torch.manual_seed(0)
        model = TinyGPT()
        x = torch.randint(0, VOCAB, (BATCH, SEQ))
        fastllm_export.export(model, (x, x), os.path.join(out, "model.onnx"), tool=tool)
        return
    _, weights, val, metrics, k = sys.argv[1:]
    model = TinyGPT()
    model.load_state_dict(fastllm_weights.load_state_dict(weights, model))
    ids = array.array("H")
    ids.frombytes(open(val, "rb").read())
    data = torch.tensor(ids.tolist(), dtype=torch.int64)
    m = len(data) - SEQ - 1
    batches = []
    for step in range(int(k)):
        starts = [((step * BATCH + i) * SEQ) % m for i in range(BATCH)]
        x = torch.stack([data[s:s + SEQ] for s in starts])
        y = torch.stack([data[s + 1:s + SEQ + 1] for s in starts])
        batches.append((x, y))

    def mean_loss(training):
        model.train(training)
        torch.manual_seed(1)
        with torch.no_grad():
            return sum(float(model(x, y)) for x, y in batches) / len(batches)

    ours = [json.loads(line) for line in open(metrics)]
    got = [r["val_loss"] for r in ours if "val_loss" in r][-1]
    want = mean_loss(False)
    rel = abs(got - want) / abs(want)
    assert rel <= 1e-5, f"val_loss {got} vs PyTorch eval-mode {want} (rel {rel:.2e})"
    dropped = mean_loss(True)
    assert abs(dropped - want) / want > 1e-3, \
        f"dropout does not change this model's loss ({dropped} vs {want})"
    print(f"val_loss {got:.6f} = PyTorch eval-mode loss {want:.6f} (rel {rel:.1e}); "
          f"with dropout on it would be {dropped:.6f}")


if __name__ == "__main__":
    main()
