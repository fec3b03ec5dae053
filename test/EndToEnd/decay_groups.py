#!/usr/bin/python3
# REQUIRES: torch, onnx
# RUN: %python %s fastllm-opt
"""Weight-decay groups as training scripts write them train like PyTorch.

A GPT-style model (test/EndToEnd/user_models.py), exported with the helper,
is compiled once and trained 20 steps (`--sampler sequential`) three ways,
each against torch.optim.AdamW with the parameter groups the flags stand
for:
  - no flag: decay on tensors of two or more dims (train's default);
  - `--decay '.*'`: every parameter decays, as
    `torch.optim.AdamW(model.parameters(), weight_decay=0.1)`;
  - `--no-decay 'bias|norm|tokens|positions'`: the common groups keeping
    biases, norms and embeddings out.
Every step's loss within 1e-5 relative. The flags must matter: the
everything-decays run compared with PyTorch's default groups fails the
bound. Prints PASS/FAIL per case and `decay groups tests: P passed, F failed`.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import fastllm_export  # noqa: E402
import torch_reference  # noqa: E402  (beside this file)
import user_models  # noqa: E402

VOCAB, SEQ, BATCH, STEPS = 96, 16, 4, 20
LOSS_RTOL = 1e-5
HP = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
TOOL = sys.argv[1] if len(sys.argv) > 1 else "fastllm-opt"
NO_DECAY = "bias|norm|tokens|positions"


def make_model():
    torch.manual_seed(1234)
    return user_models.GPTStyleLM(vocab=VOCAB, context=SEQ, depth=1, heads=4, width=32,
                                  p_drop=0.0)


def torch_losses(batches, decayed):
    """Losses of AdamW with decay on the parameters `decayed(name, p)` picks."""
    model = make_model()
    return torch_reference.train(model, model.named_parameters(), batches, HP,
                                 decayed=decayed)


def train(run, data_path, work, name, flags):
    metrics = os.path.join(work, name + ".jsonl")
    cmd = [os.path.join(run, "train"), "--data", data_path, "--steps", str(STEPS),
           "--sampler", "sequential", "--metrics", metrics, *flags]
    cmd += [a for k, v in HP.items() for a in (f"--{k.replace('_', '-')}", repr(v))]
    r = subprocess.run(cmd, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        return None, r.stderr.strip()[-1500:]
    said = [line for line in r.stdout.splitlines() if line.startswith("weight decay")]
    return [json.loads(line)["loss"] for line in open(metrics)], "; ".join(said)


def main():
    work = tempfile.mkdtemp(prefix="decay-groups-")
    data = np.frombuffer(open("/usr/share/common-licenses/GPL-3", "rb").read(),
                         dtype=np.uint8)[:20000] % VOCAB
    data_path = os.path.join(work, "tokens.u16")
    data.astype(np.uint16).tofile(data_path)
    batches = list(torch_reference.sequential_batches(data, STEPS, BATCH, SEQ))
    onnx_path = os.path.join(work, "model.onnx")
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(7))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fastllm_export.export(make_model(), (x, x), onnx_path, check=False)
    run = os.path.join(work, "run")
    subprocess.run([TOOL, "compile", onnx_path, "-o", run], check=True, capture_output=True)

    default = torch_losses(batches, lambda n, p: p.dim() >= 2)
    everything = torch_losses(batches, lambda n, p: True)
    groups = torch_losses(batches, lambda n, p: p.dim() >= 2 and not re.search(NO_DECAY, n))
    results = []
    for name, flags, reference in (("default: decay on >= 2-dim tensors", [], default),
                                   ("--decay '.*': every parameter", ["--decay", ".*"],
                                    everything),
                                   (f"--no-decay '{NO_DECAY}'", ["--no-decay", NO_DECAY],
                                    groups)):
        losses, said = train(run, data_path, work, str(len(results)), flags)
        if losses is None:
            results.append((False, name, said))
            continue
        worst, at = torch_reference.loss_diff(losses, reference)
        results.append((len(losses) == STEPS and worst <= LOSS_RTOL,
                        f"{name}: losses within {LOSS_RTOL:g} of PyTorch's AdamW groups",
                        f"max rel diff {worst:.2e} at step {at + 1}" +
                        (f" ({said})" if said else "")))
    # The flags matter: every parameter decayed is not the default groups.
    losses, _ = train(run, data_path, work, "wrong", ["--decay", ".*"])
    worst, _ = torch_reference.loss_diff(losses or [], default)
    results.append((not worst <= LOSS_RTOL,
                    "--decay '.*' against PyTorch's default groups fails the bound",
                    f"max rel diff {worst:.2e}"))
    sys.exit(torch_reference.report(results, "decay groups"))


if __name__ == "__main__":
    main()
