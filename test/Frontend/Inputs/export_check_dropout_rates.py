"""Exports, with the export helper's check on, a causal self-attention model
that keeps its attention dropout rate as a float and calls F.dropout itself
(as minGPT-style and nanoGPT code does), next to an nn.Dropout on the
embeddings. The check compares a loss with dropout off on both sides, so it
must switch off the float rate too. argv: source root, scratch folder,
fastllm-opt.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
import fastllm_export  # noqa: E402


class Attention(torch.nn.Module):
    def __init__(self, d, heads, attn_pdrop):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.heads = heads
        self.attn_pdrop = attn_pdrop

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        att = F.dropout(att, self.attn_pdrop, self.training)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Model(torch.nn.Module):
    def __init__(self, vocab=32, d=16, heads=2):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.drop = torch.nn.Dropout(0.1)
        self.attn = Attention(d, heads, attn_pdrop=0.2)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx, targets):
        x = self.drop(self.emb(idx))
        x = x + self.attn(x)
        logits = self.head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


torch.manual_seed(0)
model = Model()
x = torch.randint(0, 32, (2, 8))
fastllm_export.export(model, (x, x), os.path.join(sys.argv[2], "m.onnx"),
                      check=True, tool=sys.argv[3], verbose=True)
print("rate after export:", model.attn.attn_pdrop)
