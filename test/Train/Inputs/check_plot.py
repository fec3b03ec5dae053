"""Checks what fastllm-plot drew against its inputs, read here on their own.

usage: check_plot.py png FILE WIDTH HEIGHT
         A valid PNG of WIDTH x HEIGHT pixels: the signature, every chunk's
         CRC, IHDR's size, and IDAT's zlib stream inflating to exactly the
         rows that size and pixel format take.
       check_plot.py metrics PRINTED METRICS.jsonl...
         fastllm-plot metrics --print's counts (finite points per field, the
         non-finite steps) and skipped steps equal those of the files (the
         last line of a step counts).
       check_plot.py trace PRINTED TRACE.json
         fastllm-plot trace --print drew as many spans per rank and track as
         the trace file holds complete events.
       check_plot.py memory PRINTED [--arena TRAIN_LOG PLAN] PLAN.json...
         fastllm-plot memory --print drew data_parallel bars per plan, each
         part equal to plan.json's memory_per_rank figure (the weight
         buffers split into the frozen parameters, frozen_elements * 4
         bytes, and the rest), adding up to total_bytes; with --arena, that
         total is also the arena `train` reports allocating for PLAN.
Prints "ok ..." or exits non-zero naming the first difference.
"""
import json
import math
import os
import re
import struct
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_arena import arena_matches  # noqa: E402


def check_png(path, width, height):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit(f"{path}: not a PNG signature")
    at, chunks = 8, []
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        crc, = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        if zlib.crc32(kind + body) != crc:
            sys.exit(f"{path}: chunk {kind!r} has a bad CRC")
        chunks.append((kind, body))
        at += 12 + length
    if chunks[0][0] != b"IHDR" or chunks[-1][0] != b"IEND":
        sys.exit(f"{path}: IHDR first and IEND last expected")
    w, h, depth, color = struct.unpack(">IIBB", chunks[0][1][:10])
    if (w, h) != (width, height):
        sys.exit(f"{path}: {w} x {h} pixels, expected {width} x {height}")
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color]
    pixels = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    if depth != 8 or len(pixels) != h * (1 + w * channels):
        sys.exit(f"{path}: the image data does not hold {w} x {h} pixels")
    print(f"ok {w} x {h} PNG")


def check_metrics(printed, paths):
    out = open(printed).read()
    for path in paths:
        steps = {}
        for line in open(path):
            if line.strip():
                record = json.loads(line)
                steps.setdefault(record["step"], {}).update(record)
        for field in ("loss", "val_loss", "lr", "grad_norm"):
            values = {s: r[field] for s, r in steps.items() if field in r}
            bad = sorted(s for s, v in values.items() if not math.isfinite(v))
            want = f"{path}: {field}: {len(values) - len(bad)} points" + (
                f", {len(bad)} not finite at steps "
                + ",".join(map(str, bad)) if bad else "")
            if want not in out.splitlines():
                sys.exit(f"not printed: {want}")
        skipped = sorted(s for s, r in steps.items() if r.get("skipped"))
        want = f"{path}: skipped steps: " + (
            ",".join(map(str, skipped)) or "none")
        if want not in out.splitlines():
            sys.exit(f"not printed: {want}")
    print(f"ok {len(paths)} runs")


def check_memory(printed, args):
    arena = None
    if args[0] == "--arena":
        log, plan_path = args[1], args[2]
        found = re.search(r"the arena took (\d+) bytes", open(log).read())
        arena = (plan_path, int(found.group(1)))
        args = args[3:]
    bars = {}
    for line in open(printed):
        m = re.match(r"(.*): rank (\d+): (.*) total=(\d+)$", line.strip())
        if m:
            parts = dict((k, int(v)) for k, v in
                         (p.split("=") for p in m.group(3).split()))
            bars.setdefault(m.group(1), []).append(
                (int(m.group(2)), parts, int(m.group(4))))
    bar_count = 0
    for path in args:
        root = json.load(open(path))
        plan, memory = root["plan"], root["memory_per_rank"]
        frozen = plan["frozen_elements"] * 4
        expected = {k: v for k, v in memory.items()
                    if k not in ("total_bytes", "activations_unshared_bytes",
                                 "weight_buffers_bytes")}
        expected["frozen_parameters_bytes"] = frozen
        expected["weight_buffers_trainable_bytes"] = \
            memory["weight_buffers_bytes"] - frozen
        drawn = bars.get(path, [])
        if [r for r, _, _ in drawn] != list(range(plan["data_parallel"])):
            sys.exit(f"{path}: bars for ranks {[r for r, _, _ in drawn]}, "
                     f"data_parallel is {plan['data_parallel']}")
        for rank, parts, total in drawn:
            for key, value in expected.items():
                if parts.get(key) != value:
                    sys.exit(f"{path} rank {rank}: {key} drawn "
                             f"{parts.get(key)}, the plan says {value}")
            extra = {k: v for k, v in parts.items()
                     if k not in expected and v != 0}
            if extra:
                sys.exit(f"{path} rank {rank}: drawn beyond the plan: {extra}")
            if not total == sum(parts.values()) == memory["total_bytes"]:
                sys.exit(f"{path} rank {rank}: the bar adds up to "
                         f"{sum(parts.values())} (printed {total}), the "
                         f"plan's total is {memory['total_bytes']}")
            if arena and arena[0] == path and not arena_matches(arena[1], total):
                sys.exit(f"{path}: the bar's total {total}, train's arena "
                         f"{arena[1]} (more than one allocation adds)")
            bar_count += 1
    print(f"ok {bar_count} bars")


def check_trace(printed, trace):
    """fastllm-plot trace --print's span count per rank and track equals
    the trace file's complete events per (pid, thread_name)."""
    root = json.load(open(trace))
    names = {(e["pid"], e["tid"]): e["args"]["name"]
             for e in root["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    want = {}
    for e in root["traceEvents"]:
        if e["ph"] == "X":
            key = (e["pid"], names[(e["pid"], e["tid"])])
            want[key] = want.get(key, 0) + 1
    got = {}
    for line in open(printed):
        m = re.match(r".*: rank (\d+): (.+): (\d+) spans, ", line)
        if m:
            got[(int(m.group(1)), m.group(2))] = int(m.group(3))
    if got != want:
        sys.exit(f"drawn {sorted(got.items())}, the trace holds "
                 f"{sorted(want.items())}")
    print(f"ok {len(got)} tracks, {sum(got.values())} spans")


def main():
    if sys.argv[1] == "png":
        try:
            check_png(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        except (struct.error, zlib.error, KeyError, IndexError) as e:
            sys.exit(f"{sys.argv[2]}: not a whole PNG ({e})")
    elif sys.argv[1] == "metrics":
        check_metrics(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "trace":
        check_trace(sys.argv[2], sys.argv[3])
    else:
        check_memory(sys.argv[2], sys.argv[3:])


main()
