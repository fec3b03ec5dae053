#!/usr/bin/python3
# REQUIRES: onnx
# RUN: %python %s fastllm-opt
"""Names from an ONNX file can never become code, and survive byte for byte.

Takes the bundled GPT-2 (models/gpt2-tiny.onnx) and renames six of its
initializers to names an attacker or an unlucky user could write: C
preprocessor lines, a statement that runs a command (`std::system("touch
MARKER")`) after closing the function, a trailing backslash that would
continue a // comment, `*/`, quotes, the `??/` trigraph, `%n`, a NUL byte,
and non-ASCII UTF-8. Then:
  - `compile` builds the binary; `train --help` and a 6-step run never create
    MARKER (the injected statement never runs);
  - the losses equal, bit for bit, those of the same model under its own
    names (the oracle: renaming touches nothing but names);
  - every name appears exactly (UTF-8, NUL included) in weights.safetensors,
    plan.json, the --save-weights file, whose values equal the plain run's;
  - a checkpoint written under those names is resumed (their fingerprint
    matches) and continues with the uninterrupted run's losses.
Prints PASS/FAIL per check and `hostile names tests: P passed, F failed`.
"""
import array
import json
import os
import struct
import subprocess
import sys
import tempfile

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin", "fastllm-opt")


def hostile_names(marker):
    return [
        "w\n#include </etc/passwd>\n",
        "x\n#ifndef PWN\nreturn 0; }\nstatic int pwn = std::system(\"touch " + marker
        + "\");\nnamespace {\n#endif\n",
        "continues a // comment \\",
        "c */ /* \" quote \\\" ??/ trigraph ??= %n%s%x",
        "nul\x00inside",
        "poids_tête_\u00e9\u4e2d\U0001F600",
    ]


def rename_initializers(model, mapping):
    for init in model.graph.initializer:
        if init.name in mapping:
            init.name = mapping[init.name]
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in mapping:
                node.input[i] = mapping[name]
    for value in model.graph.input:
        if value.name in mapping:
            value.name = mapping[value.name]


def safetensors_names(path):
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header


def safetensors_tensor(path, name):
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        begin, end = header[name]["data_offsets"]
        f.seek(8 + size + begin)
        return f.read(end - begin)


def losses(metrics):
    return [json.loads(line)["loss"] for line in open(metrics)]


def main():
    work = tempfile.mkdtemp(prefix="hostile-names-")
    marker = os.path.join(work, "MARKER")
    names = hostile_names(marker)
    model = onnx.load(os.path.join(ROOT, "models", "gpt2-tiny.onnx"))
    originals = [t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    # The tied embedding, a norm gain, biases and anonymous matrices.
    picked = [n for n in originals if n == "wte.weight" or n.startswith("onnx::MatMul")][:3]
    picked += [n for n in originals if n.endswith("ln_1.weight") or n.endswith(".bias")][:3]
    assert len(picked) == len(names), picked
    mapping = dict(zip(picked, names))
    rename_initializers(model, mapping)
    hostile_path = os.path.join(work, "hostile.onnx")
    onnx.save(model, hostile_path)

    data = os.path.join(work, "tokens.u16")
    array.array("H", list(open("/usr/share/common-licenses/GPL-3", "rb").read())).tofile(
        open(data, "wb"))

    results = []

    def check(name, ok, detail=""):
        results.append(ok)
        print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail else ""))

    runs = {}
    for label, path in (("plain", os.path.join(ROOT, "models", "gpt2-tiny.onnx")),
                        ("hostile", hostile_path)):
        out = os.path.join(work, label)
        # Literal names on both sides: by default the plain model's folded
        # onnx::MatMul_N weights would be renamed after their modules (and
        # transposed), the hostile ones, renamed here, would not.
        r = subprocess.run([TOOL, "compile", path, "-o", out, "--batch-size", "2",
                            "--seq-len", "16", "--keep-shared-initializers"],
                           capture_output=True, text=True)
        check(f"{label}: compile builds the binary", r.returncode == 0, r.stderr[-2000:])
        if r.returncode != 0:
            continue
        runs[label] = out
    if "hostile" not in runs or "plain" not in runs:
        return finish(results)

    out = runs["hostile"]
    source = open(os.path.join(out, "train_step.cpp"), "rb").read()
    fragments = [b"#include </etc/passwd>", b"#ifndef PWN", b"return 0; }",
                 b"touch " + marker.encode() + b'")', b"??/", b"*/ /*", "tête".encode()]
    check("no name's code-like text appears raw in the generated source",
          not any(f in source for f in fragments),
          str([f for f in fragments if f in source]))
    r = subprocess.run([os.path.join(out, "train"), "--help"], capture_output=True, text=True)
    check("train --help runs", r.returncode == 0, r.stderr[-500:])
    check("the injected statement never ran (--help)", not os.path.exists(marker))

    def train(label, steps, extra=()):
        metrics = os.path.join(work, f"{label}-{steps}-{len(extra)}.jsonl")
        cmd = [os.path.join(runs[label], "train"), "--data", data, "--steps", str(steps),
               "--lr", "1e-3", "--sampler", "sequential", "--metrics", metrics] + list(extra)
        r = subprocess.run(cmd, capture_output=True, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        return r, metrics

    saved = {}
    ran = {}
    for label in ("plain", "hostile"):
        saved[label] = os.path.join(work, f"{label}-final.safetensors")
        r, metrics = train(label, 6, ["--save-weights", saved[label]])
        check(f"{label}: 6 training steps", r.returncode == 0, r.stderr[-1000:])
        ran[label] = losses(metrics) if r.returncode == 0 else []
    check("the injected statement never ran (training)", not os.path.exists(marker))
    check("losses equal the same model under its own names (bitwise)",
          ran["plain"] and ran["plain"] == ran["hostile"],
          f"{ran['plain'][:3]} vs {ran['hostile'][:3]}")

    expected = {mapping.get(n, n) for n in originals}
    for what, path in (("weights.safetensors", os.path.join(out, "weights.safetensors")),
                       ("--save-weights", saved["hostile"])):
        got = set(safetensors_names(path)) if os.path.exists(path) else set()
        check(f"names exact in {what}", got == expected,
              f"missing {sorted(expected - got)!r}, extra {sorted(got - expected)!r}")
    plan = json.load(open(os.path.join(out, "plan.json")))
    plan_names = {p["name"] for p in plan.get("params", [])}
    check("names exact in plan.json", plan_names == expected,
          f"missing {sorted(expected - plan_names)!r}")
    if os.path.exists(saved["hostile"]) and os.path.exists(saved["plain"]):
        same = all(safetensors_tensor(saved["hostile"], mapping.get(n, n))
                   == safetensors_tensor(saved["plain"], n) for n in originals)
        check("saved weights equal the plain run's, tensor by tensor", same)

    # Checkpoint under hostile names at step 3, resume to 6: same losses.
    ckpt = os.path.join(work, "ckpt")
    r, _ = train("hostile", 3, ["--checkpoint-dir", ckpt, "--checkpoint-every", "3"])
    r2, metrics = train("hostile", 6, ["--checkpoint-dir", ckpt, "--resume"])
    resumed = losses(metrics) if r2.returncode == 0 else []
    check("a checkpoint under these names resumes to the same losses",
          r.returncode == 0 and r2.returncode == 0 and resumed[-3:] == ran["hostile"][-3:],
          (r.stderr + r2.stderr)[-1000:] + f" {resumed} vs {ran['hostile']}")
    check("the injected statement never ran (resume)", not os.path.exists(marker))
    return finish(results)


def finish(results):
    passed = sum(results)
    print(f"hostile names tests: {passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
