"""Exports, with the export helper and its check, one small model whose
forward returns its loss in each way model code does: the loss alone,
(logits, loss), a dict with a 'loss' entry; and one that returns two
scalars, which the helper cannot read. argv: source root, scratch folder,
fastllm-opt."""
import os
import sys
import warnings

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
import fastllm_export  # noqa: E402

work, tool = sys.argv[2], sys.argv[3]


class LM(nn.Module):
    def __init__(self, returns):
        super().__init__()
        self.returns = returns
        self.wte = nn.Embedding(32, 16)
        self.fc = nn.Linear(16, 32)

    def forward(self, idx, targets=None):
        logits = self.fc(self.wte(idx))
        loss = F.cross_entropy(logits.reshape(-1, 32), targets.reshape(-1))
        if self.returns == "loss":
            return loss
        if self.returns == "tuple":
            return logits, loss
        if self.returns == "dict":
            return {"logits": logits, "loss": loss}
        return loss, loss.detach() * 2  # two scalars


x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
for returns in ("loss", "tuple", "dict", "two"):
    torch.manual_seed(0)
    path = os.path.join(work, returns + ".onnx")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fastllm_export.export(LM(returns), (x, x), path, tool=tool)
        outputs = [o.name for o in onnx.load(path).graph.output]
        print(f"{returns}: exported, checked, outputs {outputs}")
    except fastllm_export.ExportError as e:
        print(f"{returns}: ExportError: {e}")

# One export with a symbolic batch serves two micro-batch sizes.
torch.manual_seed(0)
path = os.path.join(work, "dynamic.onnx")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    fastllm_export.export(LM("tuple"), (x, x), path, tool=tool, dynamic_batch=True)
dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in onnx.load(path).graph.input]
print("dynamic: inputs " + "; ".join(" x ".join(map(str, d)) for d in dims))

# Code whose shapes follow the symbolic batch (repeat_interleave along it)
# exports as ONNX sequences, which compile refuses, saying to export static.


class Interleaved(LM):
    def forward(self, idx, targets=None):
        x = self.wte(idx)
        x = x + x.repeat_interleave(1, dim=0)
        return F.cross_entropy(self.fc(x).reshape(-1, 32), targets.reshape(-1))


try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fastllm_export.export(Interleaved("loss"), (x, x), os.path.join(work, "ri.onnx"),
                              tool=tool, dynamic_batch=True)
    print("interleaved: exported")
except fastllm_export.ExportCheckError as e:
    print("interleaved: " + str(e).splitlines()[-1])
