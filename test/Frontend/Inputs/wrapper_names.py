#!/usr/bin/python3
"""wrapper_names.py DIR FASTLLM_OPT: names of Linear weights a model uses
through wrappers, exported with torch.onnx.export's defaults (eval mode,
constant folding: every Linear weight becomes `onnx::MatMul_N`).

The model's blocks call one Linear through its `forward` method, use another
through `F.linear(x, self.proj.weight)`, and call a third, in an
`nn.ModuleDict`, through a lambda. The first two run in the block's own
scope (`/blocks.0/MatMul`, `/blocks.0/MatMul_1`): a name read from it
(`blocks.0.weight`) would be one the model does not have, so the importer
must keep the exporter's names. The third is scoped without the dict's name
(`/blocks.0/a/MatMul`): the file cannot show that, so its name
(`blocks.0.a.weight`) is not the model's, and tools/fastllm_weights.py must
refuse it naming the model's closest name, then place it by value given the
run's initial weights. Prints one line per check."""
import os
import re
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)),
                                "..", "..", "..", "tools"))
from fastllm_weights import WeightsError, load_state_dict  # noqa: E402
from container_models import Model as ContainerModel  # noqa: E402  (beside this file)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.layers = nn.ModuleDict({"a": nn.Linear(dim, dim, bias=False)})
        self.apply_layer = lambda key, x: self.layers[key](x)

    def forward(self, x):
        x = x + self.fc.forward(self.ln(x))
        x = x + F.linear(x, self.proj.weight)
        return x + self.apply_layer("a", x)


def main():
    out, fastllm_opt = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    model = ContainerModel(block=Block)
    idx = torch.randint(0, 64, (2, 8))
    onnx_path = os.path.join(out, "model.onnx")
    torch.onnx.export(model, (idx, idx), onnx_path)
    own = model.state_dict()

    summary = subprocess.run([fastllm_opt, "import", onnx_path, "--summary", "--no-ir"],
                             check=True, capture_output=True, text=True).stdout
    named = re.findall(r"^\s+(\S+) <- transpose\(onnx::MatMul_\d+\)$", summary, re.M)
    invented = sorted(n for n in named if n not in own and not re.fullmatch(r"blocks\.\d\.a\.weight", n))
    assert not invented, f"names the model does not have: {invented}"
    assert "head.weight" in named, named
    kept = sorted(set(re.findall(r"onnx::MatMul_\d+", summary)) -
                  set(re.findall(r"<- transpose\((onnx::MatMul_\d+)\)", summary)))
    assert len(kept) == 4, f"expected 4 weights to keep the exporter's names, got {kept}"
    print(f"ok the 4 weights used in the blocks' own scopes keep the exporter's names")

    run = os.path.join(out, "run")
    subprocess.run([fastllm_opt, "compile", onnx_path, "-o", run, "--emit", "source"],
                   check=True, capture_output=True)
    weights = os.path.join(run, "weights.safetensors")
    try:
        load_state_dict(weights, model)
        raise SystemExit("the scope-named weights were loaded without their names")
    except WeightsError as e:
        assert "blocks.0.a.weight (closest: blocks.0.layers.a.weight" in str(e), str(e)
        assert "initial=" in str(e), str(e)
    print("ok blocks.0.a.weight is refused, naming blocks.0.layers.a.weight")

    # The run's initial weights are the model's own values: placed by value,
    # every tensor of the model comes back exactly.
    state = load_state_dict(weights, model, initial=weights)
    assert list(state) == list(own), (list(state), list(own))
    for name, t in own.items():
        assert torch.equal(state[name], t), name
    model.load_state_dict(state)
    print(f"ok placed by value: {len(own)} tensors equal the model's")


if __name__ == "__main__":
    main()
