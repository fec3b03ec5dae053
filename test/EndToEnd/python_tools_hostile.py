#!/usr/bin/python3
# REQUIRES: torch, matplotlib
# RUN: %python %s fastllm-plot
"""Hostile input to the Python tools: fastllm-plot and tools/fastllm_weights.py.

Every case runs the tool in a process of its own, under a 60 s timeout and
an address-space limit (RLIMIT_AS, 6 GiB: an unbounded read would fail
rather than take the machine), started by a small launcher process (so
that its peak RSS is its own, not that of the harness it would otherwise be
forked from), and checks its outcome exactly:

  fastllm-plot   exit status 1 and standard error exactly one line,
                 `fastllm-plot: error: MESSAGE` (no traceback), or, for the
                 large inputs it must draw, exit 0 and the lines it prints;
  weights        read_safetensors / load_state_dict raise WeightsError with
                 exactly MESSAGE (a small driver prints it; any other
                 exception is a traceback and fails the case).

and that the run stayed within its bounds: at most MAX_SECONDS of wall time
and MAX_RSS_MIB of peak resident memory (os.wait4's ru_maxrss), printed
under each case line. The classes: a FIFO (must not block), /dev/zero and a
folder (refused without reading), a symlink to /dev/zero, a missing file,
8 GiB sparse files (refused by size, nothing read), 50,000-deep JSON,
JSON of the most bytes allowed made of empty arrays or short strings (which
Python's objects would multiply many times: refused by counting), a
data_parallel of 100,000 (one bar) and of 2^31 (refused), 200,000 trace
tracks, too many events, lines and memory entries, wrong types in every
field the tools read, integers of 5,000 digits, truncated, overlapping and
malformed safetensors, a header length of 8 GiB, and valid inputs that must
still work.

Prints PASS/FAIL per case and `python tools hostile: P passed, F failed`.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOLS = os.path.join(ROOT, "tools")
PLOT = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") \
    else os.path.join(ROOT, "build", "bin", "fastllm-plot")
PY = sys.executable
TIMEOUT = 60
MAX_SECONDS = 30
MAX_RSS_MIB = 1024
ADDRESS_SPACE = 6 << 30
GIB8 = 8 << 30

# Runs a weights call; prints "WeightsError: MESSAGE" (exit 3) or "ok ...".
WEIGHTS_DRIVER = r"""
import sys
sys.path.insert(0, sys.argv[1])
import torch
import fastllm_weights as fw
what, path = sys.argv[2], sys.argv[3]
try:
    if what == "read":
        tensors, meta = fw.read_safetensors(path)
        print("ok", len(tensors), "tensors",
              ",".join(f"{n}={list(t.shape)}" for n, t in tensors.items()))
    elif what == "load":  # the file into a Linear(2, 2)
        fw.load_state_dict(path, torch.nn.Linear(2, 2))
        print("ok")
    else:  # "initial": a model and a hostile initial= file
        model = torch.nn.Linear(2, 2)
        fw.load_state_dict(sys.argv[4], model, initial=path)
        print("ok")
except fw.WeightsError as e:
    print(f"WeightsError: {e}")
    sys.exit(3)
"""


# Runs the cases: a small process started before the harness builds its
# large inputs, since a child's peak RSS (ru_maxrss) counts the memory of
# the process it was forked from. Reads one JSON request per line, {"argv",
# "out", "err"}, and answers {"code" (null: timed out), "seconds", "rss_mib"}.
LAUNCHER = r"""
import json, os, resource, subprocess, sys, time
limit, timeout = int(sys.argv[1]), float(sys.argv[2])
def address_space():
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
for line in sys.stdin:
    req = json.loads(line)
    start = time.monotonic()
    with open(req["out"], "wb") as out, open(req["err"], "wb") as err:
        proc = subprocess.Popen(req["argv"], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err,
                                preexec_fn=address_space)
        code = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() - start > timeout:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = 0  # reaped above
    print(json.dumps({"code": code, "seconds": time.monotonic() - start,
                      "rss_mib": usage.ru_maxrss / 1024}), flush=True)
"""


class Launcher:
    def __init__(self, folder):
        self.folder = folder
        self.proc = subprocess.Popen(
            [PY, "-c", LAUNCHER, str(ADDRESS_SPACE), str(TIMEOUT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, argv):
        """(exit status, stdout, stderr, seconds, peak RSS MiB) of argv."""
        out, err = (os.path.join(self.folder, f"case.{n}") for n in ("out", "err"))
        self.proc.stdin.write(json.dumps({"argv": argv, "out": out,
                                          "err": err}) + "\n")
        self.proc.stdin.flush()
        result = json.loads(self.proc.stdout.readline())
        with open(out, "rb") as f, open(err, "rb") as g:
            return (result["code"], f.read().decode(errors="replace"),
                    g.read().decode(errors="replace"), result["seconds"],
                    result["rss_mib"])

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


class Harness:
    def __init__(self, folder, list_only):
        self.folder = folder
        self.list_only = list_only
        self.passed = self.failed = 0
        self.launcher = None if list_only else Launcher(folder)

    def path(self, name):
        return os.path.join(self.folder, name)

    def case(self, name, argv, code, want_err=None, want_out=(), usage=False):
        """Runs argv; passes when it exits with `code`, its stderr is exactly
        `want_err` (a line; None: empty; with `usage`, argparse's usage
        lines come first) and stdout holds every line of `want_out`, within
        the time and memory bounds."""
        if self.list_only:
            print(f"CASE {name}")
            return
        got, out, err, seconds, rss = self.launcher.run(argv)
        problems = []
        if got is None:
            problems.append(f"still running after {TIMEOUT} s (killed)")
        elif got != code:
            problems.append(f"exit {got}, expected {code}")
        if usage and err.startswith("usage: "):
            err = err.splitlines()[-1] + "\n"
        if want_err is not None and err != want_err + "\n":
            problems.append(f"stderr {err!r}, expected {want_err!r}")
        if want_err is None and err.strip():
            problems.append(f"stderr {err[-2000:]!r}, expected nothing")
        lines = out.splitlines()
        for line in want_out:
            if line not in lines:
                problems.append(f"stdout lacks {line!r}: {out[-2000:]!r}")
        if "Traceback" in err or "Traceback" in out:
            problems.append("a traceback")
        if seconds > MAX_SECONDS:
            problems.append(f"took {seconds:.1f} s, more than {MAX_SECONDS}")
        if rss > MAX_RSS_MIB:
            problems.append(f"peak RSS {rss:.0f} MiB, more than {MAX_RSS_MIB}")
        if problems:
            self.failed += 1
            print(f"FAIL {name}: " + "; ".join(problems))
        else:
            self.passed += 1
            print(f"PASS {name}")
        print(f"    exit {got}, {seconds:.2f} s, peak RSS {rss:.0f} MiB"
              + (f": {err.strip()}" if err.strip() else ""), flush=True)

    def plot_error(self, name, command, path, message, extra=()):
        self.case(f"fastllm-plot {command}: {name}",
                  [PLOT, command, path, "-o", self.path(name + ".png"),
                   *extra], 1, f"fastllm-plot: error: {message}")
        if not self.list_only and os.path.exists(self.path(name + ".png")):
            self.failed += 1
            print(f"FAIL fastllm-plot {command}: {name}: wrote a picture")

    def weights_error(self, name, path, message, what="read", model_file=""):
        self.case(f"weights: {name}",
                  [PY, "-c", WEIGHTS_DRIVER, TOOLS, what, path, model_file],
                  3, None, [f"WeightsError: {message}"])


# --- inputs ------------------------------------------------------------------

def write(path, data):
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return path


def sparse(path, size):
    """A file of `size` bytes that holds none: reading it would take long
    and allocating it would take `size` bytes."""
    with open(path, "wb"):
        pass
    os.truncate(path, size)
    return path


def safetensors(path, header, data=b"", header_bytes=None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return write(path, struct.pack("<Q", len(raw) if header_bytes is None
                                   else header_bytes) + raw + data)


def plan_json(**changes):
    """A plan.json as `compile` writes it (the parts fastllm-plot reads),
    with `changes` applied: plan_KEY / memory_KEY / KEY (None removes)."""
    root = {"target": "cpu",
            "plan": {"zero_stage": 1, "data_parallel": 2,
                     "frozen_elements": 0},
            "memory_per_rank": {"weight_buffers_bytes": 1000,
                                "gradient_buffers_bytes": 1000,
                                "master_weights_shard_bytes": 500,
                                "optimizer_shard_bytes": 1000,
                                "gradient_shard_bytes": 500,
                                "inputs_bytes": 64,
                                "activations_bytes": 4000,
                                "activations_unshared_bytes": 5000,
                                "total_bytes": 8064}}
    for key, value in changes.items():
        part, _, name = key.partition("_")
        target = {"plan": root["plan"], "memory": root["memory_per_rank"]}.get(part)
        if target is None:
            target, name = root, key
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value
    return root


def trace_json(events):
    return {"traceEvents": events}


def thread_name(pid, tid, name):
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
            "args": {"name": name}}


def span(pid=0, tid=1, ts=0, dur=1, name="matmul", phase="forward"):
    return {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "name": name, "args": {"phase": phase}}


METRIC = {"step": 1, "loss": 5.5, "lr": 1e-3, "grad_norm": 2.0,
          "skipped": False}


def main():
    list_only = "--list-cases" in sys.argv
    with tempfile.TemporaryDirectory(prefix="python-tools-hostile-") as tmp:
        h = Harness(tmp, list_only)
        p = h.path
        if not list_only:
            os.mkfifo(p("fifo"))
            os.mkdir(p("folder"))
            os.symlink("/dev/zero", p("zero-link"))
            for kind in ("metrics", "plan", "trace", "weights"):
                sparse(p(f"sparse-{kind}"), GIB8)
            write(p("deep.json"), "[" * 50000 + "]" * 50000)
            write(p("deep-open.json"), "[" * 50000)
            write(p("deep.jsonl"), json.dumps(METRIC) + "\n"
                  + '{"step": 2, "loss": ' + "[" * 50000 + "}\n")
            write(p("ok.jsonl"), "".join(
                json.dumps(dict(METRIC, step=s)) + "\n" for s in range(1, 6)))
        fifo, folder = p("fifo"), p("folder")

        # Files that are not regular, or not there, or too large.
        for command, kind, size in (("metrics", "a metrics file", "256 MiB"),
                                    ("memory", "a plan.json", "16 MiB"),
                                    ("trace", "a trace", "32 MiB")):
            h.plot_error("FIFO", command, fifo,
                         f"'{fifo}' is a FIFO (a named pipe), not a regular file")
            h.plot_error("/dev/zero", command, "/dev/zero",
                         "'/dev/zero' is a device, not a regular file")
            name = {"metrics": "metrics", "memory": "plan", "trace": "trace"}[command]
            h.plot_error("8 GiB sparse file", command, p(f"sparse-{name}"),
                         f"'{p('sparse-' + name)}' has {GIB8} bytes, more than "
                         f"the {size} {kind} may have")
        h.plot_error("folder", "memory", folder,
                     f"'{folder}' is a folder, not a regular file")
        h.plot_error("symlink to /dev/zero", "trace", p("zero-link"),
                     f"'{p('zero-link')}' is a device, not a regular file")
        h.plot_error("missing", "metrics", p("none.jsonl"),
                     f"cannot read '{p('none.jsonl')}': it does not exist")

        # Nesting.
        h.plot_error("50,000-deep JSON", "memory", p("deep.json"),
                     f"'{p('deep.json')}' is not a plan.json: nested deeper "
                     "than 64 levels")
        h.plot_error("50,000 unclosed brackets", "trace", p("deep-open.json"),
                     f"'{p('deep-open.json')}' is not a trace: nested deeper "
                     "than 64 levels")
        h.plot_error("50,000-deep line", "metrics", p("deep.jsonl"),
                     f"{p('deep.jsonl')}:2: nested deeper than 64 levels")

        # metrics: loop bounds and types.
        def metrics(name, text, message):
            path = p(name.replace(" ", "-").replace("/", "-") + ".jsonl")
            if not list_only:
                write(path, text)
            h.plot_error(name, "metrics", path, message.replace("@", path))

        many = (1 << 20) + 1
        metrics("1,048,577 lines", "\n" * many,
                "'@' has more than 1048576 lines")
        metrics("a 100 KiB line", '{"step": 1, "loss": 1, "x": "'
                + "a" * 100000 + '"}\n', "@:1: the line is longer than 64 KiB")
        metrics("not JSON", '{"step": 1, "loss": \n', "@:1: not JSON: "
                "Expecting value (column 21)")
        line = b'{"step": 1, "loss": 1, "x": "\xff"}\n'
        at = line.index(b"\xff")
        metrics("not UTF-8", line, f"@:1: not UTF-8 text (byte {at})")
        for label, record, message in [
                ("a list", [1, 2], "@:1: not a JSON object"),
                ("step a string", dict(METRIC, step="1"),
                 '@:1: no "step" (an integer from 0 to 2^53)'),
                ("step negative", dict(METRIC, step=-1),
                 '@:1: no "step" (an integer from 0 to 2^53)'),
                ("step 2^60", dict(METRIC, step=1 << 60),
                 '@:1: no "step" (an integer from 0 to 2^53)'),
                ("step true", dict(METRIC, step=True),
                 '@:1: no "step" (an integer from 0 to 2^53)'),
                ("loss a list", dict(METRIC, loss=[1]),
                 '@:1: "loss" is [1], not a number'),
                ("lr a string", dict(METRIC, lr="1e-3"),
                 '@:1: "lr" is "1e-3", not a number'),
                ("grad_norm an object", dict(METRIC, grad_norm={"a": 1}),
                 '@:1: "grad_norm" is {"a": 1}, not a number'),
                ("val_loss null", dict(METRIC, val_loss=None),
                 '@:1: "val_loss" is null, not a number'),
                ("loss a long string", dict(METRIC, loss="x" * 1000),
                 '@:1: "loss" is "' + "x" * 56 + '..., not a number'),
                ("skipped a string", dict(METRIC, skipped="yes"),
                 '@:1: "skipped" is not true or false')]:
            metrics(f"{label}", json.dumps(record) + "\n", message)
        metrics("an integer of 5,000 digits",
                '{"step": ' + "9" * 5000 + "}\n",
                "@:1: an integer of more than 4300 digits")
        metrics("no values", '{"step": 1}\n', "'@' has no step with a loss, "
                "validation loss, learning rate or gradient norm")

        # memory: loop bounds and types.
        def memory(name, root, message, text=None):
            path = p(name.replace(" ", "-").replace("/", "-").replace("^", "")
                     + ".json")
            if not list_only:
                write(path, text if text is not None else json.dumps(root))
            h.plot_error(name, "memory", path, message.replace("@", path))

        where = "@: plan"
        mem = "@: memory_per_rank"
        memory("data_parallel 2^31", plan_json(plan_data_parallel=1 << 31),
               f'{where}: "data_parallel" is 2147483648, not from 1 to '
               "2147483647")
        memory("data_parallel 0", plan_json(plan_data_parallel=0),
               f'{where}: "data_parallel" is 0, not from 1 to 2147483647')
        for field in ("zero_stage", "data_parallel", "frozen_elements"):
            for label, value in (("a string", "1"), ("true", True),
                                 ("a float", 1.5), ("negative", -1),
                                 ("missing", None)):
                memory(f"{field} {label}", plan_json(**{f"plan_{field}": value}),
                       f'{where}: "{field}" is missing or not a non-negative '
                       "integer")
        memory("zero_stage 7", plan_json(plan_zero_stage=7),
               f'{where}: "zero_stage" is 7, not from 0 to 3')
        memory("frozen_elements 2^60", plan_json(plan_frozen_elements=1 << 60),
               f'{where}: "frozen_elements" is {1 << 60}, not from 0 to '
               f"{(1 << 60) // 4}")
        for field in ("total_bytes", "weight_buffers_bytes", "inputs_bytes",
                      "activations_bytes"):
            memory(f"{field} a string", plan_json(**{f"memory_{field}": "8"}),
                   f'{mem}: "{field}" is missing or not a non-negative integer')
        memory("total_bytes 2^61", plan_json(memory_total_bytes=1 << 61),
               f'{mem}: "total_bytes" is {1 << 61}, not from 0 to {1 << 60}')
        memory("an extra entry a list", plan_json(memory_extra_bytes=[1]),
               f'{mem}: "extra_bytes" is missing or not a non-negative integer')
        memory("65 memory entries", plan_json(**{f"memory_x{i}_bytes": 0
                                                 for i in range(56)}),
               f"{mem}: 65 entries, more than the 64 drawn")
        memory("a 300-character key", plan_json(**{"memory_" + "k" * 300: 0}),
               f"{mem}: a key of 300 characters, more than 200")
        memory("parts above the total", plan_json(memory_total_bytes=10),
               f"{mem}: the parts add up to 8064 B, more than total_bytes (10 B)")
        memory("weight buffers below frozen",
               plan_json(plan_frozen_elements=1000),
               f"{mem}: the weight buffers (1000 B) hold less than the frozen "
               "parameters (4000 B)")
        memory("target a list", plan_json(target=["cpu"]),
               "'@': \"target\" is not a string of at most 200 characters")
        memory("target 10,000 characters", plan_json(target="c" * 10000),
               "'@': \"target\" is not a string of at most 200 characters")
        memory("the root a list", [], '\'@\' has no "plan" and '
               '"memory_per_rank" objects: not the plan.json of `fastllm-opt '
               "compile`")
        memory("plan a list", dict(plan_json(), plan=[1]),
               '\'@\' has no "plan" and "memory_per_rank" objects: not the '
               "plan.json of `fastllm-opt compile`")
        memory("an integer of 5,000 digits", None,
               "'@' is not a plan.json: an integer of more than 4300 digits",
               text='{"plan": {"zero_stage": ' + "9" * 5000 + "}}")
        memory("not UTF-8", None,
               "'@' is not a plan.json: not UTF-8 text (byte 10)",
               text=b'{"plan": "\xff"}')
        memory("binary", None, "'@' is not text (not a plan.json)",
               text="\0\0\0\0")

        # trace: loop bounds and types.
        def trace(name, root, message, text=None):
            path = p(name.replace(" ", "-").replace("/", "-").replace(",", "")
                     + ".trace.json")
            if not list_only:
                write(path, text if text is not None
                      else json.dumps(root, separators=(",", ":")))
            h.plot_error(name, "trace", path, message.replace("@", path))

        if list_only:
            tracks = events = []
        else:
            tracks = [{"ph": "X", "pid": 0, "tid": t, "ts": t, "dur": 1}
                      for t in range(200000)]
            events = [{}] * ((1 << 20) + 1)
        trace("200,000 tracks", trace_json(tracks),
              "'@' has spans on more than 256 tracks (rank and thread pairs), "
              "more than are drawn")
        trace("1,048,577 events", trace_json(events),
              "'@' holds 1048577 events, more than the 1048576 drawn (trace "
              "fewer steps: train --trace-steps)")
        trace("32 MiB of empty arrays", None, "'@' is not a trace: more than "
              "3145728 arrays and objects", text='{"traceEvents":['
              + "[]," * (((32 << 20) - 20) // 3) + "0]}")
        memory("16 MiB of empty arrays", None, "'@' is not a plan.json: more "
               "than 1048576 arrays and objects", text='{"plan":['
               + "[]," * (((16 << 20) - 20) // 3) + "0]}")
        trace("traceEvents an object", {"traceEvents": {}},
              "'@' has no \"traceEvents\" list: not the trace of `train --trace`")
        trace("an event a list", trace_json([[1]]), "@: event 0 is not an object")
        ev0 = "@: event 0"
        for field, label, value, message in [
                ("pid", "a list", [0], f'{ev0}: "pid" is not an integer (up to '
                 '2^53) or a string of at most 200 characters'),
                ("tid", "a float", 1.5, f'{ev0}: "tid" is not an integer (up '
                 'to 2^53) or a string of at most 200 characters'),
                ("tid", "2^60", 1 << 60, f'{ev0}: "tid" is not an integer (up '
                 'to 2^53) or a string of at most 200 characters'),
                ("pid", "a long string", "p" * 1000, f'{ev0}: "pid" is not an '
                 "integer (up to 2^53) or a string of at most 200 characters"),
                ("ts", "a string", "1", f'{ev0}: "ts" is not a number of '
                 "microseconds within 10^15"),
                ("ts", "1e300", 1e300, f'{ev0}: "ts" is not a number of '
                 "microseconds within 10^15"),
                ("dur", "missing", None, f'{ev0}: "dur" is not a number of '
                 "microseconds within 10^15"),
                ("dur", "negative", -1, f'{ev0}: "dur" is negative'),
                ("dur", "true", True, f'{ev0}: "dur" is not a number of '
                 "microseconds within 10^15"),
                ("name", "a list", ["matmul"], f'{ev0}: "name" is not a string'),
                ("args", "a list", [1], f'{ev0}: "args" is not an object')]:
            e = span()
            if value is None:
                del e[field]
            else:
                e[field] = value
            trace(f"{field} {label}", trace_json([e]), message)
        trace("ts NaN", None, f'{ev0}: "ts" is not a number of microseconds '
              "within 10^15", text='{"traceEvents":[{"ph":"X","pid":0,"tid":1,'
              '"ts":NaN,"dur":1}]}')
        trace("ts an integer of 5,000 digits", None, "'@' is not a trace: an "
              "integer of more than 4300 digits", text='{"traceEvents":[{"ph":'
              '"X","pid":0,"tid":1,"ts":' + "1" * 5000 + ',"dur":1}]}')
        trace("phase a list", trace_json([span(phase=["forward"])]),
              f'{ev0}: "args"."phase" is not a string')
        bad_name = thread_name(0, 1, ["step"])
        trace("thread name a list", trace_json([bad_name, span()]),
              f'{ev0}: a thread_name without an "args" object whose "name" is '
              "a string of at most 200 characters")
        bad_args = dict(thread_name(0, 1, "step"), args="step")
        trace("thread_name args a string", trace_json([bad_args, span()]),
              f'{ev0}: a thread_name without an "args" object whose "name" is '
              "a string of at most 200 characters")
        trace("no complete events", trace_json([thread_name(0, 1, "step")]),
              "'@' holds no complete events to draw")

        # Large inputs within the bounds still draw, in bounded time.
        path = p("large.jsonl")
        if not list_only:
            write(path, "".join(
                '{"step": %d, "loss": %s, "lr": 0.001, "grad_norm": NaN, '
                '"skipped": true}\n' % (s, "NaN" if s % 2 else "5.5")
                for s in range(200000)))
        h.case("fastllm-plot metrics: 200,000 skipped steps draw",
               [PLOT, "metrics", path, "-o", p("large.png"), "--print"], 0,
               None, [f"{path}: loss: 100000 points, 100000 not finite at "
                      "steps " + ",".join(map(str, range(1, 200000, 2))),
                      f"wrote '{p('large.png')}'"])
        big = p("dp100000.json")
        if not list_only:
            write(big, json.dumps(plan_json(plan_data_parallel=100000)))
        h.case("fastllm-plot memory: data_parallel 100,000 draws one bar",
               [PLOT, "memory", big, "-o", p("dp.png"), "--print"], 0, None,
               [f"{big}: each of 100000 ranks: frozen_parameters_bytes=0 "
                "weight_buffers_trainable_bytes=1000 gradient_buffers_bytes=1000 "
                "master_weights_shard_bytes=500 optimizer_shard_bytes=1000 "
                "gradient_shard_bytes=500 inputs_bytes=64 activations_bytes=4000 "
                "other_bytes=0 total=8064"])
        path = p("spans.trace.json")
        if not list_only:
            spans = [thread_name(r, t, n) for r in range(4)
                     for t, n in ((1, "step"), (2, "compute"))]
            spans += [span(pid=i % 4, tid=2, ts=i // 4, dur=0.5,
                           phase="forward" if i % 3 else "backward")
                      for i in range(300000)]
            write(path, json.dumps(trace_json(spans), separators=(",", ":")))
        h.case("fastllm-plot trace: 300,000 spans draw",
               [PLOT, "trace", path, "-o", p("spans.png"), "--print"], 0, None,
               [f"{path}: rank {r}: compute: 75000 spans, 37500.0 us"
                for r in range(4)])
        path = p("full.trace.json")
        if not list_only:  # 32 MiB: as many spans as fit, on 256 tracks
            with open(path, "w") as f:
                f.write('{"traceEvents":[')
                size, n = 20, 0
                while True:
                    e = ('{"ph":"X","pid":%d,"tid":%d,"ts":%d,"dur":1}'
                         % (n % 16, n // 16 % 16, n * 10))
                    if size + len(e) + 1 > 32 << 20:
                        break
                    f.write(("," if n else "") + e)
                    size, n = size + len(e) + 1, n + 1
                f.write("]}")
        h.case("fastllm-plot trace: a 32 MiB trace on 256 tracks draws",
               [PLOT, "trace", path, "-o", p("full.png")], 0, None,
               [f"wrote '{p('full.png')}'"])
        # Text from the inputs is drawn as text: '$' starts no math.
        if not list_only:
            shutil.copy(p("ok.jsonl"), p("run$^^$.jsonl"))
        h.case("fastllm-plot metrics: '$' in a file name and the title draws",
               [PLOT, "metrics", p("run$^^$.jsonl"), "-o", p("dollar.png"),
                "--title", "$\\rule{1}$ $^^^$"], 0, None,
               [f"wrote '{p('dollar.png')}'"])
        # Control characters in a title or a file name, and a name of
        # bytes that are not UTF-8, are drawn as U+FFFD: an SVG holding
        # them was no XML a viewer reads. A backend named in the
        # environment is not read (an unknown one raised at import).
        if not list_only:
            shutil.copy(p("ok.jsonl"), p("ctl\x01name.jsonl"))
            shutil.copy(p("ok.jsonl"), os.fsdecode(os.fsencode(p("")) + b"bad\xffname.jsonl"))
        h.case("fastllm-plot metrics: control characters draw into a well-formed SVG",
               [PLOT, "metrics", p("ctl\x01name.jsonl"),
                os.fsdecode(os.fsencode(p("")) + b"bad\xffname.jsonl"),
                "-o", p("ctl.svg"), "--title", "a\x01b\x1b[2J"], 0, None,
               [f"wrote '{p('ctl.svg')}'"])
        h.case("fastllm-plot metrics: that SVG parses as XML",
               [PY, "-c", "import sys, xml.dom.minidom as m; m.parse(sys.argv[1]); "
                "print('well-formed')", p("ctl.svg")], 0, None, ["well-formed"])
        h.case("fastllm-plot metrics: MPLBACKEND=bogus draws with Agg",
               ["env", "MPLBACKEND=bogus", PLOT, "metrics", p("ok.jsonl"), "-o",
                p("backend.png")], 0, None, [f"wrote '{p('backend.png')}'"])
        # Values an axis cannot span (-1e308..1e308 overflows matplotlib's
        # range arithmetic) are marked like NaN, and printed apart.
        path = p("extreme.jsonl")
        if not list_only:
            write(path, "".join(
                '{"step": %d, "loss": %s, "lr": %s, "grad_norm": %s}\n'
                % r for r in (
                    (1, "2.5", "1e-308", "1"), (2, "1e308", "5e-324", "1"),
                    (3, "-1e308", "1e250", "1e-300"),
                    (4, "-1e250", "1e-3", "Infinity"))))
        h.case("fastllm-plot metrics: losses of +-1e308 draw, marked",
               [PLOT, "metrics", path, "-o", p("extreme.png"), "--print"], 0,
               None, [f"{path}: loss: 2 points, 2 beyond 1e+250 in magnitude "
                      "at steps 2,3",
                      f"{path}: lr: 4 points",
                      f"{path}: grad_norm: 3 points, 1 not finite at steps 4"])
        # A title is drawn within the picture: a --title of 100,000
        # characters (matplotlib's raster overflowed) is refused; a default
        # title naming many files is cut short.
        h.plot_error("long-title", "metrics", p("ok.jsonl"),
                     "--title has 100000 characters in 1 lines; a title has "
                     "at most 400 in 4", ["--title", "t" * 100000])
        # The picture's pixels are bounded together, not only each flag
        # (100x100 inches at 600 dpi took 18 GB), and a side is at least an
        # inch (0.001 inch raised SystemError in PIL); a bad command line
        # exits 1 like any other error.
        h.plot_error("pixels", "metrics", p("ok.jsonl"),
                     "--size 100x100 at --dpi 600 is 60000 x 60000 pixels; a "
                     "picture has at most 40,000,000 (lower --dpi or --size)",
                     ["--size", "100x100", "--dpi", "600"])
        h.case("fastllm-plot metrics: --size 0.001x0.001",
               [PLOT, "metrics", p("ok.jsonl"), "-o", p("tiny.png"), "--size",
                "0.001x0.001"], 1, "fastllm-plot metrics: error: argument "
               "--size: the size is 1 to 100 inches a side", usage=True)
        many = [p("ok.jsonl")] * 300
        h.case("fastllm-plot metrics: 300 inputs draw under a short title",
               [PLOT, "metrics", *many, "-o", p("many.png")], 0, None,
               [f"wrote '{p('many.png')}'"])
        h.case("fastllm-plot metrics: a valid file still draws",
               [PLOT, "metrics", p("ok.jsonl"), "-o", p("ok.png"), "--print"],
               0, None, [f"{p('ok.jsonl')}: loss: 5 points"])

        # fastllm-plot finds fastllm_input.py beside itself (as installed:
        # PREFIX/bin holds both), also when run through a symlink; a copy
        # without it says so.
        alone, installed = p("alone"), p("prefix/bin")
        if not list_only:
            os.makedirs(alone)
            os.makedirs(installed)
            shutil.copy(PLOT, alone)
            shutil.copy(PLOT, installed)
            shutil.copy(os.path.join(os.path.dirname(os.path.realpath(PLOT)),
                                     "fastllm_input.py"), installed)
            os.symlink(os.path.join(installed, "fastllm-plot"), p("plot-link"))
        h.case("fastllm-plot: a copy without fastllm_input.py",
               [PY, os.path.join(alone, "fastllm-plot"), "metrics",
                p("ok.jsonl"), "-o", p("alone.png")], 1,
               "fastllm-plot: error: cannot import fastllm_input, which "
               f"belongs beside {os.path.realpath(alone)}/fastllm-plot: No "
               "module named 'fastllm_input'")
        h.case("fastllm-plot: an installed copy, through a symlink",
               [PY, p("plot-link"), "metrics", p("ok.jsonl"), "-o",
                p("installed.png")], 0, None, [f"wrote '{p('installed.png')}'"])

        # fastllm_weights: files.
        # Values the model's dtype cannot hold are refused, not turned into
        # inf or into floats from integers or booleans.
        bias = struct.pack("<2f", 0, 0)
        for name, dtype, values in (("f64 overflow", "F64", struct.pack("<4d", 1e300, 0, 0, 0)),
                                    ("int64 weight", "I64", struct.pack("<4q", 1, 0, 0, 0))):
            path = p(name.replace(" ", "-") + ".safetensors")
            if not list_only:
                safetensors(path, {"weight": {"dtype": dtype, "shape": [2, 2],
                                              "data_offsets": [0, 32]},
                                   "bias": {"dtype": "F32", "shape": [2],
                                            "data_offsets": [32, 40]}}, values + bias)
            h.weights_error(name, path, f"{path}: tensor 'weight' " + (
                "holds values beyond float32's range (they would become inf)"
                if dtype == "F64" else "is int64, the model's is float32: not converted"),
                what="load")
        h.weights_error("FIFO", fifo,
                        f"'{fifo}' is a FIFO (a named pipe), not a regular file")
        h.weights_error("/dev/zero", "/dev/zero",
                        "'/dev/zero' is a device, not a regular file")
        h.weights_error("folder", folder,
                        f"'{folder}' is a folder, not a regular file")
        h.weights_error("symlink to /dev/zero", p("zero-link"),
                        f"'{p('zero-link')}' is a device, not a regular file")
        h.weights_error("missing", p("none.safetensors"),
                        f"cannot read '{p('none.safetensors')}': it does not "
                        "exist")
        h.weights_error("8 GiB sparse file", p("sparse-weights"),
                        f"{p('sparse-weights')}: malformed safetensors header: "
                        "Expecting value (line 1, column 1)")

        # fastllm_weights: headers and tensors.
        def weights(name, header, message, data=b"", header_bytes=None):
            path = p(name.replace(" ", "-").replace("/", "-").replace(",", "")
                     + ".safetensors")
            if not list_only:
                safetensors(path, header, data, header_bytes)
            h.weights_error(name, path, message.replace("@", path))

        def entry(dtype="F32", shape=(2,), offsets=(0, 8)):
            return {"dtype": dtype, "shape": list(shape),
                    "data_offsets": list(offsets)}

        eight = b"\0" * 8
        if not list_only:
            write(p("short.safetensors"), b"\x01\x02")
        h.weights_error("too short", p("short.safetensors"),
                        f"{p('short.safetensors')}: not a safetensors file "
                        "(too short)")
        weights("header length 8 GiB", b"{}", "@: not a safetensors file "
                f"(header length {GIB8}, more than the 100 MiB allowed)",
                header_bytes=GIB8)
        weights("header length past the end", b"{}", "@: not a safetensors "
                "file (header length 100 does not fit its 10 bytes)",
                header_bytes=100)
        weights("50,000-deep header", b"[" * 50000 + b"]" * 50000,
                "@: malformed safetensors header: nested deeper than 64 levels")
        weights("truncated", {"x": entry(offsets=(0, 8))},
                "@: tensor 'x' has data_offsets [0, 8], not a range within "
                "the 4 data bytes", data=b"\0" * 4)
        weights("overlapping", {"x": entry(), "y": entry(shape=(1,),
                                                         offsets=(4, 8))},
                "@: tensors 'x' and 'y' overlap in the file (bytes 0..8 and "
                "4..8 of the data)", data=eight)
        weights("the same range twice", {"x": entry(), "y": entry()},
                "@: tensors 'x' and 'y' overlap in the file (bytes 0..8 and "
                "0..8 of the data)", data=eight)
        weights("offsets reversed", {"x": entry(offsets=(8, 0))},
                "@: tensor 'x' has data_offsets [8, 0], not a range within "
                "the 8 data bytes", data=eight)
        weights("offsets strings", {"x": entry(offsets=("0", "8"))},
                "@: tensor 'x' has data_offsets that are not two integers, not "
                "a range within the 8 data bytes", data=eight)
        weights("offsets missing", {"x": {"dtype": "F32", "shape": [2]}},
                "@: tensor 'x' has data_offsets that are not two integers, not "
                "a range within the 8 data bytes", data=eight)
        weights("dtype a list", {"x": entry(dtype=["F32"])},
                "@: tensor 'x' has dtype of type list, not one of ['BF16', "
                "'BOOL', 'F16', 'F32', 'F64', 'I16', 'I32', 'I64', 'I8', 'U8']",
                data=eight)
        weights("dtype unknown", {"x": entry(dtype="F8")},
                "@: tensor 'x' has dtype 'F8', not one of ['BF16', 'BOOL', "
                "'F16', 'F32', 'F64', 'I16', 'I32', 'I64', 'I8', 'U8']",
                data=eight)
        for label, shape in (("a string", "2"), ("negative", [-2]),
                             ("a float", [2.0]), ("33 dimensions", [1] * 33),
                             ("2^63", [1 << 63])):
            weights(f"shape {label}", {"x": dict(entry(), shape=shape)},
                    "@: tensor 'x' has no shape of at most 32 non-negative "
                    "integers (below 2^63)", data=eight)
        weights("an empty shape whose other dims overflow",
                {"x": entry(shape=(1 << 62, 1 << 62, 0), offsets=(0, 0))},
                "@: tensor 'x' has shape [4611686018427387904, "
                "4611686018427387904, 0], whose dims multiply past 2^63",
                data=eight)
        weights("elements and bytes differ", {"x": entry(shape=(3,))},
                "@: tensor 'x' has 8 data bytes, which do not hold F32 of "
                "shape [3]", data=eight)
        weights("32 dimensions of 2^62", {"x": entry(shape=[1 << 62] * 32)},
                "@: tensor 'x' has 8 data bytes, which do not hold F32 of "
                "shape [" + ", ".join([str(1 << 62)] * 32) + "]", data=eight)
        weights("an entry a list", {"x": [1]},
                "@: tensor 'x' is not a JSON object")
        weights("the header a list", [1],
                "@: the header is not a JSON object")
        weights("metadata not strings", {"__metadata__": {"a": 1}},
                "@: __metadata__ is not a JSON object of strings")
        weights("duplicate keys", b'{"x": 1, "x": 2}',
                "@: malformed safetensors header: duplicate key 'x'")
        # As train reads them (runtime/Safetensors.cpp): a name no UTF-8
        # holds, and an offset of -0, which int() would make 0.
        weights("a lone surrogate in a name", b'{"\\ud800x": 1}',
                "@: malformed safetensors header: a lone UTF-16 surrogate in "
                "'\\ud800x'")
        weights("an offset of -0",
                b'{"x": {"dtype": "F32", "shape": [0], "data_offsets": [-0, 0]}}',
                "@: malformed safetensors header: a negative zero (-0)")
        weights("not UTF-8", b'{"\xff": 1}',
                "@: malformed safetensors header: not UTF-8 text (byte 2)")
        weights("an integer of 5,000 digits",
                b'{"x": {"dtype": "F32", "shape": [' + b"9" * 5000
                + b'], "data_offsets": [0, 4]}}',
                "@: malformed safetensors header: an integer of more than "
                "4300 digits")
        weights("BOOL bytes other than 0 and 1",
                {"x": entry(dtype="BOOL", shape=(2,), offsets=(0, 2))},
                "@: tensor 'x' (BOOL) holds bytes other than 0 and 1",
                data=b"\x01\x07")
        many_tensors = {} if list_only else {
            f"t{i}": entry(shape=(0,), offsets=(0, 0))
            for i in range((1 << 18) + 1)}
        weights("262,145 tensors", many_tensors,
                "@: 262145 tensors, more than the 262144 read")
        # 100 MiB headers (the format's most) that Python's objects would
        # blow up to gigabytes: refused by counting before parsing.
        hundred = (100 << 20) - 16
        for label, unit, message in (
                ("empty arrays", b"[],", "more than 1048576 arrays and objects"),
                ("short strings", b'"ab",', "more than 4194304 values")):
            weights(f"a 100 MiB header of {label}",
                    b'{"x":[' + unit * (hundred // len(unit)) + b'0]}',
                    f"@: malformed safetensors header: {message}")
        long_name = "n" * 100000
        weights("a 100,000-character name",
                {long_name: entry(dtype=1)},
                f"@: tensor '{'n' * 200}'... has dtype of type int, not one of "
                "['BF16', 'BOOL', 'F16', 'F32', 'F64', 'I16', 'I32', 'I64', "
                "'I8', 'U8']")
        if not list_only:
            raw = struct.pack("<4f", 1, 2, 3, 4) + struct.pack("<2f", 5, 6)
            safetensors(p("linear.safetensors"),
                        {"__metadata__": {"format": "pt"},
                         "weight": entry(shape=(2, 2), offsets=(0, 16)),
                         "bias": entry(shape=(2,), offsets=(16, 24)),
                         "empty": entry(shape=(0, 3), offsets=(24, 24))}, raw)
        h.weights_error("initial= a FIFO", fifo, f"'{fifo}' is a FIFO (a named "
                        "pipe), not a regular file", what="initial",
                        model_file=p("linear.safetensors"))
        h.case("weights: a valid file still reads",
               [PY, "-c", WEIGHTS_DRIVER, TOOLS, "read",
                p("linear.safetensors")], 0, None,
               ["ok 3 tensors weight=[2, 2],bias=[2],empty=[0, 3]"])

        if list_only:
            return 0
        h.launcher.close()
        print(f"python tools hostile: {h.passed} passed, {h.failed} failed")
        return 1 if h.failed else 0


if __name__ == "__main__":
    sys.exit(main())
