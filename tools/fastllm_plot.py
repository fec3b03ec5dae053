#!/usr/bin/python3
"""fastllm-plot: pictures of a training run and of a compiled memory plan.

  fastllm-plot metrics METRICS.jsonl [MORE.jsonl ...] -o loss.png
      Loss (and validation loss where lines carry "val_loss"), learning rate
      and gradient norm against the step, one panel each, one colour per
      run; skipped steps (non-finite gradient norm) and non-finite losses
      are marked.
  fastllm-plot memory PLAN.json [MORE.json ...] -o memory.png
      The per-rank memory of `fastllm-opt compile`'s plan.json as stacked
      bars, one per rank, the plans side by side (e.g. ZeRO 1, 2, 3).
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
"""
import argparse
import json
import math
import os
import sys
import tempfile

PROG = "fastllm-plot"


class PlotError(Exception):
    """A problem with an input or an output, reported as one line."""


def short(path):
    """`path` as a title shows it: its name, with its folder's for a
    plan.json or metrics.jsonl (every compile writes a plan.json)."""
    parent, name = os.path.split(os.path.normpath(path))
    if os.path.basename(parent).startswith(".fastllm-staging-"):
        # compile --report-chart draws the plan in its staging folder, whose
        # contents become the output folder's.
        parent = os.path.dirname(parent)
    if name in ("plan.json", "metrics.jsonl") and os.path.basename(parent):
        return os.path.join(os.path.basename(parent), name)
    return name


# --- metrics ---------------------------------------------------------------

# The fields drawn, in runtime/Metrics.cpp's names: (field, panel, label).
SERIES = [("loss", 0, "loss"), ("val_loss", 0, "validation loss"),
          ("lr", 1, "learning rate"), ("grad_norm", 2, "gradient norm")]
PANELS = ["loss", "learning rate", "gradient norm"]


def number(value, path, line, field):
    """`value` as a float (NaN and infinities included); a bool or a
    non-number is an error naming the line."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlotError(f"{path}:{line}: \"{field}\" is {json.dumps(value)}, "
                        "not a number")
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
    try:
        lines = open(path, encoding="utf-8").read().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise PlotError(f"cannot read '{path}': {getattr(e, 'strerror', e)}")
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlotError(f"{path}:{n}: not JSON: {e.msg} (column {e.colno})")
        if not isinstance(record, dict):
            raise PlotError(f"{path}:{n}: not a JSON object")
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise PlotError(f"{path}:{n}: no \"step\" (a non-negative integer)")
        for field in series:
            if field in record:
                series[field][step] = number(record[field], path, n, field)
        if "skipped" in record:
            if not isinstance(record["skipped"], bool):
                raise PlotError(f"{path}:{n}: \"skipped\" is not true or false")
            skipped[step] = record["skipped"]
    if not any(series.values()):
        raise PlotError(f"'{path}' has no step with a loss, validation loss, "
                        "learning rate or gradient norm")
    return series, sorted(s for s, flag in skipped.items() if flag)


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
            finite = [(s, v) for s, v in points if math.isfinite(v)]
            bad = [s for s, v in points if not math.isfinite(v)]
            if finite:
                xs, ys = zip(*finite)
                drawn[panel] += ys
                axes[panel].plot(
                    xs, ys, color=color, linewidth=1.2,
                    linestyle="--" if field == "val_loss" else "-",
                    marker="o" if field == "val_loss" else None,
                    markersize=3,
                    label=label + (f" ({name})" if name else ""))
            for s in bad:
                axes[panel].axvline(s, color="black", linestyle=":",
                                    linewidth=0.8)
            if args.print:
                print(f"{path}: {field}: {len(finite)} points"
                      + (f", {len(bad)} not finite at steps "
                         + ",".join(map(str, bad)) if bad else ""))
        for s in skipped:
            for ax in axes:
                ax.axvline(s, color="red", alpha=0.35, linewidth=1)
        if skipped:
            axes[2].plot([], [], color="red", alpha=0.35,
                         label="skipped step" + (f" ({name})" if name else ""))
        if args.print:
            print(f"{path}: skipped steps: "
                  + (",".join(map(str, skipped)) or "none"))
    for ax, title, ys in zip(axes, PANELS, drawn):
        # A spike of orders of magnitude would flatten the rest: log scale.
        if ys and min(ys) > 0 and max(ys) / min(ys) > 1e3:
            ax.set_yscale("log")
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize="small")
    if axes[1].get_yscale() == "linear":
        axes[1].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    axes[2].set_xlabel("step")
    axes[2].xaxis.set_major_locator(
        plt.matplotlib.ticker.MaxNLocator(integer=True))
    fig.suptitle(args.title or "training run"
                 + ("s" if len(runs) > 1 else "") + ": "
                 + ", ".join(short(p) for p in args.inputs))
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


def integer(obj, key, where):
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlotError(f"{where}: \"{key}\" is missing or not a "
                        "non-negative integer")
    return value


def read_json(path, what):
    """The JSON document in `path`; a missing, binary or malformed file is a
    PlotError naming it (and the line), `what` saying what it should be."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise PlotError(f"cannot read '{path}': {e.strerror}")
    except UnicodeDecodeError:
        raise PlotError(f"'{path}' is not text (not {what})")
    except json.JSONDecodeError as e:
        raise PlotError(f"{path}:{e.lineno}: not JSON: {e.msg} "
                        f"(column {e.colno})")


def read_plan(path):
    """(zero stage, dp, target, [(key, label, bytes)], total) of a plan.json.
    The frozen parameters (plan.frozen_elements fp32 values) are drawn apart
    from the weight buffers that include them (the trainable rest keyed
    weight_buffers_trainable_bytes); the parts must not exceed
    the total, and what the total holds beyond them is drawn as "other"."""
    root = read_json(path, "a plan.json")
    if not isinstance(root, dict) or not isinstance(root.get("plan"), dict) \
            or not isinstance(root.get("memory_per_rank"), dict):
        raise PlotError(f"'{path}' has no \"plan\" and \"memory_per_rank\" "
                        "objects: not the plan.json of `fastllm-opt compile`")
    plan, memory = root["plan"], root["memory_per_rank"]
    where = f"{path}: plan"
    stage = integer(plan, "zero_stage", where)
    dp = integer(plan, "data_parallel", where)
    if dp < 1:
        raise PlotError(f"{where}: \"data_parallel\" is 0")
    frozen = integer(plan, "frozen_elements", where) * 4
    where = f"{path}: memory_per_rank"
    total = integer(memory, "total_bytes", where)
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
    return stage, dp, root.get("target", "?"), parts, total


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
        for rank in range(dp):
            bottom = 0
            for key, label, value in parts:
                if key not in colors:
                    colors[key] = next(extra, "grey")
                if value:
                    ax.bar(rank, value / size, bottom=bottom / size,
                           color=colors[key], label=label, width=0.7,
                           edgecolor="white", linewidth=0.5)
                bottom += value
            ax.text(rank, total / size, f"{total / size:.2f}",
                    ha="center", va="bottom", fontsize="small")
            if args.print:
                print(f"{path}: rank {rank}: "
                      + " ".join(f"{key}={value}" for key, _, value in parts)
                      + f" total={bottom}")
        ax.set_xticks(range(dp))
        ax.set_xticklabels([f"rank {r}" for r in range(dp)])
        ax.set_xlim(-0.6, dp - 0.4)
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
    fig.suptitle(args.title or "memory per rank ("
                 + ", ".join(targets) + " target)")
    return fig


# --- trace -------------------------------------------------------------------

def read_trace(path):
    """{rank: {track name: [(start us, duration us, name, args)]}} of the
    complete ("X") events of a `train --trace` file, with the tracks' names
    from its thread_name metadata; the file's first event is time 0."""
    root = read_json(path, "a trace")
    events = root.get("traceEvents") if isinstance(root, dict) else None
    if not isinstance(events, list):
        raise PlotError(f"'{path}' has no \"traceEvents\" list: not the "
                        "trace of `train --trace`")
    names, spans = {}, []
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise PlotError(f"{path}: event {i} is not an object")
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[key] = str((e.get("args") or {}).get("name", key[1]))
        elif e.get("ph") == "X":
            ts, dur = e.get("ts"), e.get("dur")
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or \
                    isinstance(dur, bool) or not isinstance(dur, (int, float)):
                raise PlotError(f"{path}: event {i} has no numeric ts and dur")
            spans.append((key, float(ts), float(dur), str(e.get("name", "")),
                          e.get("args") or {}))
    if not spans:
        raise PlotError(f"'{path}' holds no complete events to draw")
    t0 = min(ts for _, ts, *_ in spans)
    ranks = {}
    for (pid, tid), ts, dur, name, a in spans:
        track = names.get((pid, tid), f"track {tid}")
        ranks.setdefault(pid, {}).setdefault(track, []).append(
            (ts - t0, dur, name, a))
    return ranks


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
    for y, (rank, track, spans) in enumerate(rows):
        for start, dur, name, a in spans:
            if track == "compute":
                color = colors.get(a.get("phase"), "tab:gray")
            elif track == "step":
                if name in ("step", "micro_batch"):
                    continue  # the row shows what happens inside them
                color = "tab:purple" if name == "optimizer" else "tab:gray"
            else:
                color = "tab:green" if "gather" in track else "tab:red"
            ax.broken_barh([(start / 1000, max(dur, 0.5) / 1000)],
                           (y - 0.4, 0.8), facecolors=color, linewidth=0)
        if args.print:
            busy = sum(d for _, d, *_ in spans)
            print(f"{path}: rank {rank}: {track}: {len(spans)} spans, "
                  f"{busy:.1f} us")
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
    fig.suptitle(args.title or f"trace: {short(path)}")
    return fig


# --- the command -------------------------------------------------------------

def figure_size(text):
    try:
        w, h = (float(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not WIDTHxHEIGHT")
    if not (0 < w <= 100 and 0 < h <= 100):
        raise argparse.ArgumentTypeError("the size is 0 to 100 inches a side")
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
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=fmt, dpi=fig.dpi)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise PlotError(f"cannot write '{path}': {e.strerror}")
    except BaseException:
        os.unlink(tmp)
        raise


def parse_args(argv):
    ap = argparse.ArgumentParser(
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


def main(argv):
    args = parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"{PROG}: error: needs matplotlib (Debian: apt-get install "
              f"python3-matplotlib): {e}", file=sys.stderr)
        return 1
    try:
        formats = plt.figure().canvas.get_supported_filetypes()
        plt.close("all")
        fmt = check_output(args.output, args.overwrite, formats)
        draw = {"metrics": draw_metrics, "memory": draw_memory,
                "trace": draw_trace}[args.command]
        fig = draw(args, plt)
        save(fig, args.output, fmt)
    except PlotError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote '{args.output}'")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
