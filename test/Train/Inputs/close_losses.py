#!/usr/bin/python3
"""close_losses.py A.jsonl B.jsonl TOL: both metrics files have the same steps
and every step's losses agree within relative TOL (for builds whose
floating-point operations may be vectorised differently)."""
import json
import sys

a = [json.loads(line) for line in open(sys.argv[1])]
b = [json.loads(line) for line in open(sys.argv[2])]
tol = float(sys.argv[3])
assert [s["step"] for s in a] == [s["step"] for s in b], "different steps"
worst = 0.0
for x, y in zip(a, b):
    rel = abs(x["loss"] - y["loss"]) / max(abs(y["loss"]), 1e-30)
    worst = max(worst, rel)
    assert rel <= tol, f"step {x['step']}: {x['loss']} vs {y['loss']} (rel {rel:.3g})"
print(f"{len(a)} steps, largest relative difference {worst:.3g}")
