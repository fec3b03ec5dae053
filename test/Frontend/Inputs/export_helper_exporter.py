"""Exports a small model with tools/fastllm_export.py twice, through a
stand-in for torch.onnx.export that records what the helper asked for:
once with a `dynamo` switch in its signature (PyTorch 2.5 and later; 2.9
made dynamo=True the default) and once without one (older PyTorch, which
refuses unknown arguments). argv: the source root and a scratch folder.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
import fastllm_export  # noqa: E402

real_export = torch.onnx.export
asked = []


def with_switch(model, args, f, *, dynamo=True, **kwargs):
    asked.append(f"dynamo={dynamo}")
    return real_export(model, args, f, **kwargs)


def without_switch(model, args, f, **kwargs):
    asked.append("dynamo=" + str(kwargs.pop("dynamo")) if "dynamo" in kwargs
                 else "no dynamo argument")
    return real_export(model, args, f, **kwargs)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)

    def forward(self, idx, targets):
        logits = self.head(self.emb(idx))
        return torch.nn.functional.cross_entropy(logits.view(-1, 16), targets.view(-1))


x = torch.zeros(2, 4, dtype=torch.int64)
for name, stand_in in (("with a dynamo switch", with_switch),
                       ("without one", without_switch)):
    torch.onnx.export = stand_in
    try:
        asked.clear()
        fastllm_export.export(Tiny(), (x, x), os.path.join(sys.argv[2], "m.onnx"),
                              check=False)
    finally:
        torch.onnx.export = real_export
    print(f"{name}: {', '.join(asked)}")
