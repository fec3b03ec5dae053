#!/usr/bin/python3
"""fastllm-plot: pictures of a training run and of a compiled memory plan.

  fastllm-plot metrics METRICS.jsonl [MORE.jsonl ...] -o loss.png
      Loss (and validation loss where lines carry "val_loss"), learning rate
      and gradient norm against the step, one panel each, one colour per
      run; skipped steps (non-finite gradient norm) and non-finite losses
      are marked.
  fastllm-plot memory PLAN.json [MORE.json ...] -o memory.png
      The per-rank memory of `fastllm-opt compile`'s plan.json as stacked
      bars, one per rank, the plans side by side (e.g. ZeRO 1, 2, 3). Every
      rank holds the same arena: a plan of more than 32 ranks is drawn as
      one bar standing for each of them.
  fastllm-plot trace TRACE.json -o trace.png
      The timeline of `train --trace`: per rank, the compute track (forward
      and backward kernels in two colours) and each collective's track
      (from start to wait), so that the overlap the compiler planned shows
      without a trace viewer.

Built and installed beside fastllm-opt from tools/fastllm_plot.py; needs
Debian's python3-matplotlib (drawn with the Agg backend, no display). The
picture is written through a temporary file and a rename; an existing file
is replaced only with --overwrite. --print writes the numbers drawn to
standard output.

Inputs are read through tools/fastllm_input.py (installed beside this
script): each must be a regular file (a FIFO, folder or device is refused
without blocking), no larger than its kind allows, and JSON nested at most
64 levels. Every bound below is checked before the loop it limits; any
malformed input, a value of the wrong type in any field read included, is
one line `fastllm-plot: error: ...` on standard error and exit status 1,
never a traceback.
  metrics   at most 256 MiB and 1,048,576 lines of at most 64 KiB each;
            steps from 0 to 2^53
  memory    at most 16 MiB and 1,048,576 JSON arrays and objects;
            data_parallel 1 to 2^31 - 1, zero_stage 0 to 3, byte counts up
            to 2^60, at most 64 memory_per_rank entries
  trace     at most 32 MiB, 3,145,728 JSON arrays and objects and 1,048,576
            events, on at most 256 tracks (rank and thread pairs); ts and
            dur finite, within 10^15 us, dur >= 0;
            pid and tid integers or strings, names strings of at most 200
            characters
"""
import argparse
import json
import math
import os
import sys
import tempfile
import warnings

PROG = "fastllm-plot"

try:  # beside this script: tools/, build/bin or PREFIX/bin
    import fastllm_input
    from fastllm_input import InputError, JsonError
except ImportError as e:
    sys.exit(f"{PROG}: error: cannot import fastllm_input, which belongs "
             f"beside {os.path.realpath(__file__)}: {e}")

# The bounds on what is read (the module docstring; docs/INPUT_SAFETY.md).
MAX_METRICS_BYTES = 256 << 20
MAX_METRICS_LINES = 1 << 20
MAX_LINE_BYTES = 64 << 10
MAX_STEP = 1 << 53  # steps stay exact as the doubles they are drawn as
MAX_PLAN_BYTES = 16 << 20
MAX_PLAN_CONTAINERS = 1 << 20  # JSON arrays and objects
MAX_DATA_PARALLEL = (1 << 31) - 1  # MPI's world size is an int
MAX_RANK_BARS = 32  # more ranks: one bar stands for each (all are equal)
MAX_FIGURE_BYTES = 1 << 60
MAX_MEMORY_KEYS = 64
MAX_TRACE_BYTES = 32 << 20
MAX_TRACE_EVENTS = 1 << 20
MAX_TRACKS = 256
MAX_TIME_US = 1e15
MAX_NAME = 200
MAX_TITLE = 400  # characters of a figure's title
MAX_TITLE_LINES = 4
MAX_LEGEND = 12  # entries in a metrics panel's legend
# A picture's pixels (--size times --dpi, squared): matplotlib holds the
# raster and copies of it, 4 bytes a pixel each.
MAX_PIXELS = 40_000_000
# The largest magnitude of a value drawn: an axis spanning -1e308..1e308
# overflows matplotlib's arithmetic. Larger ones are marked like NaN.
MAX_DRAWN = 1e250


class Parser(argparse.ArgumentParser):
    """argparse, with the tools' exit status 1 for a bad command line (its
    own is 2)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(1)


class PlotError(Exception):
    """A problem with an input or an output, reported as one line."""


def check_title(title):
    """--title as drawn: at most MAX_TITLE characters and MAX_TITLE_LINES
    lines (a longer one overflows the picture, or matplotlib's raster)."""
    if title is not None and (len(title) > MAX_TITLE or
                              title.count("\n") >= MAX_TITLE_LINES):
        raise PlotError(f"--title has {len(title)} characters in "
                        f"{title.count(chr(10)) + 1} lines; a title has at "
                        f"most {MAX_TITLE} in {MAX_TITLE_LINES}")


def check_pixels(size, dpi):
    """--size at --dpi within MAX_PIXELS (each alone is bounded by its
    parser; together 100x100 inches at 1000 dpi took 18 GB and more)."""
    w, h = round(size[0] * dpi), round(size[1] * dpi)
    if w * h > MAX_PIXELS:
        raise PlotError(f"--size {size[0]:g}x{size[1]:g} at --dpi {dpi} is "
                        f"{w} x {h} pixels; a picture has at most "
                        f"{MAX_PIXELS:,} (lower --dpi or --size)")


def drawn_text(text, newlines=False):
    """`text` as it can be drawn in every format: control characters (and
    DEL) and the lone surrogates a file name of bytes that are not UTF-8
    decodes to (surrogateescape) become U+FFFD; an SVG holding them is no
    well-formed XML, and no font draws them. Newlines stay with
    `newlines` (a --title's lines)."""
    return "".join(
        c if (c == "\n" and newlines) or not (
            ord(c) < 0x20 or ord(c) == 0x7f or 0xd800 <= ord(c) <= 0xdfff)
        else "\ufffd" for c in text)


def set_title(fig, args, default):
    """--title wrapped to the figure's width, or `default` (it lists file
    names, so it may be long) cut to one line of it."""
    import textwrap
    width = max(20, int(args.size[0] * 9))  # characters of the title's font
    if args.title is not None:
        fig.suptitle("\n".join(textwrap.fill(line, width) or line
                               for line in drawn_text(args.title,
                                                      newlines=True).split("\n")))
    else:
        default = drawn_text(default)
        fig.suptitle(default if len(default) <= width
                     else default[:width - 3] + "...")


def short(path):
    """`path` as a title shows it: its name, with its folder's for a
    plan.json or metrics.jsonl (every compile writes a plan.json)."""
    parent, name = os.path.split(os.path.normpath(path))
    if os.path.basename(parent).startswith(".fastllm-staging-"):
        # compile --report-chart draws the plan in its staging folder, whose
        # contents become the output folder's.
        parent = os.path.dirname(parent)
    if name in ("plan.json", "metrics.jsonl") and os.path.basename(parent):
        return drawn_text(os.path.join(os.path.basename(parent), name))
    return drawn_text(name)


# --- metrics ---------------------------------------------------------------

# The fields drawn, in runtime/Metrics.cpp's names: (field, panel, label).
SERIES = [("loss", 0, "loss"), ("val_loss", 0, "validation loss"),
          ("lr", 1, "learning rate"), ("grad_norm", 2, "gradient norm")]
PANELS = ["loss", "learning rate", "gradient norm"]


def number(value, path, line, field):
    """`value` as a float (NaN and infinities included); a bool or a
    non-number is an error naming the line."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        shown = json.dumps(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        raise PlotError(f"{path}:{line}: \"{field}\" is {shown}, not a "
                        "number")
    try:
        return float(value)
    except OverflowError:  # an integer beyond a double's range
        return math.inf if value > 0 else -math.inf


def read_metrics(path):
    """The run in `path` (JSON Lines, one object per step): for each field of
    SERIES the {step: value} it holds, and the skipped steps. A step written
    twice (a resumed run appends from its checkpoint) keeps its last line."""
    series = {field: {} for field, _, _ in SERIES}
    skipped = {}
    with fastllm_input.open_input(path, MAX_METRICS_BYTES,
                                  "a metrics file") as f:
        for n, text in f.lines(MAX_METRICS_LINES, MAX_LINE_BYTES):
            if text.strip():
                read_record(path, n, text, series, skipped)
    if not any(series.values()):
        raise PlotError(f"'{path}' has no step with a loss, validation loss, "
                        "learning rate or gradient norm")
    return series, sorted(s for s, flag in skipped.items() if flag)


def json_error(where, e):
    """PlotError of JsonError `e` at `where` ("FILE:LINE")."""
    if e.lineno is not None:
        return PlotError(f"{where}: not JSON: {e.msg} (column {e.colno})")
    return PlotError(f"{where}: {e.msg}")


def read_record(path, n, text, series, skipped):
    """Line `n` of metrics file `path` into `series` and `skipped`."""
    try:
        record = fastllm_input.loads(text)
    except JsonError as e:
        raise json_error(f"{path}:{n}", e)
    if not isinstance(record, dict):
        raise PlotError(f"{path}:{n}: not a JSON object")
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or \
            not 0 <= step <= MAX_STEP:
        raise PlotError(f"{path}:{n}: no \"step\" (an integer from 0 to "
                        "2^53)")
    for field in series:
        if field in record:
            series[field][step] = number(record[field], path, n, field)
    if "skipped" in record:
        if not isinstance(record["skipped"], bool):
            raise PlotError(f"{path}:{n}: \"skipped\" is not true or false")
        skipped[step] = record["skipped"]


MAX_MARKS = 4000  # lines marking steps, per panel and run


def drawable(value):
    """Whether `value` can be drawn on an axis: finite, and small enough
    that the axis's range and margins stay finite."""
    return math.isfinite(value) and abs(value) <= MAX_DRAWN


def mark(ax, steps, **style):
    """Lines across `ax` at `steps` (sorted), drawn as one collection; of
    more than MAX_MARKS steps (a file may mark a million), one line per
    1/MAX_MARKS of their range, which no picture tells apart. The steps
    count in the x axis's range."""
    if not steps:
        return
    if len(steps) > MAX_MARKS:
        lo, width = steps[0], (steps[-1] - steps[0]) / MAX_MARKS
        steps = list({int((s - lo) // width): s for s in steps}.values())
    from matplotlib.collections import LineCollection
    ax.add_collection(LineCollection([[(s, 0), (s, 1)] for s in steps],
                                     transform=ax.get_xaxis_transform(),
                                     **style), autolim=False)
    ax.update_datalim([(min(steps), 0), (max(steps), 0)], updatey=False)
    ax.autoscale_view(scaley=False)


def draw_metrics(args, plt):
    """The metrics figure: a panel per quantity, a colour per run."""
    runs = [(path, *read_metrics(path)) for path in args.inputs]
    fig, axes = plt.subplots(3, 1, sharex=True, figsize=args.size,
                             dpi=args.dpi, layout="constrained")
    drawn = [[] for _ in axes]  # the finite values of each panel
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for r, (path, series, skipped) in enumerate(runs):
        color = colors[r % len(colors)]
        name = short(path) if len(runs) > 1 else None
        for field, panel, label in SERIES:
            points = sorted(series[field].items())
            finite = [(s, v) for s, v in points if drawable(v)]
            bad = [s for s, v in points if not drawable(v)]
            if finite:
                xs, ys = zip(*finite)
                drawn[panel] += ys
                axes[panel].plot(
                    xs, ys, color=color, linewidth=1.2,
                    linestyle="--" if field == "val_loss" else "-",
                    marker="o" if field == "val_loss" else None,
                    markersize=3,
                    label=label + (f" ({name})" if name else ""))
            mark(axes[panel], bad, colors="black", linestyles=":",
                 linewidths=0.8)
            if args.print:
                nan = [s for s, v in points if not math.isfinite(v)]
                huge = [s for s, v in points
                        if math.isfinite(v) and not drawable(v)]
                print(f"{path}: {field}: {len(finite)} points"
                      + (f", {len(nan)} not finite at steps "
                         + ",".join(map(str, nan)) if nan else "")
                      + (f", {len(huge)} beyond {MAX_DRAWN:g} in magnitude "
                         "at steps " + ",".join(map(str, huge))
                         if huge else ""))
        for ax in axes:
            mark(ax, skipped, colors="red", alpha=0.35, linewidths=1)
        if skipped:
            axes[2].plot([], [], color="red", alpha=0.35,
                         label="skipped step" + (f" ({name})" if name else ""))
        if args.print:
            print(f"{path}: skipped steps: "
                  + (",".join(map(str, skipped)) or "none"))
    for ax, title, ys in zip(axes, PANELS, drawn):
        # A spike of orders of magnitude would flatten the rest: log scale.
        # (Not below 1e-300: a log axis's margins would underflow to 0.)
        if ys and min(ys) > 1e-300 and max(ys) / min(ys) > 1e3:
            ax.set_yscale("log")
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if len(handles) > MAX_LEGEND:
            # Of many runs, a legend naming each would cover the panel.
            more = len(handles) - (MAX_LEGEND - 1)
            handles = handles[:MAX_LEGEND - 1] + [
                plt.matplotlib.lines.Line2D([], [], linestyle="none")]
            labels = labels[:MAX_LEGEND - 1] + [f"and {more} more"]
        if handles:
            ax.legend(handles, labels, loc="upper right", fontsize="small")
    if axes[1].get_yscale() == "linear":
        axes[1].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    axes[2].set_xlabel("step")
    axes[2].xaxis.set_major_locator(
        plt.matplotlib.ticker.MaxNLocator(integer=True))
    set_title(fig, args, "training run" + ("s" if len(runs) > 1 else "")
              + ": " + ", ".join(short(p) for p in args.inputs))
    return fig


# --- memory ----------------------------------------------------------------

# The parts of plan.json's "memory_per_rank", bottom to top, and their
# labels; keys it adds later are drawn too, after these, under their names.
PARTS = [
    ("frozen_parameters_bytes", "frozen parameters"),
    ("weight_buffers_trainable_bytes", "weight buffers"),
    ("gradient_buffers_bytes", "gradient buffers"),
    ("master_weights_shard_bytes", "master weights shard"),
    ("optimizer_shard_bytes", "optimizer shard (AdamW m, v)"),
    ("gradient_shard_bytes", "gradient shard"),
    ("inputs_bytes", "tokens + targets"),
    ("activations_bytes", "activations (peak)"),
]
# Figures of memory_per_rank that are not a part of the arena.
NOT_PARTS = {"total_bytes", "activations_unshared_bytes"}
OTHER = ("other_bytes", "other (the arena's rest)")


def integer(obj, key, where, low=0, high=MAX_FIGURE_BYTES):
    """obj[key], an integer from `low` to `high`."""
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlotError(f"{where}: \"{key}\" is missing or not a "
                        "non-negative integer")
    if not low <= value <= high:
        raise PlotError(f"{where}: \"{key}\" is {value}, not from {low} to "
                        f"{high}")
    return value


def read_json(path, what, max_bytes, max_containers):
    """The JSON document in `path`, at most `max_bytes` with at most
    `max_containers` arrays and objects; a missing, binary or malformed file
    is a PlotError naming it (and the line), `what` saying what it should
    be."""
    try:
        data = fastllm_input.read_input(path, max_bytes, what)
        if b"\0" in data:
            raise PlotError(f"'{path}' is not text (not {what})")
        return fastllm_input.loads(data, max_containers=max_containers)
    except JsonError as e:
        if e.lineno is not None:
            raise PlotError(f"{path}:{e.lineno}: not JSON: {e.msg} "
                            f"(column {e.colno})")
        raise PlotError(f"'{path}' is not {what}: {e.msg}")
    except InputError as e:
        raise PlotError(str(e))


def read_plan(path):
    """(zero stage, dp, target, [(key, label, bytes)], total) of a plan.json.
    The frozen parameters (plan.frozen_elements fp32 values) are drawn apart
    from the weight buffers that include them (the trainable rest keyed
    weight_buffers_trainable_bytes); the parts must not exceed
    the total, and what the total holds beyond them is drawn as "other"."""
    root = read_json(path, "a plan.json", MAX_PLAN_BYTES, MAX_PLAN_CONTAINERS)
    if not isinstance(root, dict) or not isinstance(root.get("plan"), dict) \
            or not isinstance(root.get("memory_per_rank"), dict):
        raise PlotError(f"'{path}' has no \"plan\" and \"memory_per_rank\" "
                        "objects: not the plan.json of `fastllm-opt compile`")
    plan, memory = root["plan"], root["memory_per_rank"]
    where = f"{path}: plan"
    stage = integer(plan, "zero_stage", where, 0, 3)
    dp = integer(plan, "data_parallel", where, 1, MAX_DATA_PARALLEL)
    frozen = integer(plan, "frozen_elements", where, 0,
                     MAX_FIGURE_BYTES // 4) * 4
    where = f"{path}: memory_per_rank"
    if len(memory) > MAX_MEMORY_KEYS:
        raise PlotError(f"{where}: {len(memory)} entries, more than the "
                        f"{MAX_MEMORY_KEYS} drawn")
    for key in memory:
        if len(key) > MAX_NAME:
            raise PlotError(f"{where}: a key of {len(key)} characters, more "
                            f"than {MAX_NAME}")
    total = integer(memory, "total_bytes", where)
    target = root.get("target", "?")
    if not isinstance(target, str) or len(target) > MAX_NAME:
        raise PlotError(f"'{path}': \"target\" is not a string of at most "
                        f"{MAX_NAME} characters")
    known = {key for key, _ in PARTS} | {"weight_buffers_bytes"}
    parts = []
    for key, label in PARTS:
        if key == "frozen_parameters_bytes":
            value = frozen
        elif key == "weight_buffers_trainable_bytes":
            value = integer(memory, "weight_buffers_bytes", where)
            if value < frozen:
                raise PlotError(f"{where}: the weight buffers ({value} B) "
                                f"hold less than the frozen parameters "
                                f"({frozen} B)")
            value -= frozen
        else:
            value = integer(memory, key, where)
        parts.append((key, label, value))
    for key in sorted(memory):
        if key not in known and key not in NOT_PARTS:
            parts.append((key, key.replace("_bytes", "").replace("_", " "),
                          integer(memory, key, where)))
    rest = total - sum(v for _, _, v in parts)
    if rest < 0:
        raise PlotError(f"{where}: the parts add up to {total - rest} B, more "
                        f"than total_bytes ({total} B)")
    parts.append((*OTHER, rest))
    return stage, dp, target, parts, total


def unit(nbytes):
    for name, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return name, size
    return "B", 1


def draw_memory(args, plt):
    """Stacked bars, one per rank, a panel per plan sharing the y axis."""
    plans = [(path, *read_plan(path)) for path in args.inputs]
    fig, axes = plt.subplots(1, len(plans), sharey=True, squeeze=False,
                             figsize=args.size, dpi=args.dpi,
                             layout="constrained")
    axes = axes[0]
    name, size = unit(max(total for *_, total in plans))
    colors = dict(zip(
        [key for key, _ in PARTS] + [OTHER[0]],
        plt.get_cmap("tab10").colors))
    extra = iter(plt.get_cmap("Set3").colors)
    for ax, (path, stage, dp, target, parts, total) in zip(axes, plans):
        # Every rank holds the same arena: a bar per rank up to
        # MAX_RANK_BARS ranks, else one bar standing for each of them.
        bars = dp if dp <= MAX_RANK_BARS else 1
        names = ([f"rank {r}" for r in range(bars)] if bars == dp
                 else [f"each of {dp} ranks"])
        bottom = 0
        for key, label, value in parts:
            if key not in colors:
                colors[key] = next(extra, "grey")
            if value:
                ax.bar(range(bars), [value / size] * bars,
                       bottom=[bottom / size] * bars, color=colors[key],
                       label=label, width=0.7, edgecolor="white",
                       linewidth=0.5)
            bottom += value
        for x, name_ in enumerate(names):
            ax.text(x, total / size, f"{total / size:.2f}",
                    ha="center", va="bottom", fontsize="small")
            if args.print:
                print(f"{path}: {name_}: "
                      + " ".join(f"{key}={value}" for key, _, value in parts)
                      + f" total={bottom}")
        ax.set_xticks(range(bars))
        ax.set_xticklabels(names)
        ax.set_xlim(-0.6, bars - 0.4)
        ax.set_title(f"ZeRO-{stage}, dp {dp}\n{short(path)}",
                     fontsize="medium")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel(f"arena per rank ({name})")
    # One legend entry per part, in stacking order (top first).
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    labels = []
    for *_, parts, _ in plans:
        labels += [label for _, label, _ in parts
                   if label in entries and label not in labels]
    labels.reverse()
    axes[-1].legend([entries[label] for label in labels], labels,
                    loc="upper left", bbox_to_anchor=(1.02, 1),
                    fontsize="small")
    targets = sorted({p[3] for p in plans})
    set_title(fig, args, "memory per rank (" + ", ".join(targets)
              + " target)")
    return fig


# --- trace -------------------------------------------------------------------

def track_id(e, key, where):
    """e[key] ("pid" or "tid"): an integer, or a string of at most MAX_NAME
    characters."""
    value = e.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and \
            abs(value) <= MAX_STEP:
        return value
    if isinstance(value, str) and len(value) <= MAX_NAME:
        return value
    raise PlotError(f"{where}: \"{key}\" is not an integer (up to 2^53) or a "
                    f"string of at most {MAX_NAME} characters")


def microseconds(e, key, where):
    """e[key] ("ts" or "dur"), a finite number within MAX_TIME_US."""
    value = e.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not -MAX_TIME_US <= value <= MAX_TIME_US:
        raise PlotError(f"{where}: \"{key}\" is not a number of microseconds "
                        "within 10^15")
    return float(value)


def read_trace(path):
    """{rank: {track name: [(start us, duration us, name, phase)]}} of the
    complete ("X") events of a `train --trace` file, with the tracks' names
    from its thread_name metadata; the file's first event is time 0."""
    root = read_json(path, "a trace", MAX_TRACE_BYTES,
                     3 * MAX_TRACE_EVENTS)
    events = root.get("traceEvents") if isinstance(root, dict) else None
    if not isinstance(events, list):
        raise PlotError(f"'{path}' has no \"traceEvents\" list: not the "
                        "trace of `train --trace`")
    if len(events) > MAX_TRACE_EVENTS:
        raise PlotError(f"'{path}' holds {len(events)} events, more than the "
                        f"{MAX_TRACE_EVENTS} drawn (trace fewer steps: train "
                        "--trace-steps)")
    names, spans, keys = {}, [], set()
    for i, e in enumerate(events):
        where = f"{path}: event {i}"
        if not isinstance(e, dict):
            raise PlotError(f"{where} is not an object")
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "thread_name":
            key = (track_id(e, "pid", where), track_id(e, "tid", where))
            a = e.get("args", {})
            name = a.get("name", str(key[1])) if isinstance(a, dict) else None
            if not isinstance(name, str) or len(name) > MAX_NAME:
                raise PlotError(f"{where}: a thread_name without an \"args\" "
                                f"object whose \"name\" is a string of at "
                                f"most {MAX_NAME} characters")
            names[key] = drawn_text(name)
        elif ph == "X":
            key = (track_id(e, "pid", where), track_id(e, "tid", where))
            ts = microseconds(e, "ts", where)
            dur = microseconds(e, "dur", where)
            if dur < 0:
                raise PlotError(f"{where}: \"dur\" is negative")
            name, a = e.get("name", ""), e.get("args", {})
            if not isinstance(name, str):
                raise PlotError(f"{where}: \"name\" is not a string")
            if not isinstance(a, dict):
                raise PlotError(f"{where}: \"args\" is not an object")
            phase = a.get("phase")
            if phase is not None and not isinstance(phase, str):
                raise PlotError(f"{where}: \"args\".\"phase\" is not a string")
            keys.add(key)
            if len(keys) > MAX_TRACKS:
                raise PlotError(f"'{path}' has spans on more than {MAX_TRACKS}"
                                " tracks (rank and thread pairs), more than "
                                "are drawn")
            spans.append((key, ts, dur, name, phase))
    if not spans:
        raise PlotError(f"'{path}' holds no complete events to draw")
    t0 = min(ts for _, ts, *_ in spans)
    ranks = {}
    for (pid, tid), ts, dur, name, phase in spans:
        track = names.get((pid, tid), f"track {tid}")
        ranks.setdefault(pid, {}).setdefault(track, []).append(
            (ts - t0, dur, name, phase))
    return ranks


def merged(bars, gap):
    """(start, width) bars, sorted, with those less than `gap` apart joined:
    no picture tells them apart, and a row draws at most about MAX_MARKS."""
    out = []
    for start, width in sorted(bars):
        if out and start <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], start + width)
        else:
            out.append([start, start + width])
    return [(a, b - a) for a, b in out]


def bars_patch(bars, y, color):
    """The (start, width) bars of row `y` as one patch: a compound path of
    rectangles, built with numpy rather than a polygon per bar."""
    import numpy as np
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path
    a = np.asarray(bars, dtype=float).reshape(-1, 2)
    x0, x1 = a[:, 0], a[:, 0] + a[:, 1]
    y0, y1 = np.full_like(x0, y - 0.4), np.full_like(x0, y + 0.4)
    verts = np.stack([np.stack(p, axis=1) for p in
                      ((x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0))],
                     axis=1).reshape(-1, 2)
    codes = np.tile(np.array([Path.MOVETO, Path.LINETO, Path.LINETO,
                              Path.LINETO, Path.CLOSEPOLY], dtype=Path.code_type),
                    len(a))
    return PathPatch(Path(verts, codes), facecolor=color, linewidth=0)


def draw_trace(args, plt):
    """One row per (rank, track): compute spans coloured by phase, the
    collectives' spans from start to wait, the step track's optimizer."""
    if len(args.inputs) != 1:
        raise PlotError("trace draws one file")
    path = args.inputs[0]
    ranks = read_trace(path)
    rows = []
    for rank in sorted(ranks, key=lambda r: (not isinstance(r, int), str(r))):
        tracks = ranks[rank]
        order = sorted(tracks, key=lambda t: (t != "step", t != "compute", t))
        rows += [(rank, t, tracks[t]) for t in order]
    fig, ax = plt.subplots(figsize=args.size, dpi=args.dpi,
                           layout="constrained")
    colors = {"forward": "tab:blue", "backward": "tab:orange"}
    end = max(start + dur for _, _, spans in rows for start, dur, *_ in spans)
    gap = end / 1000 / MAX_MARKS  # ms: closer spans merge, as in the picture
    for y, (rank, track, spans) in enumerate(rows):
        by_color = {}  # one collection per colour and row
        for start, dur, name, phase in spans:
            if track == "compute":
                color = colors.get(phase, "tab:gray")
            elif track == "step":
                if name in ("step", "micro_batch"):
                    continue  # the row shows what happens inside them
                color = "tab:purple" if name == "optimizer" else "tab:gray"
            else:
                color = "tab:green" if "gather" in track else "tab:red"
            by_color.setdefault(color, []).append(
                (start / 1000, max(dur, 0.5) / 1000))
        for color, bars in by_color.items():
            bars = merged(bars, gap)
            # add_patch would walk every segment of the path for the limits
            ax.add_artist(bars_patch(bars, y, color))
            ax.update_datalim([(bars[0][0], y - 0.4),
                               (max(a + w for a, w in bars), y + 0.4)])
        if args.print:
            busy = sum(d for _, d, *_ in spans)
            print(f"{path}: rank {rank}: {track}: {len(spans)} spans, "
                  f"{busy:.1f} us")
    ax.autoscale_view()  # the limits of the artists added
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {r}: {t}" for r, t, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", alpha=0.3)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color="tab:blue", label="forward"),
                       Patch(color="tab:orange", label="backward"),
                       Patch(color="tab:green", label="all-gather"),
                       Patch(color="tab:red", label="reduce-scatter / "
                             "all-reduce"),
                       Patch(color="tab:purple", label="optimizer")],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    set_title(fig, args, f"trace: {short(path)}")
    return fig


# --- the command -------------------------------------------------------------

def figure_size(text):
    try:
        w, h = (float(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not WIDTHxHEIGHT")
    if not (1 <= w <= 100 and 1 <= h <= 100):
        raise argparse.ArgumentTypeError("the size is 1 to 100 inches a side")
    return (w, h)


def dpi(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer")
    if not 10 <= value <= 1000:
        raise argparse.ArgumentTypeError("the dpi is 10 to 1000")
    return value


def check_output(path, overwrite, formats):
    """The format of `path` (from its extension), after checking that it may
    be written: absent, or a regular file with --overwrite."""
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in formats:
        raise PlotError(f"'{path}': the extension names no picture format "
                        f"({', '.join(sorted(formats))})")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ext
    except OSError as e:
        raise PlotError(f"cannot check '{path}': {e.strerror}")
    import stat
    if not stat.S_ISREG(st.st_mode):
        raise PlotError(f"'{path}' exists and is not a regular file; refusing "
                        "to replace it")
    if not overwrite:
        raise PlotError(f"'{path}' exists; pass --overwrite to replace it")
    return ext


def save(fig, path, fmt):
    """Writes the figure through a temporary in the target's folder and a
    rename: the target is whole or untouched."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp-",
                                   dir=folder)
    except OSError as e:
        raise PlotError(f"cannot write in '{folder}': {e.strerror}")
    try:
        with os.fdopen(fd, "wb") as f, warnings.catch_warnings(record=True) \
                as caught:
            warnings.simplefilter("always")
            fig.savefig(f, format=fmt, dpi=fig.dpi)
            f.flush()
            os.fsync(f.fileno())
        if any("constrained_layout not applied" in str(w.message)
               for w in caught):
            w, h = fig.get_size_inches()
            print(f"{PROG}: warning: a {w:g}x{h:g} inch figure is too small "
                  "for its panels and labels, which overlap; a larger --size "
                  "lays them out", file=sys.stderr)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise PlotError(f"cannot write '{path}': {e.strerror}")
    except BaseException:
        os.unlink(tmp)
        raise


def parse_args(argv):
    ap = Parser(
        prog=PROG, description=__doc__.split("\n\n")[0],
        epilog="`fastllm-plot COMMAND --help` for each command's flags")
    commands = ap.add_subparsers(dest="command", required=True,
                                 metavar="COMMAND")
    helps = {
        "metrics": ("METRICS.jsonl", "loss, validation loss, learning rate "
                    "and gradient norm from `train --metrics` files", "10x8"),
        "memory": ("PLAN.json", "the per-rank memory of compiled plans "
                   "(plan.json in `compile -o`'s folder)", "10x6"),
        "trace": ("TRACE.json", "the timeline of a `train --trace` file: "
                  "compute and collectives per rank", "12x5"),
    }
    for command, (metavar, text, default_size) in helps.items():
        sub = commands.add_parser(command, help=text, description=text)
        sub.add_argument("inputs", nargs="+", metavar=metavar)
        sub.add_argument("-o", dest="output", required=True, metavar="FILE",
                         help="the picture to write; its extension picks "
                         "the format (.png, .svg, .pdf, ...)")
        sub.add_argument("--overwrite", action="store_true",
                         help="replace FILE if it exists (default: stop)")
        sub.add_argument("--size", type=figure_size, default=default_size,
                         metavar="WxH", help="figure size in inches "
                         f"(default: {default_size})")
        sub.add_argument("--dpi", type=dpi, default=100,
                         help="dots per inch: a PNG is W*dpi x H*dpi pixels "
                         "(default: 100)")
        sub.add_argument("--title", help="the figure's title (default: "
                         "what it shows and the file names)")
        sub.add_argument("--print", action="store_true",
                         help="print the numbers drawn")
    args = ap.parse_args(argv)
    if isinstance(args.size, str):
        args.size = figure_size(args.size)
    return args


def check_not_an_input(path, inputs):
    """The picture may not replace one of the files it is drawn from,
    --overwrite or not: compared by device and inode (a symlink, `./x`)."""
    try:
        out = os.stat(path)
    except OSError:
        return  # not there yet: it cannot be an input that exists
    for name in inputs:
        try:
            st = os.stat(name)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
            raise PlotError(f"-o '{path}' is the same file as the input '{name}': "
                            "an output never replaces an input; choose another name")


def main(argv):
    args = parse_args(argv)
    try:
        # Agg always: a backend named in the environment is not read (an
        # unknown one made matplotlib's import raise).
        os.environ.pop("MPLBACKEND", None)
        import matplotlib
        matplotlib.use("Agg")
        # Text from the inputs (file names, trace and plan names, --title)
        # is drawn as it is: a '$' must not start matplotlib's math
        # notation, whose parser raises on what it cannot read.
        matplotlib.rcParams["text.parse_math"] = False
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"{PROG}: error: needs matplotlib (Debian: apt-get install "
              f"python3-matplotlib): {e}", file=sys.stderr)
        return 1
    try:
        formats = plt.figure().canvas.get_supported_filetypes()
        plt.close("all")
        fmt = check_output(args.output, args.overwrite, formats)
        check_not_an_input(args.output, args.inputs)
        check_title(args.title)
        check_pixels(args.size, args.dpi)
        draw = {"metrics": draw_metrics, "memory": draw_memory,
                "trace": draw_trace}[args.command]
        fig = draw(args, plt)
        save(fig, args.output, fmt)
    except (PlotError, InputError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except (ArithmeticError, ValueError, IndexError, RuntimeError) as e:
        # A last resort: matplotlib's layout arithmetic has limits the
        # bounds above do not all foresee; the picture is not written.
        print(f"{PROG}: error: cannot draw '{args.output}': matplotlib "
              f"failed on these inputs ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 1
    except MemoryError:  # a last resort: the bounds above should prevent it
        print(f"{PROG}: error: out of memory", file=sys.stderr)
        return 1
    print(f"wrote '{args.output}'")
    return 0


def run(argv):
    """main, and a reader of its output that went away (`| head`) ends it
    quietly, as it does other programs. SIGTERM (a timeout, a scheduler)
    unwinds like an exception, so that no temporary is left beside -o."""
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python would report it again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
