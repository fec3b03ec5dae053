#!/usr/bin/python3
"""same_losses.py A.jsonl B.jsonl: both metrics files have the same steps with
bit-identical losses (the text of the JSON numbers compared, not floats)."""
import json
import sys

a = [json.loads(line) for line in open(sys.argv[1])]
b = [json.loads(line) for line in open(sys.argv[2])]
assert [s["step"] for s in a] == [s["step"] for s in b], "different steps"
for x, y in zip(a, b):
    assert repr(x["loss"]) == repr(y["loss"]), f"step {x['step']}: {x['loss']} != {y['loss']}"
print(f"{len(a)} steps, identical losses")
