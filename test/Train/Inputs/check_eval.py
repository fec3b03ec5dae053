#!/usr/bin/python3
"""check_eval.py PLAN.json EVAL.jsonl REF.jsonl STEP K [DP] [ACCUM]

EVAL.jsonl is a run with --val-data; REF.jsonl a run on the validation file
itself that starts from the weights EVAL's run saved after STEP and trains K
steps with a learning rate so small (1e-30, no weight decay) that the weights
do not change in fp32: its K losses are the losses of the validation batches
0..K-1, and their mean is what EVAL.jsonl's val_loss at STEP must be.

Also checks the throughput fields of every EVAL line against the plan:
tokens = step * batch * seq * dp * accum exactly, flops_per_step =
plan's flops_per_micro_batch * accum * dp, model_tflops consistent with
step_ms, and an ISO 8601 UTC time."""
import datetime
import json
import sys

plan = json.load(open(sys.argv[1]))
ev = [json.loads(line) for line in open(sys.argv[2])]
ref = [json.loads(line) for line in open(sys.argv[3])]
step, k = int(sys.argv[4]), int(sys.argv[5])
dp = int(sys.argv[6]) if len(sys.argv) > 6 else 1
accum = int(sys.argv[7]) if len(sys.argv) > 7 else 1


def field(key):
    for part in plan.values() if isinstance(plan, dict) else []:
        if isinstance(part, dict) and key in part:
            return part[key]
    return plan[key]


batch, seq = field("batch_size"), field("seq_len")
flops = field("flops_per_micro_batch")
assert flops > 0, "no FLOPs in the plan"
for line in ev:
    s = line["step"]
    assert line["tokens"] == s * batch * seq * dp * accum, line
    assert line["flops_per_step"] == flops * accum * dp, line
    want = flops * accum / (line["step_ms"] / 1e3) / 1e12
    assert abs(line["model_tflops"] - want) <= 0.02 * want + 1e-9, (line, want)
    assert line["arena_bytes"] == field("arena_bytes"), line
    assert line["rss_peak_bytes"] > line["arena_bytes"], line
    t = datetime.datetime.strptime(line["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert abs((datetime.datetime.utcnow() - t).total_seconds()) < 3600, t
evals = {line["step"]: line["val_loss"] for line in ev if "val_loss" in line}
assert len(ref) == k, f"{len(ref)} reference steps, not {k}"
want = sum(line["loss"] for line in ref) / k
got = evals[step]
assert abs(got - want) <= 1e-6 * abs(want), f"val_loss {got} != {want}"
print(f"val_loss after step {step} = {got:.6f} = mean of {k} reference "
      f"losses; evaluated after steps {sorted(evals)}")
