#!/usr/bin/python3
"""check_folded_names.py SUMMARY STATE_DICT: every weight `import --summary`
names after its module (`NAME <- transpose(onnx::MatMul_N)`) is a name of
the PyTorch model's state_dict, and every 2-D Linear weight of the model
got such a name."""
import re
import sys

summary = open(sys.argv[1]).read()
state = set(open(sys.argv[2]).read().split())
named = re.findall(r"^\s+(\S+) <- transpose\(onnx::MatMul_\d+\)$", summary, re.M)
wrong = [n for n in named if n not in state]
assert not wrong, f"not PyTorch names: {wrong}"
linear = {k for k in state if k.endswith(".weight") and k != "wte.weight" and ".ln." not in k}
missing = linear - set(named)
assert not missing, f"not named after their module: {sorted(missing)}"
print(f"ok {len(named)} folded weights named as PyTorch names them")
