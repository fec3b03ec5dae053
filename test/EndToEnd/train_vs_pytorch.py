#!/usr/bin/python3
# REQUIRES: torch, onnx
# RUN: %python %s --tool fastllm-opt
"""Compiled training equals PyTorch's, step for step.

For each case: export a seeded GPT-2- or Llama-style model with
test/models/export_models.py, compile it with `fastllm-opt compile` for the
CPU, train it with the generated binary (`--sampler sequential`, fp32,
AdamW), and train the very same PyTorch model (same initial weights, same
samples, torch.optim.AdamW with decay on >= 2-dim parameters only) in this
process. Every step's loss must agree within --rtol (relative, default 1e-5;
a NaN or infinite loss never agrees). PyTorch is
the oracle, run at test time; nothing here is a stored expectation.

Prints `PASS name (max rel diff ...)` / `FAIL name: ...` per case and a last
line `e2e train tests: P passed, F failed`; exits 1 on any failure. A last
case trains one model with a learning rate 0.01% off PyTorch's and must fail
the bound: the bound is tight enough to see a small mistake.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "test", "models"))
import export_models  # noqa: E402
import torch_reference  # noqa: E402

CASES = {
    "gpt2-erf-fold": ["--model", "gpt2", "--gelu", "erf", "--fold", "on"],
    "gpt2-erf-nofold": ["--model", "gpt2", "--gelu", "erf", "--fold", "off"],
    "gpt2-tanh-fold": ["--model", "gpt2", "--gelu", "tanh", "--fold", "on"],
    "gpt2-tanh-nofold": ["--model", "gpt2", "--gelu", "tanh", "--fold", "off"],
    "llama-fold": ["--model", "llama", "--fold", "on"],
    "llama-nofold": ["--model", "llama", "--fold", "off"],
}


# The bound: the worst difference measured over these cases is 2.1e-7 (float32
# summation order); 1e-5 leaves room for that and still fails a run whose
# learning rate is 0.01% off (PERTURBED, checked below as a case of its own:
# it differs by ~3e-5, which the former bound of 1e-4 let pass).
RTOL = 1e-5
PERTURBED = ("gpt2-erf-fold", {"lr": 1.0001e-3})


def token_data(vocab, n=40000):
    """Byte-level tokens of a text every Debian machine has, else seeded noise."""
    path = "/usr/share/common-licenses/GPL-3"
    if os.path.exists(path) and vocab >= 256:
        data = np.frombuffer(open(path, "rb").read(), dtype=np.uint8)[:n]
        return data.astype(np.uint16)
    return np.random.default_rng(0).integers(0, vocab, n).astype(np.uint16)


def torch_losses(cfg, data, steps, batch, accum, seq, hp, freeze=None):
    """Trains the PyTorch model the export came from; returns per-step losses.
    Parameters whose name matches the regex `freeze` are not trained."""
    torch.manual_seed(0)
    model = export_models.build_model(cfg)
    trained = []
    for name, p in model.named_parameters():
        if freeze and re.search(freeze, name):
            p.requires_grad_(False)
        else:
            trained.append(p)
    # the loss is the mean over all G x T tokens
    return torch_reference.train(
        model, trained, torch_reference.sequential_batches(data, steps, batch * accum, seq), hp)


def run_case(name, args, tool, workdir, steps, rtol, perturb=None):
    d = os.path.join(workdir, name)
    os.makedirs(d, exist_ok=True)
    onnx_path = os.path.join(d, "model.onnx")
    argv = args + ["--out", onnx_path]
    cfg = export_models.parse_args(argv)
    export_models.main(argv)

    seq, batch, accum = 32, 4, 2
    data = token_data(cfg.vocab)
    data_path = os.path.join(d, "tokens.u16")
    data.tofile(data_path)
    hp = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}

    out = os.path.join(d, "run")
    proc = subprocess.run([tool, "compile", onnx_path, "-o", out,
                           "--batch-size", str(batch), "--seq-len", str(seq)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return False, f"compile failed: {proc.stderr.strip()[-2000:]}"
    metrics = os.path.join(d, "metrics.jsonl")
    ours_hp = dict(hp, **(perturb or {}))
    proc = subprocess.run([os.path.join(out, "train"), "--data", data_path,
                           "--steps", str(steps), "--sampler", "sequential",
                           "--grad-accum", str(accum), "--metrics", metrics]
                          + [a for k, v in ours_hp.items()
                             for a in (f"--{k.replace('_', '-')}", repr(v))],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return False, f"train failed: {proc.stderr.strip()[-2000:]}"
    ours = [json.loads(line)["loss"] for line in open(metrics)]
    ref = torch_losses(cfg, data, steps, batch, accum, seq, hp)
    if len(ours) != steps:
        return False, f"{len(ours)} metrics lines for {steps} steps"
    worst, at = torch_reference.loss_diff(ours, ref)
    detail = (f"max rel diff {worst:.2e} at step {at + 1} "
              f"(ours {ours[at]:.7f}, torch {ref[at]:.7f}); "
              f"loss {ref[0]:.4f} -> {ref[-1]:.4f}")
    return worst <= rtol, detail


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "bin", "fastllm-opt"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rtol", type=float, default=RTOL)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--keep", metavar="DIR", help="keep the work files here")
    args = ap.parse_args()
    torch.set_num_threads(2)

    workdir = args.keep or tempfile.mkdtemp(prefix="e2e-train-")
    passed = failed = 0
    for name in args.cases.split(","):
        try:
            ok, detail = run_case(name, CASES[name], args.tool, workdir,
                                  args.steps, args.rtol)
        except Exception as e:  # a crash in one case must not hide the others
            ok, detail = False, f"{type(e).__name__}: {e}"
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        passed += ok
        failed += not ok
    # The bound must catch a small mistake: the same case trained with a
    # learning rate 0.01% off the reference's must fail it.
    name, perturb = PERTURBED
    try:
        ok, detail = run_case(name + "-perturbed", CASES[name], args.tool, workdir,
                              args.steps, args.rtol, perturb=perturb)
        caught = not ok and detail.startswith("max rel diff")  # it ran, and differs
    except Exception as e:  # noqa: BLE001
        caught, detail = False, f"{type(e).__name__}: {e}"
    print(f"{'PASS' if caught else 'FAIL'} the {args.rtol:g} bound fails {name} trained with "
          f"{perturb}: {detail}", flush=True)
    passed += caught
    failed += not caught
    print(f"e2e train tests: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
