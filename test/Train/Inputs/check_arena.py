#!/usr/bin/python3
"""check_arena.py PLAN_JSON METRICS_JSONL: the arena the binary allocated
(mem_bytes of every step) equals the plan's arena size."""
import json
import sys

plan = json.load(open(sys.argv[1]))["plan"]["arena_bytes"]
steps = [json.loads(line) for line in open(sys.argv[2])]
assert steps, "no metrics"
for s in steps:
    assert s["mem_bytes"] == plan, f"step {s['step']}: {s['mem_bytes']} != plan {plan}"
print(f"arena {plan} bytes == plan over {len(steps)} steps")
