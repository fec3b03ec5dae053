"""Exports a small GPT-style model (tied head) with the export helper's
check on, through a compiler that trains one weight unlike PyTorch: a
wrapper adding `--freeze REGEX` for the token table, as a weight trained
apart from its tie or a buffer trained as a weight would. Step 1's loss is
computed before any update and still agrees; the check must fail at step 2.
argv: source root, scratch folder, fastllm-opt, REGEX."""
import os
import shlex
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
import fastllm_export  # noqa: E402

work, tool, regex = sys.argv[2], sys.argv[3], sys.argv[4]


class TiedLM(nn.Module):
    def __init__(self, vocab=64, width=32):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.ln = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx)
        x = x + self.fc(self.ln(x))
        logits = self.head(x)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


wrapper = os.path.join(work, "compile-with-freeze")
with open(wrapper, "w") as f:
    f.write(f'#!/bin/sh\nexec {shlex.quote(tool)} "$@" --freeze {shlex.quote(regex)}\n')
os.chmod(wrapper, 0o755)
torch.manual_seed(0)
x = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fastllm_export.export(TiedLM(), (x, x), os.path.join(work, "m.onnx"), tool=wrapper,
                              verbose=True)
    print("the check passed")
except fastllm_export.ExportCheckError as e:
    print(f"ExportCheckError: {e}")
