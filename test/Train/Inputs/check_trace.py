"""Checks a `train --trace` file against the generated step and the plan.

usage: check_trace.py TRACE TRAIN_STEP_SOURCE PLAN_JSON --ranks N --steps A-B
                      [--grad-accum G]

Independently of the runtime's tracer, it reads the step's program order from
the generated source (kernel calls, collective starts and waits, line by
line, ignoring the trace hooks) and the plan's communication bytes, then
checks that the file is the trace-event format Perfetto and chrome://tracing
read (spans of one track nest), that every rank and only the chosen steps are there, that each
micro-batch has one compute span per kernel call in program order (named by
its op), that each collective the step issues has a span on a collective
track with the plan's bytes, and that the spans overlap exactly where the
program order says: the compute spans of the kernel calls between a
collective's start and its wait lie inside its span, and a collective with no
kernel call in between contains none. Prints a summary; exits 1 on the first
failure.
"""

import argparse
import json
import re
import sys

# Kernel function -> the op names its span may carry (elementwise: any
# pointwise op or a fused chain, i.e. a name none of the others has).
KERNEL_OPS = {
    "matmul": {"matmul"},
    "addMatmul": {"matmul_accumulate_grad"},
    "addInto": {"accumulate_grad"},
    "fill": {"clear_grads"},
    "layerNorm": {"layer_norm"},
    "layerNormGrad": {"layer_norm_grad"},
    "rmsNorm": {"rms_norm"},
    "rmsNormGrad": {"rms_norm_grad"},
    "causalAttention": {"causal_attention"},
    "causalAttentionGrad": {"causal_attention_grad"},
    "crossEntropy": {"cross_entropy"},
    "crossEntropyGrad": {"cross_entropy_grad"},
    "nllLoss": {"nll_loss"},
    "nllLossGrad": {"nll_loss_grad"},
    "transpose": {"transpose"},
    "slice": {"slice", "split"},
    "sliceGrad": {"slice_grad"},
    "gather": {"gather"},
    "gatherGrad": {"gather_grad"},
    "reduce": {"reduce_sum", "reduce_mean", "reduce_max"},
    "concat": {"concat"},
    "softmax": {"softmax", "log_softmax"},
    "softmaxGrad": {"softmax_grad", "log_softmax_grad"},
    "dropout": {"dropout"},
}
OTHER_OPS = set().union(*KERNEL_OPS.values())


def fail(message):
    print("check_trace: FAIL: " + message)
    sys.exit(1)


def program_order(source):
    """The step's kernel calls and collectives, in program order."""
    text = open(source).read()
    start = text.find('extern "C" float fastllm_step(')
    if start < 0:
        fail("no fastllm_step in " + source)
    items = []
    call = re.compile(r"^([A-Za-z_]\w*)(<[^()]*>)?\(")
    issue = re.compile(
        r"^int32_t (r\d+) = comm->(allGather|reduceScatter)\(comm->context, "
        r"(\d+), (\d+)\);$")
    wait = re.compile(r"^comm->wait\(comm->context, (r\d+)\);$")
    for line in text[start:].splitlines()[2:]:
        s = line.strip()
        if s.startswith("if (trace)"):
            continue  # the hooks are what is checked, not the reference
        m = issue.match(s)
        if m:
            kind = "all_gather" if m.group(2) == "allGather" else \
                "reduce_scatter"
            items.append(("start", m.group(1), kind, int(m.group(3))))
            continue
        m = wait.match(s)
        if m:
            items.append(("wait", m.group(1)))
            continue
        m = call.match(s)
        if m and not s.startswith(("return", "comm->")):
            items.append(("kernel", m.group(1)))
    return items


def ns(x):
    return int(round(float(x) * 1000))


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except ValueError as e:
        fail("%s is not valid JSON: %s" % (path, e))
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"),
                                                   list):
        fail("no traceEvents array")
    names = {}  # (pid, tid) -> track name
    processes = set()
    spans = []
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") not in ("X", "M"):
            fail("not a complete or metadata event: %r" % (e,))
        if not isinstance(e.get("pid"), int) or not isinstance(
                e.get("tid"), int) or not isinstance(e.get("name"), str):
            fail("event without integer pid/tid and a name: %r" % (e,))
        if e["ph"] == "M":
            if e["name"] == "thread_name":
                names[(e["pid"], e["tid"])] = e["args"]["name"]
            elif e["name"] == "process_name":
                processes.add(e["pid"])
            continue
        for key in ("ts", "dur"):
            if not isinstance(e.get(key), (int, float)) or e[key] < 0:
                fail("X event without a non-negative %s: %r" % (key, e))
        if not isinstance(e.get("args"), dict):
            fail("X event without args: %r" % (e,))
        e["start"] = ns(e["ts"])
        e["end"] = e["start"] + ns(e["dur"])
        spans.append(e)
    return spans, names, processes


def check_micro(rank, step, micro, compute, colls, items, plan):
    """One micro-batch of one rank: spans against the program order."""
    kernels = [i for i in items if i[0] == "kernel"]
    if len(compute) != len(kernels):
        fail("rank %d step %d micro-batch %d: %d compute spans, but the "
             "step makes %d kernel calls" %
             (rank, step, micro, len(compute), len(kernels)))
    compute.sort(key=lambda e: e["start"])
    for i, (e, k) in enumerate(zip(compute, kernels)):
        allowed = KERNEL_OPS.get(k[1])
        ok = e["name"] in allowed if allowed else \
            e["name"] not in OTHER_OPS
        if not ok:
            fail("rank %d step %d: kernel call %d is %s, its span is %r" %
                 (rank, step, i, k[1], e["name"]))
        a = e["args"]
        if a.get("phase") not in ("forward", "backward") or not all(
                isinstance(a.get(x), int) for x in ("stage", "layer")):
            fail("compute span without stage, layer and phase: %r" % (e,))
        if i and e["start"] < compute[i - 1]["end"]:
            fail("compute spans %d and %d overlap" % (i - 1, i))
    starts = [i for i in items if i[0] == "start"]
    colls.sort(key=lambda e: e["start"])
    got = [(e["name"], e["args"]["stage"]) for e in colls]
    want = [(s[2], s[3]) for s in starts]
    if got != want:
        fail("rank %d step %d micro-batch %d: the step's collectives are %r "
             "in the trace, %r in the source" % (rank, step, micro, got, want))
    for kind in ("all_gather", "reduce_scatter"):
        total = sum(e["args"]["bytes"] for e in colls if e["name"] == kind)
        planned = plan["communication_bytes"]["per_micro_batch"].get(kind, 0)
        if total != planned:
            fail("rank %d step %d: the step's %s spans move %d bytes, the "
                 "plan says %d" % (rank, step, kind, total, planned))
    # Overlap: the kernel calls between each start and its wait.
    overlapping = 0
    for j, s in enumerate(starts):
        begin = items.index(s)
        end = next(n for n in range(begin, len(items))
                   if items[n] == ("wait", s[1]))
        inside = [n for n in range(begin, end) if items[n][0] == "kernel"]
        first = sum(1 for n in range(begin) if items[n][0] == "kernel")
        c = colls[j]
        for n in range(first, first + len(inside)):
            e = compute[n]
            if not (c["start"] <= e["start"] and e["end"] <= c["end"]):
                fail("rank %d step %d: %s of stage %d overlaps kernel call "
                     "%d in the program but not in time" %
                     (rank, step, s[2], s[3], n))
        if inside:
            overlapping += 1
        else:
            for e in compute:
                if c["start"] <= e["start"] and e["end"] <= c["end"]:
                    fail("rank %d step %d: %s of stage %d has no kernel call "
                         "before its wait, yet contains %r" %
                         (rank, step, s[2], s[3], e["name"]))
    return overlapping


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("source")
    ap.add_argument("plan")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--steps", required=True)
    ap.add_argument("--grad-accum", type=int, default=1)
    args = ap.parse_args()
    first, last = (int(x) for x in args.steps.split("-"))
    items = program_order(args.source)
    plan = json.load(open(args.plan))
    spans, names, processes = load(args.trace)

    pids = {e["pid"] for e in spans}
    if pids != set(range(args.ranks)) or processes != pids:
        fail("ranks in the trace: %r (named: %r), expected 0..%d" %
             (sorted(pids), sorted(processes), args.ranks - 1))
    for e in spans:
        if (e["pid"], e["tid"]) not in names:
            fail("span on an unnamed track: %r" % (e,))
        if not first <= e["args"].get("step", -1) <= last:
            fail("span outside steps %s: %r" % (args.steps, e))
    tracks = {"compute": set(), "collective": set(), "runtime": set()}
    for e in spans:
        tracks.setdefault(e.get("cat"), set()).add((e["pid"], e["tid"]))
    if tracks["compute"] & (tracks["collective"] | tracks["runtime"]) or \
            tracks["collective"] & tracks["runtime"]:
        fail("compute, collective and runtime spans share a track")
    for key in tracks["collective"]:
        if not any(k in names[key]
                   for k in ("all_gather", "reduce_scatter", "all_reduce")):
            fail("collective track named %r" % names[key])

    # Perfetto draws spans of one track only when they nest perfectly.
    by_track = {}
    for e in spans:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, track in by_track.items():
        stack = []
        for e in sorted(track, key=lambda e: (e["start"], -e["end"])):
            while stack and stack[-1]["end"] <= e["start"]:
                stack.pop()
            if stack and e["end"] > stack[-1]["end"]:
                fail("track %r: %r and %r overlap without nesting" %
                     (names[key], stack[-1]["name"], e["name"]))
            stack.append(e)

    overlapping = total = 0
    for rank in range(args.ranks):
        for step in range(first, last + 1):
            mine = [e for e in spans
                    if e["pid"] == rank and e["args"]["step"] == step]
            kinds = [e["name"] for e in mine if e["cat"] == "runtime"]
            want = ["step", "optimizer"] + \
                ["micro_batch", "data_loading"] * args.grad_accum
            if sorted(kinds) != sorted(want):
                fail("rank %d step %d: runtime spans %r" % (rank, step, kinds))
            if args.ranks > 1 and not any(
                    e["name"] == "all_reduce" and
                    e["args"]["moves"] == "grad_norm" for e in mine):
                fail("rank %d step %d: no gradient-norm all-reduce" %
                     (rank, step))
            per_step = {}
            for e in mine:
                if e.get("cat") == "collective" and \
                        e["args"]["issued_by"] == "runtime" and \
                        e["args"]["moves"] != "loss":
                    per_step[e["name"]] = per_step.get(e["name"], 0) + \
                        e["args"]["bytes"]
            for kind, planned in plan["communication_bytes"][
                    "per_step"].items():
                if per_step.get(kind, 0) != planned:
                    fail("rank %d step %d: the runtime's %s spans move %d "
                         "bytes, the plan says %d" %
                         (rank, step, kind, per_step.get(kind, 0), planned))
            for micro in range(args.grad_accum):
                compute = [e for e in mine if e["cat"] == "compute" and
                           e["args"].get("micro_batch") == micro]
                colls = [e for e in mine if e["cat"] == "collective" and
                         e["args"]["issued_by"] == "step" and
                         e["args"].get("micro_batch") == micro]
                overlapping += check_micro(rank, step, micro, compute, colls,
                                           items, plan)
                total += len(colls)
    kernels = sum(1 for i in items if i[0] == "kernel")
    print("trace ok: %d rank(s), steps %d-%d, %d compute spans per "
          "micro-batch, %d step collectives of which %d overlap compute" %
          (args.ranks, first, last, kernels, total, overlapping))


if __name__ == "__main__":
    main()
