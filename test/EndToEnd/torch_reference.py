"""The PyTorch side of the end-to-end tests, written once.

What `train --sampler sequential` reads, the AdamW it runs, and the weights
files it writes, as PyTorch/NumPy code the tests compare against.
"""
import numpy as np
import torch

from safetensors_file import read_safetensors  # noqa: F401  (the tests read it from here)


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


def adamw(params, hp):
    """torch.optim.AdamW as `train` runs it: weight decay on tensors of two
    or more dims only. `hp`: lr, beta1, beta2, eps, weight_decay."""
    params = list(params)
    return torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": hp["weight_decay"]},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])


def train(model, params, batches, hp, before_step=None):
    """Steps AdamW over `batches` (the loss is model(x, y)); returns the
    per-step losses. `before_step(step)` runs before each forward."""
    opt = adamw(params, hp)
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
