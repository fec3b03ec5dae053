#!/usr/bin/python3
"""export_input_orders.py DIR: exports one small GPT-style model twice with
torch.onnx.export's defaults, once as forward(idx, targets) and once as
forward(targets, idx) (DIR/ordered.onnx, DIR/swapped.onnx): the same weights,
the inputs declared in the other order."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, SEQ, BATCH = 256, 16, 8, 2


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(SEQ, DIM)
        self.drop = nn.Dropout(0.0)
        self.ln = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2 does

    def loss(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        x = x + self.mlp(self.ln(x))
        logits = self.head(x)
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


class Ordered(TinyLM):
    def forward(self, idx, targets):
        return self.loss(idx, targets)


class Swapped(TinyLM):
    def forward(self, targets, idx):
        return self.loss(idx, targets)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    ordered = Ordered()
    swapped = Swapped()
    swapped.load_state_dict(ordered.state_dict())
    idx = torch.randint(0, VOCAB, (BATCH, SEQ))
    targets = torch.randint(0, VOCAB, (BATCH, SEQ))
    torch.onnx.export(ordered, (idx, targets), os.path.join(out, "ordered.onnx"))
    torch.onnx.export(swapped, (targets, idx), os.path.join(out, "swapped.onnx"))


if __name__ == "__main__":
    main()
