#!/usr/bin/python3
"""check_arena.py PLAN_JSON METRICS_JSONL: the arena the binary allocated
(mem_bytes of every step: what the C library's allocator handed out for it)
is the plan's arena size, plus no more than an allocation adds."""
import json
import sys

# What one allocation adds to the bytes asked for: the allocator's header,
# the 64-byte alignment, and the rounding of a chunk it maps on its own (a
# large one) to whole 4 KiB pages.
ALLOCATION_SLACK = 4096 + 128


def arena_matches(measured, plan):
    """True when MEASURED bytes are what allocating PLAN bytes takes."""
    return plan <= measured < plan + ALLOCATION_SLACK


def main():
    plan = json.load(open(sys.argv[1]))["plan"]["arena_bytes"]
    steps = [json.loads(line) for line in open(sys.argv[2])]
    assert steps, "no metrics"
    for s in steps:
        assert arena_matches(s["mem_bytes"], plan), \
            f"step {s['step']}: the arena took {s['mem_bytes']} bytes, plan {plan}"
    print(f"arena {steps[0]['mem_bytes']} bytes for a plan of {plan} over {len(steps)} steps")


if __name__ == "__main__":
    main()
