#!/usr/bin/python3
# REQUIRES: torch, onnx
# RUN: %python %s --tool fastllm-opt
"""End-to-end check: PyTorch exports of GPT-2 / Llama through `fastllm-opt import`.

What
----
Exports small seeded models with test/models/export_models.py in the ways
``torch.onnx.export`` can shape the graph (GELU via erf or tanh, constant
folding on and off, opsets 13, 14 and 17), imports each one with::

    fastllm-opt import X.onnx --bind-dim batch=4 --bind-dim seq=16

and checks the result:

* the import exits 0;
* every tensor type in the IR is static (no ``?`` or ``*`` in a ``tensor<>``);
* the only ops are builtin.module, func.func, func.return and model dialect
  ops named in ir/ModelOps.td: nothing of the ONNX shape computations
  (Shape, Gather of shapes, Concat of dims, ...) may survive the import;
* every @forward argument is ``tensor<4x16xi64>``, and its one result is the
  scalar f32 ``loss``;
* the ``model.parameter`` declarations are exactly the graph's float
  initializers (export_models.py's ``param_names``), a folded transposed
  Linear weight (``onnx::MatMul_N``) under its PyTorch parameter's name
  instead (the importer names it after the module; export_models.py's
  ``param_map`` says which PyTorch parameter it holds), and their element
  count sums to its ``trainable_params`` (the tied GPT-2 embedding/head once).

* the printed IR parses back (``fastllm-opt OUT.mlir``), so what ``import``
  writes is what the rest of the pipeline can read (``--no-roundtrip`` skips
  this).

Why
---
The importer's job is to turn the dynamic-shape graphs real exporters emit
into static model-dialect IR. The node tests (onnx_node_tests.py) check ops
one at a time; this checks whole graphs, including the shape arithmetic on
``Shape(tokens)`` that every export contains and the exporter's constant
folding, which decides which initializers exist.

Usage (system interpreter; Debian python3-torch and python3-onnx)::

    /usr/bin/python3 test/Import/pytorch_exports.py --tool build/bin/fastllm-opt

Prints ``PASS name`` or ``FAIL name: reason`` per case and finally
``export import tests: P passed, F failed``; exits 1 on any failure.
``--keep DIR`` keeps the .onnx, .json and .mlir files there. The exports run
in this process (export_models.main), which saves the torch start-up per
case; the whole run takes a few seconds.
"""

import argparse
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXPORT_SCRIPT = os.path.join(ROOT, "test", "models", "export_models.py")
MODEL_OPS_TD = os.path.join(ROOT, "ir", "ModelOps.td")
DEFAULT_TOOL = os.path.join(ROOT, "build", "bin", "fastllm-opt")

BATCH, SEQ = 4, 16

# Ops outside the model dialect that the imported module may hold.
STRUCTURAL_OPS = {"builtin.module", "func.func", "func.return"}

# (name, export_models.py arguments)
CASES = [
    ("gpt2-erf-fold", ["--model", "gpt2", "--gelu", "erf", "--fold", "on"]),
    ("gpt2-erf-nofold", ["--model", "gpt2", "--gelu", "erf", "--fold", "off"]),
    ("gpt2-tanh-fold", ["--model", "gpt2", "--gelu", "tanh", "--fold", "on"]),
    ("gpt2-tanh-nofold", ["--model", "gpt2", "--gelu", "tanh", "--fold", "off"]),
    ("llama-fold", ["--model", "llama", "--fold", "on"]),
    ("llama-nofold", ["--model", "llama", "--fold", "off"]),
    ("gpt2-opset13", ["--model", "gpt2", "--fold", "on", "--opset", "13"]),
    ("gpt2-opset14", ["--model", "gpt2", "--fold", "on", "--opset", "14"]),
    ("llama-opset13", ["--model", "llama", "--fold", "on", "--opset", "13"]),
    ("llama-opset14", ["--model", "llama", "--fold", "on", "--opset", "14"]),
]


def dialect_ops(td_path):
    """Names ("model.add", ...) of the ops defined in ir/ModelOps.td."""
    with open(td_path) as f:
        src = f.read()
    names = re.findall(r'^def\s+\w+\s*:\s*Model_\w*Op<\s*"([^"]+)"', src, re.M)
    if not names:
        sys.exit(f"{td_path}: no model dialect op definitions found")
    return {"model." + n for n in names}


def load_exporter():
    """test/models/export_models.py as a module (no __pycache__ left there)."""
    sys.dont_write_bytecode = True
    spec = importlib.util.spec_from_file_location("export_models", EXPORT_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def export(exporter, args, log_path):
    """Runs export_models.main(args) with fd 2 (Python's and torch's C++
    warnings alike) sent to log_path; returns (exit status, log text)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(log_path, "w") as log:
            os.dup2(log.fileno(), 2)
            try:
                status = exporter.main(args)
            except SystemExit as e:  # argparse errors
                status = e.code
            except Exception as e:  # noqa: BLE001 - reported as a failure
                print(f"export raised {type(e).__name__}: {e}", file=sys.stderr)
                status = 1
            finally:
                sys.stderr.flush()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    with open(log_path) as f:
        return status, f.read()


# --------------------------------------------------------------------------
# Reading the IR
# --------------------------------------------------------------------------

def strip_resources(ir):
    """The IR without its trailing {-# dialect_resources ... #-} blob section."""
    i = ir.find("{-#")
    return ir if i < 0 else ir[:i]


def tensor_types(ir):
    """Every `tensor<...>` in the text (nested <> allowed)."""
    types = []
    for m in re.finditer(r"\btensor<", ir):
        depth, i = 0, m.end() - 1
        while i < len(ir):
            depth += {"<": 1, ">": -1}.get(ir[i], 0)
            if depth == 0:
                break
            i += 1
        types.append(ir[m.start():i + 1])
    return types


def dims_of(tensor_type):
    """'tensor<4x16xi64>' -> ([4, 16], 'i64'); None for a non-static type."""
    m = re.fullmatch(r"tensor<((?:\d+x)*)([A-Za-z]\w*)>", tensor_type)
    if not m:
        return None
    return [int(d) for d in m.group(1).split("x")[:-1]], m.group(2)


def signature(ir):
    """([(arg type, name)], [(result type, name)]) of func.func @forward."""
    m = re.search(r"^\s*func\.func @forward\((.*)\)\s*->\s*(.*?)\s*\{\s*$",
                  ir, re.M)
    if not m:
        return None
    entry = r'(tensor<[^>]*>)(?:\s*\{[^}]*?model\.name\s*=\s*"([^"]*)"[^}]*\})?'
    args = re.findall(r"%\w+:\s*" + entry, m.group(1))
    results = re.findall(entry, m.group(2))
    return args, results


def parameters(ir):
    """{name: tensor type} of the model.parameter declarations."""
    params = {}
    for m in re.finditer(
            r'^\s*model\.parameter\s+@("(?:[^"\\]|\\.)*"|[\w.$-]+)\s*:\s*'
            r"(tensor<[^>]*>)", ir, re.M):
        name = m.group(1)
        if name.startswith('"'):
            name = json.loads(name)
        params[name] = m.group(2)
    return params


def generic_op_names(generic_ir):
    """Op names of IR printed with --mlir-print-op-generic."""
    return re.findall(r'^\s*(?:%[^=]*=\s*)?"([\w.]+)"\(', generic_ir, re.M)


# --------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------

def import_model(tool, onnx_path, extra=()):
    cmd = [tool, "import", onnx_path, "--bind-dim", f"batch={BATCH}",
           "--bind-dim", f"seq={SEQ}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def short(text, limit=400):
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def check_ir(ir, generic_ir, info, allowed_ops):
    """The list of problems found in the imported IR (empty when fine)."""
    problems = []
    body = strip_resources(ir)

    dynamic = sorted({t for t in tensor_types(body) if dims_of(t) is None})
    if dynamic:
        problems.append("non-static tensor types: " + ", ".join(dynamic[:5]))

    ops = generic_op_names(strip_resources(generic_ir))
    if not ops:
        problems.append("no ops found in the generic IR")
    foreign = sorted(set(ops) - allowed_ops)
    if foreign:
        problems.append("ops outside the model dialect's list: "
                        + ", ".join(foreign))

    sig = signature(body)
    if sig is None:
        problems.append("no func.func @forward signature found")
    else:
        args, results = sig
        want = f"tensor<{BATCH}x{SEQ}xi64>"
        if not args or any(t != want for t, _ in args):
            problems.append(f"inputs are {[t for t, _ in args]}, "
                            f"expected all {want}")
        if [n for _, n in args] != ["tokens", "targets"]:
            problems.append(f"input names are {[n for _, n in args]}, "
                            "expected ['tokens', 'targets']")
        if results != [("tensor<f32>", "loss")]:
            problems.append(f"results are {results}, expected "
                            "[('tensor<f32>', 'loss')]")

    params = parameters(body)
    count = 0
    for name, t in params.items():
        d = dims_of(t)
        if d is None:
            problems.append(f"parameter {name} has type {t}")
        else:
            count += math.prod(d[0])
    if count != info["trainable_params"]:
        problems.append(f"parameters hold {count} elements in {len(params)} "
                        f"declarations, expected trainable_params = "
                        f"{info['trainable_params']}")
    expected = set()
    for name in info["param_names"]:
        held = info["param_map"].get(name) or {}
        renamed = name.startswith("onnx::MatMul") and held.get("transposed")
        expected.add(held["param"] if renamed else name)
    missing = sorted(expected - set(params))
    extra = sorted(set(params) - expected)
    if missing or extra:
        problems.append(f"parameters differ from the float initializers: "
                        f"missing {missing[:5]}, extra {extra[:5]}")
    return problems


def run_case(name, export_args, exporter, tool, workdir, allowed_ops,
             roundtrip):
    """(ok, reason or summary) for one case."""
    onnx_path = os.path.join(workdir, name + ".onnx")
    info_path = os.path.join(workdir, name + ".json")
    mlir_path = os.path.join(workdir, name + ".mlir")
    status, log = export(exporter, export_args + ["--out", onnx_path,
                                                  "--info", info_path],
                         os.path.join(workdir, name + ".export.log"))
    if status != 0:
        errors = [line for line in log.splitlines() if "ERROR" in line
                  or "Error" in line or "raised" in line]
        return False, f"export failed ({status}): " + short(
            "\n".join(errors) or log[-400:])
    with open(info_path) as f:
        info = json.load(f)

    p = import_model(tool, onnx_path)
    if p.returncode != 0:
        return False, f"import exited {p.returncode}: {short(p.stderr)}"
    with open(mlir_path, "w") as f:
        f.write(p.stdout)
    g = import_model(tool, onnx_path, ["--mlir-print-op-generic"])
    if g.returncode != 0:
        return False, (f"generic-form import exited {g.returncode}: "
                       f"{short(g.stderr)}")

    problems = check_ir(p.stdout, g.stdout, info, allowed_ops)
    if roundtrip:
        r = subprocess.run([tool, mlir_path], capture_output=True, text=True,
                           timeout=300)
        if r.returncode != 0:
            problems.append(f"the printed IR does not parse back: "
                            f"{short(r.stderr, 300)}")
    if problems:
        return False, "; ".join(problems)
    return True, (f"opset {info['opset']}, {info['trainable_params']} params, "
                  f"{len(generic_op_names(g.stdout))} ops")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Export GPT-2/Llama variants with export_models.py, import "
                    "them with fastllm-opt and check the IR.")
    ap.add_argument("--tool", default=DEFAULT_TOOL, help="fastllm-opt binary")
    ap.add_argument("--keep", metavar="DIR", default=None,
                    help="write the .onnx/.json/.mlir files here and keep them")
    ap.add_argument("--filter", default=None,
                    help="only cases whose name matches this regex")
    ap.add_argument("--no-roundtrip", dest="roundtrip", action="store_false",
                    help="do not require the printed IR to parse back")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print a summary and the time of passing cases")
    args = ap.parse_args(argv)

    if not os.access(args.tool, os.X_OK):
        sys.exit(f"pytorch_exports.py: {args.tool} is not an executable")
    allowed_ops = STRUCTURAL_OPS | dialect_ops(MODEL_OPS_TD)
    cases = [c for c in CASES if not args.filter or re.search(args.filter, c[0])]
    exporter = load_exporter()

    with tempfile.TemporaryDirectory(prefix="export-import-") as tmp:
        workdir = args.keep or tmp
        os.makedirs(workdir, exist_ok=True)
        passed = failed = 0
        for name, export_args in cases:
            t0 = time.perf_counter()
            try:
                ok, detail = run_case(name, export_args, exporter, args.tool,
                                      workdir, allowed_ops, args.roundtrip)
            except subprocess.TimeoutExpired as e:
                ok, detail = False, f"timed out: {e.cmd[:3]}"
            if ok:
                passed += 1
                print(f"PASS {name}" + (
                    f" ({detail}; {time.perf_counter() - t0:.1f}s)"
                    if args.verbose else ""))
            else:
                failed += 1
                print(f"FAIL {name}: {detail}")
            sys.stdout.flush()

    print(f"export import tests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
