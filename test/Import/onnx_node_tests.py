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
output tensor, then the VALUES, two ways wherever each can be done (see
"Values" below): folded by the importer with every input a constant, and run
by the CPU target's generated code with the float inputs as parameters.

Why
---
The importer computes every shape statically, op by op, and each converter
decides what an ONNX op means (attributes, broadcasting, negative axes,
keepdims, empty tensors, optional inputs...). The node tests cover the corner
cases our own exported models do not, and their expected outputs give the
right answer for free.

The supported-op set is parsed from the converter table (``kConverters`` at the
end of frontend/Converters.cpp), so it cannot drift from the importer.

Outcomes
--------
PASS  the import succeeded, every result matches its expected output's
      dims and element type, and every result's values were compared (folded,
      run, or both) within the bounds.
FAIL  the import failed (for a reason not listed under SKIP), crashed, a
      result's type or values differ; a skip that the expected-skip list
      (onnx_node_tests.skips) does not name, or names with another reason; a
      listed test that passes or does not exist; fewer passes than the list's
      ``passed:`` line.
SKIP  a reason the importer states itself, recognised from its error
      message (SKIP_PATTERNS: an opset or IR version outside the supported
      range, an element type with no mapping, a non-tensor input, a feature a
      converter documents as unsupported), or a result whose values neither
      way can produce; and only when the list names the test with that reason.
A last case checks the comparison itself: deliberately wrong values (an
element off by three times the bound, a NaN, an infinity, another shape, an
integer off by one) must fail it.

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
the worst value error of each way with its bound, and finally
``onnx node tests: P passed, F failed, S skipped``. Exits 1 if any
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

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_DATA = "/usr/share/libonnx-testdata/data/node"
DEFAULT_CONVERTERS = os.path.join(ROOT, "frontend", "Converters.cpp")
DEFAULT_IMPORTER_H = os.path.join(ROOT, "frontend", "OnnxImporter.h")
DEFAULT_TOOL = os.path.join(ROOT, "build", "bin", "fastllm-opt")
DEFAULT_SKIPS = os.path.join(HERE, "onnx_node_tests.skips")
sys.path.insert(0, os.path.join(ROOT, "test", "EndToEnd"))
from safetensors_file import read_safetensors  # noqa: E402

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


# Element types whose values the tests compare, as NumPy dtypes (an MLIR
# constant's hex form is its raw little-endian data; bf16 has no NumPy type).
NUMPY_DTYPE = {"f32": np.float32, "f64": np.float64, "f16": np.float16,
               "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8,
               "i1": np.bool_}

CONSTANT_RE = re.compile(
    r"^\s*(%[\w.$#-]+) = model\.constant (?:\{.*\} )?dense<(.*)> : (tensor<[^>]*>)\s*$",
    re.M)
RETURN_RE = re.compile(r"^\s*return\b([^:\n]*)", re.M)
NUMBER_RE = re.compile(r"0x[0-9A-Fa-f]+|true|false|[-+]?(?:inf|nan|\d+\.?\d*(?:[eE][-+]?\d+)?)")


def parse_dense(text, dims, elem):
    """The array of an MLIR `dense<TEXT>` of type tensor<DIMS x ELEM>: hex
    (`"0x..."`, raw data, one element for a splat) or literal (a scalar
    splat or nested lists; floats that print as hex are bit patterns)."""
    if elem == "bf16":  # the upper half of a float32
        bits = parse_dense(text, dims, "i16") if text.strip().startswith('"0x') else None
        if bits is None:
            raise ValueError("a bf16 constant printed without hex")
        return (bits.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)
    dtype = NUMPY_DTYPE.get(elem)
    if dtype is None:
        raise ValueError(f"no NumPy type for element type {elem}")
    count = int(np.prod(dims)) if dims else 1
    text = text.strip()
    if text.startswith('"0x'):
        raw = bytes.fromhex(text[3:-1])
        if dtype is np.bool_:
            if len(raw) == count:
                flat = np.frombuffer(raw, np.uint8) != 0
            elif len(raw) == 1:
                flat = np.full(count, raw[0] != 0)
            else:  # packed, one bit an element
                flat = np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")[:count] != 0
        else:
            flat = np.frombuffer(raw, dtype)
            if flat.size == 1 and count != 1:
                flat = np.full(count, flat[0], dtype)
    else:
        values = []
        for tok in NUMBER_RE.findall(text):
            if tok in ("true", "false"):
                values.append(tok == "true")
            elif tok.startswith("0x"):  # a float's bit pattern (NaN, inf)
                bits = np.array([int(tok, 16)], np.dtype(dtype).str.replace("f", "u"))
                values.append(bits.view(dtype)[0])
            else:
                values.append(float(tok) if np.issubdtype(dtype, np.floating) else int(tok))
        flat = np.array(values, dtype)
        if flat.size == 1 and count != 1:
            flat = np.full(count, flat[0], dtype)
    if flat.size != count:
        raise ValueError(f"{flat.size} values for {count} elements")
    return flat.reshape(dims)


def folded_results(ir):
    """[array or None] per result of func.func @forward: the value of each
    result the importer computed itself (a returned model.constant), None
    for one left to run time."""
    start = ir.find("func.func @forward(")
    if start < 0:
        raise ValueError("no func.func @forward in the output")
    # The body's brace ends its line; result attributes' braces do not.
    body_start = re.compile(r"\{[ \t]*\n").search(ir, start).start()
    body = ir[body_start:_matching(ir, body_start, "{", "}")]
    constants = {m.group(1): m for m in CONSTANT_RE.finditer(body)}
    ret = RETURN_RE.search(body)
    names = [v.strip() for v in ret.group(1).split(",")] if ret and ret.group(1).strip() else []
    out = []
    for name in names:
        m = constants.get(name)
        if m is None:
            out.append(None)
            continue
        dims, elem = parse_tensor_type(m.group(3))
        if "?" in dims:
            raise ValueError(f"constant {name} has a dynamic type")
        out.append(parse_dense(m.group(2), dims, elem))
    return out


def value_error(got, exp):
    """(problem or None, error): ERROR is max |got - exp| / max(1, |exp|)
    over the elements (0 for exact ones); a NaN where none is expected (or
    none where one is), another infinity, or a shape or integer mismatch is
    a PROBLEM, whatever the tolerance."""
    got, exp = np.asarray(got), np.asarray(exp)
    if got.shape != exp.shape:
        return f"shape {list(got.shape)}, expected {list(exp.shape)}", float("inf")
    if got.size == 0:
        return None, 0.0
    if not np.issubdtype(exp.dtype, np.floating):
        bad = np.flatnonzero(got.astype(exp.dtype) != exp)
        if bad.size:
            k = int(bad[0])
            return (f"{bad.size} of {exp.size} elements differ; first at "
                    f"{list(np.unravel_index(k, exp.shape))}: {got.flat[k]} "
                    f"where {exp.flat[k]} was expected"), float("inf")
        return None, 0.0
    g, e = got.astype(np.float64), exp.astype(np.float64)
    for what, mask in (("NaN", np.isnan), ("infinity", np.isinf)):
        differ = mask(g) != mask(e)
        if what == "infinity":
            both = np.isinf(g) & np.isinf(e)
            differ |= both & (np.sign(g) != np.sign(e))
        if differ.any():
            k = int(np.flatnonzero(differ)[0])
            return (f"{what} where it should not be (or missing) at "
                    f"{list(np.unravel_index(k, e.shape))}: got {g.flat[k]}, "
                    f"expected {e.flat[k]}"), float("inf")
    finite = np.isfinite(e)
    if not finite.any():
        return None, 0.0
    err = np.abs(g[finite] - e[finite]) / np.maximum(1.0, np.abs(e[finite]))
    return None, float(err.max())


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
        """The test's TensorProto for graph input `name` (by name, else
        position), typed as the graph declares a bfloat16 input (ONNX's
        test generator stores bfloat16 data as UINT16 bit patterns)."""
        t = next((t for t in self.inputs if t.name == name), None)
        inits = {t.name for t in self.graph.initializer}
        feeds = [i.name for i in self.graph.input if i.name not in inits]
        if t is None and name in feeds and feeds.index(name) < len(self.inputs):
            t = self.inputs[feeds.index(name)]
        declared = next((i.type.tensor_type.elem_type for i in self.graph.input
                         if i.name == name), None)
        if t is not None and t.data_type == onnx.TensorProto.UINT16 \
                and declared == onnx.TensorProto.BFLOAT16:
            bf16 = onnx.TensorProto()
            bf16.CopyFrom(t)
            bf16.data_type = onnx.TensorProto.BFLOAT16
            if not bf16.HasField("raw_data"):
                bf16.raw_data = np.array(t.int32_data, np.uint16).tobytes()
                del bf16.int32_data[:]
            t = bf16
        return t

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


def run_import(tool, model_path, timeout, extra=()):
    try:
        p = subprocess.run([tool, "import", model_path, *extra], capture_output=True,
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
    """Checks the result types of one test. Returns (status, detail, notes,
    model): MODEL is the test's model with the inputs the importer needs at
    import time frozen into Constant nodes, without the outputs the importer
    rejects (None unless the import passed, with those outputs or without)."""
    expected = test.expected()
    if expected is None:
        return "FAIL", "the test data lacks an expected output", [], None
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
        return ("FAIL", problem, notes, None) if problem else ("PASS", None, notes, model)

    for pattern, reason in SKIP_PATTERNS:
        m = re.search(pattern, err)
        if m:
            return "SKIP", reason.format(*m.groups(), opset=test.opset), notes, None
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
            return "SKIP", reason, notes, None
        reduced = onnx.ModelProto()
        reduced.CopyFrom(model)
        outs = [reduced.graph.output[i] for i in keep]
        del reduced.graph.output[:]
        reduced.graph.output.extend(outs)
        rpath = os.path.join(tmpdir, test.name + ".reduced.onnx")
        onnx.save(reduced, rpath)
        rir, rerr = run_import(tool, rpath, timeout)
        if rerr is not None:
            return "FAIL", (f"{err} -- and without those outputs: {rerr}"), notes, None
        problem = compare(rir, expected, keep)
        if problem:
            return "FAIL", f"without the unsupported outputs: {problem}", notes, None
        return "SKIP", reason + " (the other outputs' types: ok)", notes, reduced
    return "FAIL", err, notes, None


# --------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------
#
# A test whose types match has its values checked two ways, each where it
# can be:
#   folded  every input frozen into a Constant node: the importer computes
#           the result itself (the code that folds masks, position tables
#           and shape arithmetic) and returns it as a model.constant;
#   run     the float inputs become frozen parameters, so the importer leaves
#           the op to run time: the op is compiled for the CPU target inside
#           a training model whose loss adds sum(Y * P) for a parameter P per
#           output Y (cast to float32 first unless it is one), and
#           `train --dump-grads` writes dLoss/dP, which is Y as the generated
#           code computed it. Tests of one opset share one
#           model (one compile); a model that fails is split in halves until
#           the test that fails is found.
# Both are compared with ONNX's expected outputs: NaN and infinities where
# they are expected, integers exactly, floats within *_TOL of
# max |ours - expected| / max(1, |expected|). The bounds sit just above the
# worst error measured (printed at the end): FOLD_TOL for values computed in
# double and rounded once, RUN_TOL for float32 kernels.
FOLD_TOL = 3e-7
RUN_TOL = 1e-6

# Output types the run-time model reads, as float32 (a Cast first for the
# others: integers up to 2^24 and booleans are exact there).
RUN_OUTPUT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.BOOL,
                    onnx.TensorProto.INT32, onnx.TensorProto.INT64}

# The token path every run-time model needs to be a training model (the
# training contract: token ids that index an embedding, targets for a loss).
PROBE_VOCAB, PROBE_DIM, PROBE_SEQ = 8, 4, 4
FROZEN_PREFIX_RE = r"^n[0-9]+\."


def expected_arrays(test, model):
    """The expected arrays of MODEL's outputs (the test's, or some of them),
    in its order (bf16 as float32)."""
    out = []
    position = {o.name: i for i, o in enumerate(test.graph.output)}
    for o in model.graph.output:
        t = next((t for t in test.outputs if t.name == o.name), None)
        if t is None:
            t = test.outputs[position[o.name]]
        a = numpy_helper.to_array(t)
        if o.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16 and a.dtype == np.uint16:
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out.append(a)
    return out


def bf16_round_to_nearest_even(x):
    """float32 -> bfloat16 (as float32) rounded to nearest, ties to even."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def judge(test, j, got, expected, siblings=None):
    """(problem, error) of output J of TEST: value_error against the
    expected output, except where ONNX's test data holds one answer of
    several or a wrong one:
    - Dropout in training mode draws its mask from NumPy's generator in the
      test data and from Philox here: each element must be 0 or x / (1 -
      ratio), and both must occur;
    - Cast to bfloat16: ONNX 1.12's test data truncates float32 (its
      generator takes the upper 16 bits); the ONNX specification, PyTorch
      and the importer round to nearest even, so that is the reference."""
    node = test.graph.node[0]
    value = lambda k: (numpy_helper.to_array(test.input_value(node.input[k]))
                       if len(node.input) > k and node.input[k] else None)
    if node.op_type == "Dropout" and j == 0:
        training = value(2)
        if training is not None and bool(training):
            x = value(0).astype(np.float64)
            ratio = float(value(1)) if value(1) is not None else 0.5
            g = np.asarray(got, np.float64)
            kept = np.abs(g - x / (1 - ratio)) <= 1e-6 * np.maximum(1, np.abs(x / (1 - ratio)))
            dropped = g == 0
            if not (kept | dropped).all():
                k = int(np.flatnonzero(~(kept | dropped))[0])
                return (f"element {k} is {g.flat[k]}: neither 0 nor x / (1 - {ratio}) = "
                        f"{x.flat[k] / (1 - ratio)}"), float("inf")
            if 0 < ratio < 1 and x.size >= 32 and (dropped.all() or (~dropped).all()):
                return f"all {x.size} elements {'dropped' if dropped.all() else 'kept'}", \
                    float("inf")
            return None, 0.0
    if node.op_type == "Dropout" and j == 1 and siblings and 0 in siblings:
        training = value(2)
        if training is not None and bool(training):
            x = value(0)
            y = np.asarray(siblings[0]).reshape(x.shape)
            mask = np.asarray(got).reshape(x.shape).astype(np.float64)
            if not np.isin(mask, (0.0, 1.0)).all():
                return "the mask holds values other than true and false", float("inf")
            decided = x != 0
            wrong = decided & ((mask != 0) != (y != 0))
            if wrong.any():
                k = int(np.flatnonzero(wrong)[0])
                return (f"the mask says {'kept' if mask.flat[k] else 'dropped'} at {k} "
                        f"where the output is {y.flat[k]} (x {x.flat[k]})"), float("inf")
            return None, 0.0
    if node.op_type in ("Cast", "CastLike") and \
            test.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16 and \
            test.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
        expected = bf16_round_to_nearest_even(value(0))
    return value_error(got, expected)


def check_folded(test, model, tool, tmpdir, timeout):
    """{output index: (problem, error)} for the outputs the importer folds
    when every input is a Constant; {} when it folds none (or cannot take
    them all as constants)."""
    full = onnx.ModelProto()
    full.CopyFrom(model)
    names = [i.name for i in full.graph.input
             if i.name not in {t.name for t in full.graph.initializer}]
    if len(freeze_inputs(full, test, names)) != len(names):
        return {}
    path = os.path.join(tmpdir, test.name + ".constant.onnx")
    onnx.save(full, path)
    ir, err = run_import(tool, path, timeout,
                         ["--mlir-print-elementsattrs-with-hex-if-larger=0"])
    if err is not None:
        return {}
    try:
        folded = folded_results(ir)
    except ValueError as e:
        return {0: (f"cannot read the folded result: {e}", float("inf"))}
    expected = expected_arrays(test, model)
    if len(folded) != len(expected):
        return {}
    index = {o.name: i for i, o in enumerate(test.graph.output)}
    return {j: judge(test, index[model.graph.output[j].name], got, expected[j])
            for j, got in enumerate(folded) if got is not None}


class RunCase:
    """One test's share of a run-time model: its node(s), its inputs (floats
    as frozen parameters, the rest as Constant nodes) and a probe parameter
    per float output."""

    def __init__(self, test, model):
        self.test, self.model = test, model
        self.expected = expected_arrays(test, model)
        position = {o.name: i for i, o in enumerate(test.graph.output)}
        self.index = [position[o.name] for o in model.graph.output]  # in the test
        self.outputs = []  # graph output indices checked at run time
        for j, o in enumerate(model.graph.output):
            if o.type.tensor_type.elem_type in RUN_OUTPUT_TYPES and self.expected[j].size > 0:
                self.outputs.append(j)
        self.feeds = {}
        for i in model.graph.input:
            if i.name in {t.name for t in model.graph.initializer}:
                continue
            value = test.input_value(i.name)
            if value is None:
                self.outputs = []  # an input without a value: nothing to run
                break
            self.feeds[i.name] = value


def probe_model(cases, rng):
    """The training model holding CASES (one opset): loss = cross-entropy of
    the token path + sum over the cases' float outputs Y of sum(Y * P)."""
    nodes, inits = [], []
    terms = []
    for k, case in enumerate(cases):
        prefix = f"n{k}."

        def named(v, prefix=prefix):
            return prefix + v if v else v
        for name, value in case.feeds.items():
            value_copy = onnx.TensorProto()
            value_copy.CopyFrom(value)
            value_copy.name = named(name)
            if value.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE) \
                    and numpy_helper.to_array(value).size > 0:
                inits.append(value_copy)
            else:
                nodes.append(helper.make_node("Constant", [], [named(name)], value=value_copy))
        for t in case.model.graph.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(t)
            copy.name = named(t.name)
            inits.append(copy)
        for n in case.model.graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = named(n.name or n.op_type)
            copy.input[:] = [named(v) for v in n.input]
            copy.output[:] = [named(v) for v in n.output]
            nodes.append(copy)
        for j in case.outputs:
            y = named(case.model.graph.output[j].name)
            if case.model.graph.output[j].type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
                nodes.append(helper.make_node("Cast", [y], [y + ".f32"],
                                              to=onnx.TensorProto.FLOAT))
                y += ".f32"
            probe = f"probe{k}.{j}"
            inits.append(numpy_helper.from_array(
                rng.standard_normal(case.expected[j].shape).astype(np.float32), probe))
            nodes.append(helper.make_node("Mul", [y, probe], [probe + ".prod"]))
            nodes.append(helper.make_node("ReduceSum", [probe + ".prod"], [probe + ".term"],
                                          keepdims=0))
            terms.append(probe + ".term")
    inits.append(numpy_helper.from_array(
        rng.standard_normal((PROBE_VOCAB, PROBE_DIM)).astype(np.float32), "embedding"))
    inits.append(numpy_helper.from_array(
        rng.standard_normal((PROBE_DIM, PROBE_VOCAB)).astype(np.float32), "head"))
    nodes += [
        helper.make_node("Gather", ["embedding", "tokens"], ["x"]),
        helper.make_node("MatMul", ["x", "head"], ["logits"]),
        helper.make_node("Constant", [], ["flat_shape"],
                         value=numpy_helper.from_array(np.array([-1, PROBE_VOCAB], np.int64))),
        helper.make_node("Constant", [], ["flat_targets_shape"],
                         value=numpy_helper.from_array(np.array([-1], np.int64))),
        helper.make_node("Reshape", ["logits", "flat_shape"], ["logits2d"]),
        helper.make_node("Reshape", ["targets", "flat_targets_shape"], ["targets1d"]),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits2d", "targets1d"], ["ce"]),
    ]
    total = "ce"
    for k, term in enumerate(terms):
        nodes.append(helper.make_node("Add", [total, term], [f"partial{k}"]))
        total = f"partial{k}"
    nodes.append(helper.make_node("Identity", [total], ["loss"]))
    ids = [helper.make_tensor_value_info(n, onnx.TensorProto.INT64, [1, PROBE_SEQ])
           for n in ("tokens", "targets")]
    graph = helper.make_graph(nodes, "node_test_values", ids,
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                              inits)
    opset = cases[0].test.opset
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = max([RESTAMP_IR_VERSION] + [c.test.model.ir_version for c in cases])
    return model


def run_probe(cases, tool, tmpdir, timeout, label):
    """Compiles and runs one probe model. Returns ({case index: {output
    index: array}}, None) or (None, error)."""
    work = os.path.join(tmpdir, "run-" + label)
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "model.onnx")
    onnx.save(probe_model(cases, np.random.default_rng(len(cases))), path)
    tokens = os.path.join(work, "tokens.u16")
    (np.arange(64) % PROBE_VOCAB).astype(np.uint16).tofile(tokens)
    out = os.path.join(work, "out")
    grads = os.path.join(work, "grads.safetensors")
    steps = [[tool, "compile", path, "-o", out, "--batch-size", "1",
              "--seq-len", str(PROBE_SEQ), "--freeze", FROZEN_PREFIX_RE],
             [os.path.join(out, "train"), "--data", tokens, "--steps", "1",
              "--lr", "1e-3", "--sampler", "sequential", "--dump-grads", grads]]
    for argv in steps:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
        except subprocess.TimeoutExpired:
            return None, f"{os.path.basename(argv[0])} timed out after {timeout}s"
        if p.returncode != 0:
            what = "compile" if argv[0] == tool else "train"
            how = f"signal {-p.returncode}" if p.returncode < 0 else "failed"
            return None, f"{what} {how}: {first_error(p.stderr)}"
    dumped = read_safetensors(grads)
    got = {}
    for k, case in enumerate(cases):
        got[k] = {}
        for j in case.outputs:
            name = f"probe{k}.{j}"
            if name not in dumped:
                return None, f"train dumped no gradient for {name}"
            got[k][j] = dumped[name]
    return got, None


def check_run(cases, tool, tmpdir, timeout, label="all"):
    """{test name: ({output index: (problem, error)}, None) or (None,
    error)} for CASES of one opset, splitting a failing model in halves."""
    got, err = run_probe(cases, tool, tmpdir, timeout, label)
    if got is not None:
        return {c.test.name: ({j: judge(c.test, c.index[j],
                                        got[k][j].reshape(c.expected[j].shape),
                                        c.expected[j],
                                        {c.index[i]: got[k][i] for i in c.outputs})
                               for j in c.outputs}, None)
                for k, c in enumerate(cases)}
    if len(cases) == 1:
        return {cases[0].test.name: (None, err)}
    half = len(cases) // 2
    result = check_run(cases[:half], tool, tmpdir, timeout, label + "a")
    result.update(check_run(cases[half:], tool, tmpdir, timeout, label + "b"))
    return result


def check_values(passed, args, tmpdir):
    """Value checks for the tests whose types passed. Returns {test name:
    (status, detail)} and the worst errors {"folded": e, "run": e}."""
    def fold_one(item):
        test, model = item
        return test.name, check_folded(test, model, args.tool, tmpdir, args.timeout)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        folded = dict(pool.map(fold_one, passed))
    by_opset = collections.defaultdict(list)
    for test, model in passed:
        case = RunCase(test, model)
        if case.outputs:
            by_opset[test.opset].append(case)
    ran = {}
    for opset, cases in sorted(by_opset.items()):
        ran.update(check_run(cases, args.tool, tmpdir, args.compile_timeout, f"opset{opset}"))
    worst = {"folded": (0.0, ""), "run": (0.0, "")}
    outcome = {}
    for test, model in passed:
        outputs = [o.name for o in model.graph.output]
        f = folded.get(test.name, {})
        r, run_err = ran.get(test.name, ({}, None))
        r = r or {}
        problems, checked = [], []
        for how, results, tol in (("folded", f, FOLD_TOL), ("run", r, RUN_TOL)):
            for j, (problem, err) in sorted(results.items()):
                if problem is None and err > tol:
                    problem = f"error {err:.2e} > {tol:g}"
                if problem:
                    problems.append(f"{how} '{outputs[j]}': {problem}")
                elif err >= worst[how][0]:
                    worst[how] = (err, test.name)
            if results:
                checked.append(f"{how} {max(e for _, e in results.values()):.1e}")
        unchecked = [outputs[j] for j in range(len(outputs)) if j not in f and j not in r]
        if problems:
            outcome[test.name] = ("FAIL", "values: " + "; ".join(problems))
        elif unchecked:
            why = (f"cannot run on the CPU target: {run_err}" if run_err else
                   "neither folded at import time nor a float output the CPU target can run")
            outcome[test.name] = ("SKIP", f"values of {', '.join(unchecked)} unchecked: {why}"
                                  + (f" (checked: {', '.join(checked)})" if checked else ""))
        else:
            outcome[test.name] = ("PASS", "values (" + ", ".join(checked) + ")")
    return outcome, worst


def bounds_catch():
    """Problems with the comparison itself: each deliberately wrong result
    below must fail it (and the right one pass)."""
    exp = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    wrong = {
        "one element off by 3x RUN_TOL": exp * np.where(np.arange(24) == 23, 1 + 3 * RUN_TOL, 1)
        .reshape(exp.shape).astype(np.float32),
        "a NaN": np.where(np.arange(24) == 5, np.nan, exp.ravel()).reshape(exp.shape),
        "an infinity": np.where(np.arange(24) == 3, np.inf, exp.ravel()).reshape(exp.shape),
        "another shape": exp.reshape(6, 4),
    }
    problems = [what for what, got in wrong.items()
                if value_error(got, exp)[0] is None and value_error(got, exp)[1] <= RUN_TOL]
    ints = np.arange(6)
    if value_error(ints + (ints == 2), ints)[0] is None:
        problems.append("an integer off by one")
    if value_error(exp.copy(), exp) != (None, 0.0):
        problems.append("the right values")
    return problems


def read_skip_list(path):
    """(minimum passes, {test name: reason}) of the expected-skip list."""
    minimum, skips = None, {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            key, sep, value = line.partition(":")
            if not sep:
                sys.exit(f"{path}:{number}: expected 'NAME: REASON' or 'passed: N'")
            if key.strip() == "passed":
                minimum = int(value)
            else:
                skips[key.strip()] = value.strip()
    if minimum is None:
        sys.exit(f"{path}: no 'passed: N' line (the fewest passes accepted)")
    return minimum, skips


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
            lambda t: (t,) + run_test(t, args.tool, tmpdir, args.timeout)[:3], tests))


def run_all_models(tests, args, tmpdir):
    """run_all's results with each test's frozen model (for the values)."""
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        return list(pool.map(
            lambda t: (t,) + run_test(t, args.tool, tmpdir, args.timeout), tests))


def apply_skip_list(results, skips, minimum, list_path):
    """The results with the expected-skip list applied: a skip it does not
    name, a test it names that passes, and a name that matches no test are
    failures, and so is a pass count below its minimum (reported as a case of
    its own)."""
    out = []
    name = os.path.relpath(list_path, ROOT)
    for test, status, detail, notes in results:
        listed = skips.get(test.name)
        if status == "SKIP" and listed is None:
            status, detail = "FAIL", f"unexpected skip (not in {name}): {detail}"
        elif status == "SKIP" and listed.split(";")[0].strip() not in detail:
            status, detail = "FAIL", (f"skipped for another reason than {name} gives "
                                      f"({listed}): {detail}")
        elif status == "PASS" and listed is not None:
            status, detail = "FAIL", (f"passes, but {name} lists it as an expected skip "
                                      f"({listed}): remove that line")
        out.append((test, status, detail, notes))
    return out


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
    ap.add_argument("--compile-timeout", type=int, default=600,
                    help="seconds for compiling or running one value model")
    ap.add_argument("--skips", default=DEFAULT_SKIPS,
                    help="the expected-skip list: 'NAME: REASON' lines and "
                         "'passed: N', the fewest passes accepted")
    ap.add_argument("--types-only", action="store_true",
                    help="check result types only, not values (debugging)")
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

    minimum, skips = read_skip_list(args.skips)

    with tempfile.TemporaryDirectory(prefix="onnx-node-tests-") as tmpdir:
        typed = run_all_models(single, args, tmpdir)
        results = [(t, status, detail, notes) for t, status, detail, notes, _ in typed]
        worst = None
        if not args.types_only:
            imported = [(t, model) for t, _, _, _, model in typed if model is not None]
            values, worst = check_values(imported, args, tmpdir)

            def merged(t, status, detail, notes):
                if t.name not in values:
                    return t, status, detail, notes
                vstatus, vdetail = values[t.name]
                if status == "PASS" or vstatus == "FAIL":
                    return t, vstatus, ("types and " if vstatus == "PASS" else "") + vdetail, notes
                # A SKIP stays one, its reason as it was; the values checked
                # go to the notes (-v).
                return t, status, detail, notes + [f"the other outputs' {vdetail}"]
            results = [merged(*r) for r in results]
        results = apply_skip_list(results, skips, minimum, args.skips)
        counts = report(results, "single-node tests", args.verbose)
        if not args.types_only:
            wrongly = bounds_catch()
            print(("FAIL" if wrongly else "PASS") + " value bounds catch wrong values"
                  + (": these passed: " + ", ".join(wrongly) if wrongly else
                     f" (a {3 * RUN_TOL:g} error of an element of 3, a NaN, an infinity, "
                     "another shape, an integer off by one)"))
            counts["FAIL" if wrongly else "PASS"] += 1
        if not args.filter:
            ran = {t.name for t in single}
            for name in sorted(set(skips) - ran):
                print(f"FAIL {name}: listed in {os.path.relpath(args.skips, ROOT)} "
                      "but no such test ran (remove the line)")
                counts["FAIL"] += 1
            if counts["PASS"] < minimum:
                print(f"FAIL pass count: {counts['PASS']} tests passed, fewer than the "
                      f"{minimum} {os.path.relpath(args.skips, ROOT)} expects")
                counts["FAIL"] += 1
        if worst:
            for how, (err, name) in worst.items():
                print(f"worst {how} value error: {err:.2e} ({name or 'none'}; bound "
                      f"{FOLD_TOL if how == 'folded' else RUN_TOL:g})")
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
