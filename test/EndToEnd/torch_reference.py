"""The PyTorch side of the end-to-end tests, written once.

What `train --sampler sequential` reads, the AdamW it runs, and the weights
files it writes, as PyTorch/NumPy code the tests compare against.
"""
import math

import numpy as np
import torch

from safetensors_file import read_safetensors  # noqa: F401  (the tests read it from here)


def loss_diff(ours, ref):
    """(worst, step) of two loss sequences: the largest relative difference
    |ours - ref| / |ref| and the 0-based step where it is. Infinite (so no
    bound passes it) when the sequences differ in length, are empty, or either
    holds a NaN or an infinity: a non-finite loss is never close to anything,
    and Python's max() would let a NaN through (NaN > x is false)."""
    ours, ref = list(ours), list(ref)
    if len(ours) != len(ref) or not ours:
        return float("inf"), min(len(ours), len(ref))
    worst, at = 0.0, 0
    for i, (a, b) in enumerate(zip(ours, ref)):
        a, b = float(a), float(b)
        if not (math.isfinite(a) and math.isfinite(b)):
            return float("inf"), i
        rel = abs(a - b) / abs(b) if b != 0 else (0.0 if a == 0 else float("inf"))
        if rel > worst:
            worst, at = rel, i
    return worst, at


def bf16_verdict(ours, ref16, ref32, rtol):
    """(ok, detail) of a bf16 run's losses OURS against a bf16 reference
    REF16 (PyTorch's autocast) and an fp32 one REF32 on the same samples:
    within RTOL of REF16, and NOT as close to REF32 as an fp32 run would be:
    at least a quarter of the REF16-vs-REF32 gap away from it. A run that
    silently computed in fp32 passes the first test (bf16 and fp32 runs are
    close) but fails the second."""
    rel16, rel32, gap = loss_diff(ours, ref16)[0], loss_diff(ours, ref32)[0], \
        loss_diff(ref16, ref32)[0]
    ok = rel16 <= rtol and rel32 >= gap / 4 and math.isfinite(gap)
    return ok, (f"max rel loss diff vs the bf16 reference {rel16:.1e} (bound {rtol:g}), "
                f"vs the fp32 reference {rel32:.1e} (must be >= {gap / 4:.1e}, a quarter "
                f"of the references' own bf16-vs-fp32 gap {gap:.1e})")


def sequential_batches(data, steps, batch, seq):
    """The (tokens, targets) of each step of `--sampler sequential` with a
    global batch of `batch` samples: sample i of step s starts at token
    ((s * batch + i) * seq) mod (len(data) - seq - 1); targets are shifted
    by one."""
    n = len(data)
    for s in range(steps):
        offs = [((s * batch + i) * seq) % (n - seq - 1) for i in range(batch)]
        x = np.stack([data[o:o + seq] for o in offs]).astype(np.int64)
        y = np.stack([data[o + 1:o + seq + 1] for o in offs]).astype(np.int64)
        yield torch.tensor(x), torch.tensor(y)


def adamw(params, hp, decayed=None):
    """torch.optim.AdamW as `train` runs it: weight decay on tensors of two
    or more dims only, or on those `decayed(name, param)` picks (then
    `params` are (name, param) pairs: train's --decay/--no-decay groups).
    `hp`: lr, beta1, beta2, eps, weight_decay."""
    named = list(params) if decayed else [(None, p) for p in params]
    decays = decayed or (lambda name, p: p.dim() >= 2)
    return torch.optim.AdamW(
        [{"params": [p for n, p in named if decays(n, p)],
          "weight_decay": hp["weight_decay"]},
         {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0}],
        lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])


def train(model, params, batches, hp, before_step=None, decayed=None):
    """Steps AdamW over `batches` (the loss is model(x, y)); returns the
    per-step losses. `before_step(step)` runs before each forward;
    `decayed(name, param)`, when given, picks the tensors that decay (then
    `params` are model.named_parameters())."""
    opt = adamw(params, hp, decayed)
    losses = []
    for step, (x, y) in enumerate(batches):
        if before_step:
            before_step(step)
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def report(results, label):
    """Prints each (ok, name, detail) of `results` as PASS/FAIL lines and the
    closing `LABEL tests: P passed, F failed` line the harness reads; the
    exit status to end with (1 when any failed)."""
    passed = sum(ok for ok, _, _ in results)
    for ok, name, detail in results:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    print(f"{label} tests: {passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1
