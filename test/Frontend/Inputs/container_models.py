#!/usr/bin/python3
"""container_models.py DIR: exports (torch.onnx.export's defaults: eval mode,
constant folding) a model whose Linear layers sit in containers the way
people write them (an nn.Sequential MLP inside an nn.ModuleList of blocks,
nested ModuleLists), and writes DIR/model.onnx and DIR/state_dict.txt, the
model's own parameter names."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.experts = nn.ModuleList([nn.ModuleList([nn.Linear(dim, dim)])])

    def forward(self, x):
        x = x + self.mlp(self.ln(x))
        return x + self.experts[0][0](x)


class Model(nn.Module):
    """Two blocks of `block` (Block here) between a token embedding and a
    head: test/Frontend/Inputs/wrapper_names.py gives its own."""
    def __init__(self, vocab=64, dim=16, block=Block):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([block(dim) for _ in range(2)])
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    model = Model()
    idx = torch.randint(0, 64, (2, 8))
    torch.onnx.export(model, (idx, idx), os.path.join(out, "model.onnx"))
    with open(os.path.join(out, "state_dict.txt"), "w") as f:
        f.write("\n".join(sorted(model.state_dict())) + "\n")


if __name__ == "__main__":
    main()
