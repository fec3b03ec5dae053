#!/usr/bin/python3
# REQUIRES: torch, onnx
# RUN: %python %s fastllm-opt
"""A weight's rows used as vectors, exported with PyTorch's defaults, train
exactly like PyTorch or are refused: never a separate tensor in silence.

Constant folding (on by default in torch.onnx.export) turns a row of a
weight read by a constant index into an initializer of its own under a
generated name (`onnx::Concat_N`). Trained as a tensor of its own it gets no
weight decay and loses its tie with the table; step 1's loss is still equal
and later ones drift. The models below use such rows the way model code
does (the project's own code):
  - bos:    a learned beginning-of-sequence row of the token table
            (`wte.weight[bos]`) put in front of the shifted embeddings, the
            head tied to the table;
  - mask:   a fixed pattern of positions replaced by the table's [MASK] row
            (`torch.where(masked, wte.weight[mask_id], emb)`), tied head;
  - prefix: positions read as `wpe.weight[:T]` with T below the context
            length: the table's only reader is folded, so the file holds
            the rows alone, under a generated name; they train as that
            tensor (equivalent: AdamW treats rows alike), compared by value.
Each is exported with the defaults (eval mode, folding) and in training
mode with folding, compiled, trained 30 steps (`--sampler sequential`) and
compared with the same model trained by torch.optim.AdamW (decay on tensors
of 2 or more dims, as `train`): every step's loss within 1e-5 relative, the
saved weights naming exactly PyTorch's parameters (no generated name left:
the tie intact) each within 1e-5 relative L2 of PyTorch's, and `import
--summary` listing the folded rows as a view of their table.
A rotary model whose angles come from a persistent `inv_freq` buffer
(register_buffer's default) is refused in the default and training-mode
exports (the table reaches the loss only through sin and cos: a buffer in
all likelihood, but not for certain), trains exactly once `--freeze`
decides it, and trains exactly from tools/fastllm_export.py's export
(which lists the parameters).
A model whose folded row is found twice in its table (a [MASK] row
initialised as a copy of another token's, as code adding special tokens
does) cannot be told apart: compile refuses it with the remedy, and
compiles once `--freeze` decides it. A run with the
learning rate 0.01% off must fail the bounds.
Prints PASS/FAIL per case and `folded rows tests: P passed, F failed`.
"""
import json
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import fastllm_export  # noqa: E402
import fastllm_weights  # noqa: E402
import torch_reference  # noqa: E402  (beside this file)

VOCAB, DIM, CONTEXT, SEQ, BATCH = 64, 32, 24, 16, 4
STEPS = 30
LOSS_RTOL = 1e-5
WEIGHT_RTOL = 1e-5
HP = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
TOOL = sys.argv[1] if len(sys.argv) > 1 else "fastllm-opt"


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, as small GPTs write them."""

    def __init__(self, width, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        # (Without a bias: the key third of a fused qkv bias has a true
        # gradient of zero, and AdamW moves it by rounding noise.)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (c // self.heads) ** 0.5
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    """Token and position tables, one block, a final norm, a head tied to
    the token table. `copied_row`: the [MASK] row starts as a copy of token
    0's, as code that adds a special token often initialises it."""

    def __init__(self, style, copied_row=False):
        super().__init__()
        self.style = style
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(CONTEXT, DIM)
        self.block = Block(DIM)
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.wte.weight
        self.bos, self.mask_id = 1, 3
        if copied_row:
            with torch.no_grad():
                self.wte.weight[self.mask_id] = self.wte.weight[0]
        # Every fifth position is masked, a fixed corruption pattern.
        self.register_buffer("masked", (torch.arange(SEQ) % 5 == 4).view(1, SEQ, 1),
                             persistent=False)

    def forward(self, idx, targets):
        b, t = idx.shape
        emb = self.wte(idx)
        if self.style == "bos":
            start = self.wte.weight[self.bos].expand(b, 1, DIM)
            emb = torch.cat([start, emb[:, :-1]], dim=1)
        elif self.style == "mask":
            emb = torch.where(self.masked, self.wte.weight[self.mask_id], emb)
        if self.style == "prefix":
            x = emb + self.wpe.weight[:t]
        else:
            x = emb + self.wpe(torch.arange(t))
        logits = self.head(self.ln_f(self.block(x)))
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


class RopeLM(nn.Module):
    """Rotary attention whose angles are computed in forward from a
    persistent `inv_freq` buffer (register_buffer's default), tied head."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.ln = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.proj = nn.Linear(DIM, DIM)
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.wte.weight
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, DIM, 2).float() / DIM))

    def rotate(self, x, cos, sin):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, idx, targets):
        t = idx.shape[1]
        angles = torch.arange(t, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos(), angles.sin()
        x = self.wte(idx)
        q, k, v = self.qkv(self.ln(x)).split(DIM, dim=2)
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        att = (q @ k.transpose(-2, -1)) / DIM ** 0.5
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        x = x + self.proj(att.masked_fill(~causal, float("-inf")).softmax(-1) @ v)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def make_model(style, copied_row=False):
    if style == "rope":
        torch.manual_seed(1234)
        return RopeLM()
    torch.manual_seed(1234)
    return TinyLM(style, copied_row)


def export(model, mode, path):
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(7))
    kwargs = {} if mode == "default" else {
        "training": torch.onnx.TrainingMode.TRAINING, "do_constant_folding": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x, x), path, input_names=["idx", "targets"],
                          output_names=["loss"], **kwargs)


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def compile_and_train(work, onnx_path, data_path, extra=(), hp=None):
    """(error or None, losses, saved tensors, initial tensors)."""
    out = os.path.join(work, "run")
    r = subprocess.run([TOOL, "compile", onnx_path, "-o", out, *extra],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return r.stderr.strip(), None, None, None
    metrics, saved = os.path.join(out, "metrics.jsonl"), os.path.join(out, "final.safetensors")
    cmd = [os.path.join(out, "train"), "--data", data_path, "--steps", str(STEPS),
           "--sampler", "sequential", "--metrics", metrics, "--save-weights", saved,
           "--overwrite"]
    cmd += [a for k, v in (hp or HP).items() for a in (f"--{k.replace('_', '-')}", repr(v))]
    r = subprocess.run(cmd, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        return "train: " + r.stderr.strip()[-1500:], None, None, None
    losses = [json.loads(line)["loss"] for line in open(metrics)]
    tensors, _ = fastllm_weights.read_safetensors(saved)
    start, _ = fastllm_weights.read_safetensors(os.path.join(out, "weights.safetensors"))
    return None, losses, tensors, start


def check_run(label, losses, tensors, reference, final, final64, initial, start,
              buffers=()):
    """Results of comparing a run with PyTorch's losses and final weights.
    `start`: the compiled initial weights (weights.safetensors) by name; a
    generated name among them whose value is the first rows of a parameter
    the export lost (its only reader was folded) stands for those rows.
    `buffers`: names that must be saved unchanged (not PyTorch parameters);
    `final64`: the model trained in float64."""
    worst, at = torch_reference.loss_diff(losses, reference)
    results = [(len(losses) == STEPS and worst <= LOSS_RTOL,
                f"{label}: losses within {LOSS_RTOL:g} over {STEPS} steps",
                f"max rel diff {worst:.2e} at step {at + 1}")]
    want = {name: p.detach().numpy() for name, p in final.named_parameters()}
    init = {name: p.detach().numpy() for name, p in initial.named_parameters()}
    pairs, extra, by_value = {}, [], []
    for name in tensors:
        if name in want:
            pairs[name] = (tensors[name], want[name])
            continue
        found = [p for p in want if p not in tensors and name in start and
                 start[name].ndim == init[p].ndim and
                 start[name].shape[1:] == init[p].shape[1:] and
                 np.array_equal(start[name], init[p][:start[name].shape[0]])]
        if len(found) == 1:
            rows = start[name].shape[0]
            pairs[found[0]] = (tensors[name], want[found[0]][:rows])
            by_value.append(f"{name} = {found[0]}[:{rows}]")
        elif name not in (buffers or ()):
            extra.append(name)
        elif not np.array_equal(tensors[name], start.get(name)):
            extra.append(f"{name} (a buffer, changed)")
    missing = sorted(set(want) - set(pairs))
    off = {name: rel_l2(a, b) for name, (a, b) in pairs.items()}
    # A tensor PyTorch fp32 itself ends more than the bound from a float64
    # run of the same training (AdamW amplifying rounding) passes when it is
    # no farther from the float64 run than 3x PyTorch fp32 is.
    final64 = {n: p.detach().numpy() for n, p in final64.named_parameters()}
    noise, bad = [], {}
    for n, d in off.items():
        if d <= WEIGHT_RTOL:
            continue
        rows = pairs[n][1].shape[0]
        floor = rel_l2(want[n][:rows], final64[n][:rows])
        if floor > WEIGHT_RTOL and rel_l2(pairs[n][0], final64[n][:rows]) <= 3 * floor:
            noise.append(f"{n} {d:.1e} (PyTorch fp32 vs fp64 {floor:.1e})")
        else:
            bad[n] = f"{d:.2e} (PyTorch fp32 vs fp64 {floor:.1e})"
    worst_name = max(off, key=off.get) if off else "-"
    results.append((not extra and not missing and not bad,
                    f"{label}: saved weights are PyTorch's parameters, within "
                    f"{WEIGHT_RTOL:g} relative L2, the tie intact",
                    f"extra {extra}, missing {missing}, worst {worst_name} "
                    f"{off.get(worst_name, float('nan')):.2e}"
                    + (f", by value: {by_value}" if by_value else "")
                    + (f", noise-driven: {noise}" if noise else "")
                    + (f", over the bound: {bad}" if bad else "")))
    return results


def summary_lists_view(onnx_path, style):
    r = subprocess.run([TOOL, "import", onnx_path, "--summary", "-o", os.devnull],
                       capture_output=True, text=True)
    table = "wpe.weight" if style == "prefix" else "wte.weight"
    lines = [line.strip() for line in r.stdout.splitlines()
             if " = rows [" in line and line.endswith(f"] of {table}")]
    return bool(lines), lines


def main():
    work = tempfile.mkdtemp(prefix="folded-rows-")
    data = np.frombuffer(open("/usr/share/common-licenses/GPL-3", "rb").read(),
                         dtype=np.uint8)[:20000] % VOCAB
    data_path = os.path.join(work, "tokens.u16")
    data.astype(np.uint16).tofile(data_path)
    batches = list(torch_reference.sequential_batches(data, STEPS, BATCH, SEQ))
    results = []
    for style in ("bos", "mask", "prefix"):
        model, model64 = make_model(style), make_model(style).double()
        reference = torch_reference.train(model, model.parameters(), batches, HP)
        torch_reference.train(model64, model64.parameters(), batches, HP)
        for mode in ("default", "training"):
            case = os.path.join(work, f"{style}-{mode}")
            os.makedirs(case)
            onnx_path = os.path.join(case, "model.onnx")
            export(make_model(style), mode, onnx_path)
            label = f"{style} {mode}-export"
            if style != "prefix":  # (its table's only reader was folded away)
                ok, lines = summary_lists_view(onnx_path, style)
                results.append((ok, f"{label}: import --summary reads the folded rows as a "
                                "view", "; ".join(lines) or "no view listed"))
            err, losses, tensors, start = compile_and_train(case, onnx_path, data_path)
            if err:
                results.append((False, f"{label}: compile and train", err[-1500:]))
                continue
            results += check_run(label, losses, tensors, reference, model, model64,
                                 make_model(style), start)
            if style == "bos" and mode == "default":
                # The bounds see a small mistake.
                _, losses2, tensors2, start2 = compile_and_train(
                    os.path.join(case, "perturbed"), onnx_path, data_path,
                    hp=dict(HP, lr=HP["lr"] * 1.0001))
                got = check_run(label, losses2 or [], tensors2 or {}, reference, model,
                                model64, make_model(style), start2 or {})
                results.append((not got[0][0] and not got[1][0],
                                f"{label} with lr 0.01% off fails the loss and weight bounds",
                                "; ".join(d for _, _, d in got)))

    # A persistent rotary buffer: refused without the exporter's list, then
    # trained exactly once --freeze decides it; the helper's export lists it.
    model, model64 = make_model("rope"), make_model("rope").double()
    reference = torch_reference.train(model, model.parameters(), batches, HP)
    torch_reference.train(model64, model64.parameters(), batches, HP)
    for mode in ("default", "training", "helper"):
        case = os.path.join(work, f"rope-{mode}")
        os.makedirs(case)
        onnx_path = os.path.join(case, "model.onnx")
        if mode == "helper":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                x = torch.randint(0, VOCAB, (BATCH, SEQ),
                                  generator=torch.Generator().manual_seed(7))
                fastllm_export.export(make_model("rope"), (x, x), onnx_path, check=False)
        else:
            export(make_model("rope"), mode, onnx_path)
        label = f"rope {mode}-export"
        extra, decided = [], []
        if mode != "helper":
            err, _, _, _ = compile_and_train(case, onnx_path, data_path)
            refused = err is not None and "only through sin and cos" in err and \
                "--freeze" in err and "tools/fastllm_export.py" in err
            results.append((refused, f"{label}: the rotary buffer refused with the remedy",
                            (err or "compiled")[-400:]))
            if not refused:
                continue
            name = err.split("'")[1]
            decided = [name]
            extra = ["--freeze", "^" + name.replace(".", "\\.") + "$"]
        err, losses, tensors, start = compile_and_train(case, onnx_path, data_path, extra)
        if err:
            results.append((False, f"{label}: compile and train", err[-1500:]))
            continue
        buffers = decided + ["inv_freq"]
        results += check_run(label + (" with --freeze" if decided else ""), losses, tensors,
                             reference, model, model64, make_model("rope"), start, buffers)

    # A row found twice in its table: which one the model reads cannot be
    # told; refused, then decided.
    case = os.path.join(work, "ambiguous")
    os.makedirs(case)
    onnx_path = os.path.join(case, "model.onnx")
    export(make_model("mask", copied_row=True), "default", onnx_path)
    err, _, _, _ = compile_and_train(case, onnx_path, data_path)
    refused = err is not None and "may not be a weight" in err and "--freeze" in err and \
        "tools/fastllm_export.py" in err
    results.append((refused, "mask whose [MASK] row starts as a copy of another row: "
                    "refused with the remedy", (err or "compiled")[-600:]))
    name = err.split("'")[1] if refused else "onnx::"
    err, losses, _, _ = compile_and_train(case, onnx_path, data_path,
                                       extra=["--freeze", "^" + name.replace(".", "\\.") + "$"])
    results.append((err is None and len(losses) == STEPS,
                    "the same with --freeze deciding it: compiles and trains",
                    err or f"{len(losses)} steps"))

    sys.exit(torch_reference.report(results, "folded rows"))


if __name__ == "__main__":
    main()
