#!/usr/bin/python3
# REQUIRES: onnx, onnx-testdata
# RUN: %python %s --tool fastllm-opt -v
"""Check `fastllm-opt import` against ONNX's own operator (node) tests.

What
----
Debian's libonnx-testdata ships ONNX's backend node tests:
``/usr/share/libonnx-testdata/data/node/test_*/`` each holding a one-node
``model.onnx`` and ``test_data_set_0/{input_N,output_N}.pb``. For every test
whose single node is an op the importer has a converter for, this script
imports the model with ``fastllm-opt import`` and compares each result type
of ``func.func @forward`` (dims and element type) with the test's expected
output tensor.

Why
---
The importer computes every shape statically, op by op. The node tests cover
the attribute and broadcasting corner cases of each ONNX op (negative axes,
keepdims, empty tensors, optional inputs...) that our own exported models do
not, and their expected outputs give the right answer for free.

The supported-op set is parsed from the converter table (``kConverters`` at the
end of frontend/Converters.cpp), so it cannot drift from the importer.

Outcomes
--------
PASS  the import succeeded and every result matches its expected output's
      dims and element type.
FAIL  the import failed (for a reason not listed under SKIP), crashed, or a
      result's type differs from the expected output.
SKIP  only for a reason the importer states itself, recognised from its error
      message (see SKIP_PATTERNS): an opset or ONNX IR version outside the
      supported range, an element type the importer has no mapping for
      (uint8, string, ...) or a non-tensor (sequence, optional) input, or a
      feature a converter documents as unsupported
      (loss class weights, negative-step slices of runtime tensors,
      LayerNormalization's Mean/InvStdDev outputs).

Two adaptations make the node tests fit a static-shape importer; both are
driven by the importer's own error messages, never by a list of test names:

* Operands that must be known at import time. The node tests feed every
  operand as a graph input, including the ones that decide a result's shape
  (Reshape's ``shape``, Slice's ``starts``, Unsqueeze's ``axes``...). A real
  exported model has them as constants, and the importer says
  ``... (input 'NAME') must be known at import time``. The graph inputs NAME
  is computed from (NAME itself in a one-node test) are then replaced by
  Constant nodes holding the test's values for them and the import is
  retried, as often as needed. Such tests are still PASS/FAIL; the frozen
  inputs are shown with ``-v``.
* Unsupported optional outputs. When the importer rejects an optional output
  (``the Mean and InvStdDev outputs are not supported``), the test is SKIP, but the remaining outputs
  are still checked on a copy of the model whose graph no longer lists the
  rejected ones: if that reduced import fails or gives a wrong type the test
  is a FAIL instead, since those outputs are supported.

Two opt-in extras are reported on their own lines and do not change the exit
status: ``--expanded`` also runs the multi-node tests (mostly the
``*_expanded`` function bodies) whose every op is supported; ``--restamp``
reruns the tests skipped for an old opset with the model re-stamped to the
lowest supported opset, for those whose ops have the same definition (schema
version) there, which covers ops (And, Or, Not, Sin, Cos, Range,
ConstantOfShape...) whose only node tests are older than opset 13.

Usage (system interpreter; Debian python3-onnx)::

    /usr/bin/python3 test/Import/onnx_node_tests.py --tool build/bin/fastllm-opt

Prints one line per non-passing test (all tests with ``-v``), per-op counts,
and finally ``onnx node tests: P passed, F failed, S skipped``. Exits 1 if any
test failed, unless ``--report-only``.
"""

import argparse
import collections
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

import onnx
from onnx import defs, helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_DATA = "/usr/share/libonnx-testdata/data/node"
DEFAULT_CONVERTERS = os.path.join(ROOT, "frontend", "Converters.cpp")
DEFAULT_IMPORTER_H = os.path.join(ROOT, "frontend", "OnnxImporter.h")
DEFAULT_TOOL = os.path.join(ROOT, "build", "bin", "fastllm-opt")

# ONNX TensorProto data types -> the MLIR element type the importer uses
# (convertOnnxElementType in frontend/TensorProtos.cpp). Others are printed
# by their ONNX name, so a test expecting one can never match.
MLIR_ELEMENT_TYPE = {
    onnx.TensorProto.FLOAT: "f32",
    onnx.TensorProto.DOUBLE: "f64",
    onnx.TensorProto.FLOAT16: "f16",
    onnx.TensorProto.BFLOAT16: "bf16",
    onnx.TensorProto.INT64: "i64",
    onnx.TensorProto.INT32: "i32",
    onnx.TensorProto.INT8: "i8",
    onnx.TensorProto.BOOL: "i1",
}

# Importer error messages that make a test SKIP: (regex, reason). Each one is
# a limitation the importer states on purpose (see the quoted source).
SKIP_PATTERNS = [
    # GraphImporter.cpp checkVersions
    (r"unsupported opset version (\d+) \(supported: (\d+) to (\d+)\)",
     "opset {0} outside {1}..{2}"),
    (r"unsupported ONNX IR version (\d+) \(supported: (\d+) to (\d+)\)",
     "ONNX IR version {0} outside {1}..{2} (opset {opset})"),
    # GraphImporter.cpp inputType: sequence and optional types
    (r"graph input '[^']*' is not a tensor",
     "non-tensor (sequence/optional) input unsupported"),
    # TensorProtos.cpp tensorProtoType, GraphImporter.cpp inputType, ConvertElementwise.cpp convertCast
    (r"unsupported element type (\w+)", "element type {0} unsupported"),
    # ConvertLosses.cpp convertLoss, ConvertDataMovement.cpp convertSlice
    (r"class weights are not supported", "loss class weights unsupported"),
    (r"negative steps are only supported on values known at import time",
     "negative-step slice of a runtime tensor unsupported"),
]

# Optional outputs a converter rejects: (regex, reason, output indices). The
# test is SKIP; the other outputs are still checked (see the docstring).
UNSUPPORTED_OUTPUT_PATTERNS = [
    (r"the Mean and InvStdDev outputs are not supported",
     "LayerNormalization Mean/InvStdDev outputs unsupported", (1, 2)),
]

# The IR version a re-stamped model (--restamp) gets at least: ONNX 1.8's,
# the first with opset 13.
RESTAMP_IR_VERSION = 7

# NodeImporter::requireHostInput.
HOST_INPUT_RE = re.compile(r"\(input '([^']*)'\) must be known at import time")

ERROR_RE = re.compile(r"error: (.*)")


# --------------------------------------------------------------------------
# Supported ops
# --------------------------------------------------------------------------

def supported_ops(converters_cpp):
    """Op types of the kConverters table in frontend/Converters.cpp."""
    with open(converters_cpp) as f:
        src = f.read()
    m = re.search(r"kConverters\[\]\s*=\s*\{(.*?)\n\};", src, re.S)
    if not m:
        sys.exit(f"{converters_cpp}: cannot find the kConverters table")
    ops = set(re.findall(r'\{\s*"(\w+)"\s*,\s*\d+\s*,', m.group(1)))
    if not ops:
        sys.exit(f"{converters_cpp}: the kConverters table has no entries")
    return ops


# --------------------------------------------------------------------------
# Reading fastllm-opt's output
# --------------------------------------------------------------------------

def _matching(text, i, open_ch, close_ch):
    """Index just past the bracket closing text[i] (== open_ch); skips strings."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced '{open_ch}'")


def _split_top_level(text):
    """Splits at commas outside (), <>, [], {} and strings."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "(<[{":
            depth += 1
        elif c in ")>]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    tail = text[start:]
    if tail.strip():
        parts.append(tail)
    return [p.strip() for p in parts]


def parse_tensor_type(text):
    """'tensor<3x?x5xf32>' -> ([3, '?', 5], 'f32'); 'tensor<f32>' -> ([], 'f32')."""
    m = re.fullmatch(r"tensor<((?:(?:\d+|\?)x)*)([^,>]+)(?:,[^>]*)?>", text.strip())
    if not m:
        raise ValueError(f"not a ranked tensor type: {text!r}")
    dims = [d if d == "?" else int(d) for d in m.group(1).split("x")[:-1]]
    return dims, m.group(2).strip()


def forward_results(ir):
    """[(dims, element_type, name_or_None)] of func.func @forward's results."""
    start = ir.find("func.func @forward(")
    if start < 0:
        raise ValueError("no func.func @forward in the output")
    i = _matching(ir, start + len("func.func @forward"), "(", ")")
    rest = ir[i:].lstrip()
    if not rest.startswith("->"):
        return []  # no results
    rest = rest[2:].lstrip()
    if rest.startswith("("):
        end = _matching(rest, 0, "(", ")")
        items = _split_top_level(rest[1:end - 1])
    else:  # a single result printed without parentheses
        end = _matching(rest, rest.index("<"), "<", ">")
        items = [rest[:end]]
    results = []
    for item in items:
        m = re.match(r"(tensor<)", item)
        if not m:
            raise ValueError(f"result is not a tensor: {item!r}")
        tend = _matching(item, len("tensor"), "<", ">")
        dims, elem = parse_tensor_type(item[:tend])
        name = re.search(r'model\.name\s*=\s*"((?:[^"\\]|\\.)*)"', item[tend:])
        results.append((dims, elem, name.group(1) if name else None))
    return results


def first_error(stderr):
    """The first `error: ...` message of fastllm-opt, else its last line."""
    m = ERROR_RE.search(stderr)
    if m:
        return m.group(1).strip()
    lines = stderr.strip().splitlines()
    return lines[-1].strip() if lines else "(failed without a message)"


# --------------------------------------------------------------------------
# One test
# --------------------------------------------------------------------------

def fmt_type(dims, elem):
    return "tensor<" + "".join(f"{d}x" for d in dims) + elem + ">"


def elem_name(data_type):
    return MLIR_ELEMENT_TYPE.get(
        data_type, onnx.TensorProto.DataType.Name(data_type)
        if data_type in onnx.TensorProto.DataType.values() else str(data_type))


class NodeTest:
    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)
        self.model_path = os.path.join(path, "model.onnx")
        self.model = onnx.load(self.model_path)
        self.graph = self.model.graph
        self.op_types = [n.op_type for n in self.graph.node]
        self.opset = next((o.version for o in self.model.opset_import
                           if o.domain in ("", "ai.onnx")), None)
        data = os.path.join(path, "test_data_set_0")
        self.inputs = self._load(data, "input")
        self.outputs = self._load(data, "output")

    @staticmethod
    def _load(data, prefix):
        out, i = [], 0
        while os.path.exists(os.path.join(data, f"{prefix}_{i}.pb")):
            out.append(onnx.load_tensor(os.path.join(data, f"{prefix}_{i}.pb")))
            i += 1
        return out

    def input_value(self, name):
        """The test's TensorProto for graph input `name` (by name, else position)."""
        for t in self.inputs:
            if t.name == name:
                return t
        inits = {t.name for t in self.graph.initializer}
        feeds = [i.name for i in self.graph.input if i.name not in inits]
        if name in feeds and feeds.index(name) < len(self.inputs):
            return self.inputs[feeds.index(name)]
        return None

    def expected(self):
        """[(dims, element_type, name)] of the expected outputs, graph order."""
        exp = []
        for i, out in enumerate(self.graph.output):
            t = next((t for t in self.outputs if t.name == out.name), None)
            if t is None and i < len(self.outputs):
                t = self.outputs[i]
            if t is None:
                return None
            elem = elem_name(t.data_type)
            # NumPy has no bfloat16: ONNX's test generator stores bfloat16
            # outputs as UINT16 bit patterns; the model declares BFLOAT16.
            if (t.data_type == onnx.TensorProto.UINT16 and
                    out.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16):
                elem = "bf16"
            exp.append((list(t.dims), elem, out.name))
        return exp


def run_import(tool, model_path, timeout):
    try:
        p = subprocess.run([tool, "import", model_path], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s"
    if p.returncode < 0:
        return None, f"crashed with signal {-p.returncode}: " + \
            p.stderr.strip()[-500:]
    if p.returncode != 0:
        return None, first_error(p.stderr)
    return p.stdout, None


def compare(ir, expected, keep_outputs=None):
    """None when every kept result matches, else a description of the first
    mismatch. keep_outputs: indices of the graph outputs that are present."""
    try:
        got = forward_results(ir)
    except ValueError as e:
        return f"cannot read the IR: {e}"
    if keep_outputs is not None:
        expected = [expected[i] for i in keep_outputs]
    if len(got) != len(expected):
        return (f"{len(got)} results, expected {len(expected)}: got "
                + ", ".join(fmt_type(d, e) for d, e, _ in got))
    problems = []
    for (gd, ge, gname), (ed, ee, ename) in zip(got, expected):
        if gname is not None and gname != ename:
            problems.append(f"result '{gname}' where '{ename}' was expected")
        elif (gd, ge) != (ed, ee):
            problems.append(f"'{ename}': expected {fmt_type(ed, ee)}, "
                            f"got {fmt_type(gd, ge)}")
    return "; ".join(problems) or None


def feeding_inputs(graph, name):
    """The graph inputs that value `name` is computed from (itself included)."""
    inputs = {i.name for i in graph.input}
    producer = {o: n for n in graph.node for o in n.output}
    found, seen, work = [], set(), [name]
    while work:
        v = work.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in inputs:
            found.append(v)
        elif v in producer:
            work.extend(x for x in producer[v].input if x)
    return sorted(found)


def freeze_inputs(model, test, names):
    """Replaces the graph inputs `names` by Constant nodes holding the test's
    values for them; returns the names frozen.

    Constant nodes, not initializers: the importer evaluates Constant nodes
    at import time whatever their type, while it makes every float
    initializer a trainable model.parameter."""
    values = {n: test.input_value(n) for n in names}
    values = {n: v for n, v in values.items() if v is not None}
    if not values:
        return []
    keep = [i for i in model.graph.input if i.name not in values]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    nodes = []
    for name, value in sorted(values.items()):
        tensor = onnx.TensorProto()
        tensor.CopyFrom(value)
        tensor.name = name
        nodes.append(helper.make_node("Constant", [], [name],
                                           name=f"frozen_{name}", value=tensor))
    nodes += list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return sorted(values)


def run_test(test, tool, tmpdir, timeout):
    """Returns (status, detail, notes) for one test."""
    expected = test.expected()
    if expected is None:
        return "FAIL", "the test data lacks an expected output", []
    model = onnx.ModelProto()
    model.CopyFrom(test.model)
    frozen, notes = [], []
    path = os.path.join(tmpdir, test.name + ".frozen.onnx")
    src = test.model_path
    while True:
        ir, err = run_import(tool, src, timeout)
        if err is None:
            break
        m = HOST_INPUT_RE.search(err)
        new = m and freeze_inputs(model, test,
                                  feeding_inputs(model.graph, m.group(1)))
        if not new:
            break
        frozen += new
        onnx.save(model, path)
        src = path
    if frozen:
        notes.append("frozen inputs: " + ", ".join(frozen))
    if err is None:
        problem = compare(ir, expected)
        return ("FAIL", problem, notes) if problem else ("PASS", None, notes)

    for pattern, reason in SKIP_PATTERNS:
        m = re.search(pattern, err)
        if m:
            return "SKIP", reason.format(*m.groups(), opset=test.opset), notes
    for pattern, reason, drop in UNSUPPORTED_OUTPUT_PATTERNS:
        if not re.search(pattern, err):
            continue
        # Check the outputs that remain supported on a reduced copy.
        node_outputs = list(test.graph.node[0].output) \
            if len(test.graph.node) == 1 else []
        dropped = {node_outputs[i] for i in drop if i < len(node_outputs)}
        keep = [i for i, o in enumerate(model.graph.output)
                if o.name not in dropped]
        if not dropped or len(keep) == len(model.graph.output) or not keep:
            return "SKIP", reason, notes
        reduced = onnx.ModelProto()
        reduced.CopyFrom(model)
        outs = [reduced.graph.output[i] for i in keep]
        del reduced.graph.output[:]
        reduced.graph.output.extend(outs)
        rpath = os.path.join(tmpdir, test.name + ".reduced.onnx")
        onnx.save(reduced, rpath)
        rir, rerr = run_import(tool, rpath, timeout)
        if rerr is not None:
            return "FAIL", (f"{err} -- and without those outputs: {rerr}"), notes
        problem = compare(rir, expected, keep)
        if problem:
            return "FAIL", f"without the unsupported outputs: {problem}", notes
        return "SKIP", reason + " (other outputs checked: ok)", notes
    return "FAIL", err, notes


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------

def collect(data_dir, ops, expanded, only):
    single, multi = [], []
    for name in sorted(os.listdir(data_dir)):
        path = os.path.join(data_dir, name)
        if not name.startswith("test_") or \
                not os.path.exists(os.path.join(path, "model.onnx")):
            continue
        if only and not re.search(only, name):
            continue
        test = NodeTest(path)
        if not test.op_types or not set(test.op_types) <= ops:
            continue
        if len(test.op_types) == 1:
            single.append(test)
        elif expanded:
            multi.append(test)
    return single, multi


def restamp(test, opset, tmpdir):
    """A copy of `test` whose model claims `opset` instead of its own older
    one, or None unless every node's op has the same definition (schema
    since_version) at both opsets, i.e. unless the model means the same."""
    if test.opset is None or test.opset >= opset:
        return None
    for node in test.graph.node:
        try:
            old = defs.get_schema(node.op_type, test.opset, node.domain)
            new = defs.get_schema(node.op_type, opset, node.domain)
        except defs.SchemaError:
            return None
        if old.since_version != new.since_version:
            return None
    copy = NodeTest.__new__(NodeTest)
    copy.__dict__.update(test.__dict__)
    copy.model = onnx.ModelProto()
    copy.model.CopyFrom(test.model)
    copy.graph = copy.model.graph
    for o in copy.model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = opset
    copy.model.ir_version = max(copy.model.ir_version, RESTAMP_IR_VERSION)
    copy.opset = opset
    copy.model_path = os.path.join(tmpdir, test.name + ".restamped.onnx")
    onnx.save(copy.model, copy.model_path)
    return copy


def min_opset(importer_h):
    """kMinOpset of frontend/OnnxImporter.h."""
    with open(importer_h) as f:
        m = re.search(r"kMinOpset\s*=\s*(\d+)", f.read())
    if not m:
        sys.exit(f"{importer_h}: cannot find kMinOpset")
    return int(m.group(1))


def run_all(tests, args, tmpdir):
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        return list(pool.map(
            lambda t: (t,) + run_test(t, args.tool, tmpdir, args.timeout), tests))


def report(results, title, verbose):
    counts = collections.Counter()
    per_op = collections.defaultdict(collections.Counter)
    for test, status, detail, notes in results:
        counts[status] += 1
        op = test.op_types[0] if len(test.op_types) == 1 else "(multi-node)"
        per_op[op][status] += 1
        if verbose or status != "PASS":
            line = f"{status} {test.name}"
            if detail:
                line += f": {detail}"
            if notes and verbose:
                line += f" [{'; '.join(notes)}]"
            print(line)
    print(f"\nper op ({title}):")
    width = max((len(op) for op in per_op), default=0)
    for op in sorted(per_op):
        c = per_op[op]
        print(f"  {op:<{width}}  {c['PASS']:3d} passed  {c['FAIL']:3d} failed"
              f"  {c['SKIP']:3d} skipped")
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Import ONNX's node tests with fastllm-opt and compare the "
                    "result shapes and element types with the expected outputs.")
    ap.add_argument("--tool", default=DEFAULT_TOOL, help="fastllm-opt binary")
    ap.add_argument("--data", default=DEFAULT_DATA,
                    help="directory of the test_* node tests")
    ap.add_argument("--converters", default=DEFAULT_CONVERTERS,
                    help="Converters.cpp holding the kConverters table")
    ap.add_argument("--filter", default=None,
                    help="only tests whose name matches this regex")
    ap.add_argument("--expanded", action="store_true",
                    help="also run multi-node tests made only of supported "
                         "ops (reported separately; not in the exit status)")
    ap.add_argument("--restamp", action="store_true",
                    help="also rerun the tests skipped for an old opset with "
                         "the model re-stamped to the lowest supported opset, "
                         "where its ops are defined the same there (reported "
                         "separately; not in the exit status)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=int, default=60,
                    help="seconds per import")
    ap.add_argument("--report-only", action="store_true",
                    help="exit 0 even when tests fail")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print every test, with the inputs frozen")
    args = ap.parse_args(argv)

    if not os.access(args.tool, os.X_OK):
        sys.exit(f"onnx_node_tests.py: {args.tool} is not an executable")
    if not os.path.isdir(args.data):
        sys.exit(f"onnx_node_tests.py: no node tests in {args.data}")
    ops = supported_ops(args.converters)
    single, multi = collect(args.data, ops, args.expanded, args.filter)

    with tempfile.TemporaryDirectory(prefix="onnx-node-tests-") as tmpdir:
        results = run_all(single, args, tmpdir)
        counts = report(results, "single-node tests", args.verbose)
        if multi:
            print()
            mcounts = report(run_all(multi, args, tmpdir),
                             "multi-node tests, informational", args.verbose)
            print(f"onnx multi-node tests (informational): {mcounts['PASS']} "
                  f"passed, {mcounts['FAIL']} failed, {mcounts['SKIP']} skipped")
        if args.restamp:
            opset = min_opset(DEFAULT_IMPORTER_H)
            old = [t for t, status, detail, _ in results
                   if status == "SKIP" and "opset" in detail]
            copies = [c for c in (restamp(t, opset, tmpdir) for t in old) if c]
            print()
            rcounts = report(run_all(copies, args, tmpdir),
                             f"old-opset tests re-stamped to opset {opset}, "
                             "informational", args.verbose)
            print(f"onnx re-stamped tests (informational): {rcounts['PASS']} "
                  f"passed, {rcounts['FAIL']} failed, {rcounts['SKIP']} skipped "
                  f"(of {len(old)} old-opset tests, {len(old) - len(copies)} "
                  "not re-stampable)")

    print(f"onnx node tests: {counts['PASS']} passed, {counts['FAIL']} failed, "
          f"{counts['SKIP']} skipped")
    return 1 if counts["FAIL"] and not args.report_only else 0


if __name__ == "__main__":
    sys.exit(main())
