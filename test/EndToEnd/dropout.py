#!/usr/bin/python3
# REQUIRES: torch, onnx, mpirun
# RUN: %python %s fastllm-opt
"""Dropout (p > 0, training mode) trains like PyTorch with the same masks, and
draws the same masks whatever the data parallelism, micro-batching or ZeRO
stage.

The model is a small GPT-style network with `nn.Dropout(0.1)` after the
embeddings, on the attention probabilities and on each layer's feed-forward
output, exported with `torch.onnx.export(...,
training=TrainingMode.TRAINING)` (five ONNX Dropout nodes with ratio 0.1 and
training_mode true). Masks are Philox4x32-10 words
(runtime/Philox.h), computed here again in NumPy from the documented key:

    key     = (seed mod 2^32, seed >> 32)
    counter = (index within the sample // 4, site, global sample, step)
    keep    = word[index % 4] >= ceil(float32(p) * 2^32)
    site    = FNV-1a 32 of the Dropout node's output name

Checks (`--sampler sequential`, global batch 4 samples of 16 tokens, AdamW):
  - Philox's Random123 known-answer vectors (this file's NumPy version);
  - dp 1: every step's loss within 1e-5 relative of PyTorch training the same
    model with these masks in place of torch's own (dropout call k of a
    forward uses the site of the k-th Dropout node of the export);
  - dp 2 with ZeRO-1, 2 and 3, dp 2 with --grad-accum 2 (micro-batches of
    one sample), and dp 1 with --grad-accum 2: every step's loss within 1e-5
    relative of the dp 1 run, and of PyTorch;
  - --seed 1 changes the losses (the masks matter: a wrong key would show);
  - the CUDA target (fp32 and bf16) builds with nvcc; on a GPU its fp32 run's
    losses are within 1e-5 relative of the CPU's (the same masks), else
    that case is skipped.
Prints PASS/FAIL/SKIP per case and `dropout tests: P passed, F failed, S
skipped`.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_reference

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
TOOL = ARGS[0] if ARGS else os.path.join(ROOT, "build", "bin", "fastllm-opt")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader"]

VOCAB, DIM, HEADS, LAYERS, SEQ, GLOBAL = 96, 32, 4, 2, 16, 4
P = 0.1
STEPS = 12
HP = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
RTOL = 1e-5
# (dp, ZeRO stage, grad-accum) against the dp 1 reference (1, 1, 1).
CASES = [(2, 1, 1), (2, 2, 1), (2, 3, 1), (2, 3, 2), (1, 1, 2)]

# --------------------------------------------------------------------------
# The masks, as runtime/Philox.h makes them
# --------------------------------------------------------------------------
U32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of counters (arrays of 32-bit values held in uint64)."""
    c = [np.asarray(x, dtype=np.uint64) for x in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0), np.uint64(k1)
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [((p1 >> np.uint64(32)) ^ c[1] ^ k0) & U32, p1 & U32,
             ((p0 >> np.uint64(32)) ^ c[3] ^ k1) & U32, p0 & U32]
        k0 = (k0 + np.uint64(0x9E3779B9)) & U32
        k1 = (k1 + np.uint64(0xBB67AE85)) & U32
    return c


def fnv1a32(name):
    h = 2166136261
    for b in name.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def threshold(p):
    return math.ceil(float(np.float32(p)) * 2.0 ** 32)


def scale(p):
    return np.float32(1.0 / (1.0 - float(np.float32(p))))


def keep_mask(shape, p, seed, step, first_sample, site, batch=None):
    """The kept elements of a tensor of `batch` samples (default: its leading
    dim), sample b being global sample first_sample + b, at 0-based `step`."""
    batch = batch or shape[0]
    per = math.prod(shape) // batch
    idx = np.arange(per, dtype=np.uint64)
    rows = []
    for b in range(batch):
        n = np.full_like(idx, 0)
        words = philox4x32_10(idx >> np.uint64(2), n + np.uint64(site),
                              n + np.uint64(first_sample + b), n + np.uint64(step),
                              seed & 0xFFFFFFFF, seed >> 32)
        w = np.choose((idx & np.uint64(3)).astype(np.int64), words)
        rows.append(w >= np.uint64(threshold(p)))
    return np.stack(rows).reshape(shape)


# --------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------

class Layer(nn.Module):
    """Pre-norm layer: attention whose probabilities pass an nn.Dropout, then a
    GELU feed-forward whose output passes another. The causal mask is made in
    forward from the sequence length (no buffer)."""

    def __init__(self):
        super().__init__()
        self.norm_a, self.norm_f = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.mix = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.prob_drop = nn.Dropout(P)
        self.grow, self.shrink = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)
        self.ff_drop = nn.Dropout(P)

    def forward(self, x):
        n, t, width = x.shape
        d = width // HEADS
        q, k, v = (part.view(n, t, HEADS, d).transpose(1, 2)
                   for part in self.qkv(self.norm_a(x)).chunk(3, dim=-1))
        causal = torch.tril(torch.ones(t, t, device=x.device)).view(1, 1, t, t)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
        probs = self.prob_drop(F.softmax(scores.masked_fill(causal == 0, float("-inf")), -1))
        x = x + self.mix(torch.matmul(probs, v).transpose(1, 2).reshape(n, t, width))
        return x + self.ff_drop(self.shrink(F.gelu(self.grow(self.norm_f(x)))))


class Model(nn.Module):
    """Token plus learned position embeddings (an nn.Dropout on their sum),
    LAYERS layers, a final LayerNorm and an untied head."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.in_drop = nn.Dropout(P)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.out = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.in_drop(self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device)))
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.out(self.norm(x)).view(-1, VOCAB), targets.view(-1))


def make_model():
    torch.manual_seed(1234)
    return Model()


def dropout_call_order(model):
    """The nn.Dropout modules in the order one forward calls them."""
    order = []
    hooks = [m.register_forward_hook(lambda m, i, o: order.append(m))
             for m in model.modules() if isinstance(m, nn.Dropout)]
    x = torch.zeros(GLOBAL, SEQ, dtype=torch.long)
    with torch.no_grad():
        model(x, x)
    for h in hooks:
        h.remove()
    return order


def torch_train(data, sites, seed):
    """PyTorch training with the compiler's masks in every nn.Dropout."""
    model = make_model()
    state = {"step": 0}
    for module, site in zip(dropout_call_order(model), sites):
        def forward(x, p=module.p, site=site):
            keep = keep_mask(tuple(x.shape), p, seed, state["step"], 0, site)
            return x * torch.tensor(keep.astype(np.float32) * scale(p))
        module.forward = forward
    return torch_reference.train(
        model, model.parameters(), torch_reference.sequential_batches(data, STEPS, GLOBAL, SEQ),
        HP, before_step=lambda step: state.update(step=step))


def export(path):
    import warnings
    warnings.simplefilter("ignore")  # constant folding in training mode, tracing
    model = make_model()
    x = torch.zeros(GLOBAL, SEQ, dtype=torch.long)
    torch.onnx.export(model, (x, x), path, input_names=["idx", "targets"],
                      output_names=["loss"], training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=True,
                      dynamic_axes={"idx": {0: "batch"}, "targets": {0: "batch"}})
    graph = onnx.load(path).graph
    return [n for n in graph.node if n.op_type == "Dropout"]


def compile_model(out, onnx_path, dp, zero, accum, extra=()):
    r = subprocess.run([TOOL, "compile", onnx_path, "-o", out, "--batch-size",
                        str(GLOBAL // (dp * accum)), "--seq-len", str(SEQ), "--dp", str(dp),
                        "--zero-stage", str(zero)] + list(extra), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("compile: " + r.stderr[-2000:])


def gpu_present():
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"no CUDA GPU (nvidia-smi: {e})"
    if r.returncode != 0 or "GPU" not in r.stdout:
        return False, "no CUDA GPU (nvidia-smi -L lists none)"
    return True, r.stdout.strip().splitlines()[0]


def train(work, onnx_path, data_path, dp, zero, accum, seed=0, target="cpu"):
    out = os.path.join(work, f"dp{dp}-zero{zero}-acc{accum}-{target}")
    if not os.path.exists(os.path.join(out, "train")):
        compile_model(out, onnx_path, dp, zero, accum, ["--target", target])
    metrics = os.path.join(out, f"metrics-seed{seed}.jsonl")
    cmd = [os.path.join(out, "train"), "--data", data_path, "--steps", str(STEPS),
           "--sampler", "sequential", "--grad-accum", str(accum), "--seed", str(seed),
           "--metrics", metrics]
    cmd += [a for k, v in HP.items() for a in (f"--{k.replace('_', '-')}", repr(v))]
    r = subprocess.run((MPIRUN + ["-np", str(dp)] if dp > 1 else []) + cmd,
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        raise RuntimeError("train: " + (r.stderr or r.stdout)[-2000:])
    return [json.loads(line)["loss"] for line in open(metrics)]


def compare(ours, ref, rtol=RTOL):
    """(ok, detail): every step's loss within RTOL (relative) of REF's; a
    NaN or infinite loss, or a missing step, never is (loss_diff)."""
    worst, at = torch_reference.loss_diff(ours, ref)
    ok = len(ours) == STEPS and worst <= rtol
    if at >= min(len(ours), len(ref)):
        return False, f"{len(ours)} losses for {len(ref)} reference steps"
    return ok, (f"max rel diff {worst:.1e} at step {at + 1} "
                f"({ours[at]:.7f} vs {ref[at]:.7f})")


def main():
    torch.set_num_threads(2)
    results = []
    skipped = []

    def record(ok, name, detail=""):
        results.append(ok)
        print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)

    def skip(name, why):
        skipped.append(name)
        print(f"SKIP {name}: {why}", flush=True)

    kats = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
            ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
            ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
             (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    got = [tuple(int(w) for w in philox4x32_10(*c, *k)) for c, k, _ in kats]
    record(got == [e for _, _, e in kats], "Philox4x32-10 known-answer vectors (NumPy)")

    work = tempfile.mkdtemp(prefix="dropout-test-")
    data = np.frombuffer(open("/usr/share/common-licenses/GPL-3", "rb").read(),
                         dtype=np.uint8)[:20000] % VOCAB
    data = data.astype(np.uint16)
    data_path = os.path.join(work, "tokens.u16")
    data.tofile(data_path)
    onnx_path = os.path.join(work, "model.onnx")
    nodes = export(onnx_path)
    sites = [fnv1a32(n.output[0]) for n in nodes]
    record(len(nodes) == 1 + 2 * LAYERS, "the training-mode export has a Dropout per nn.Dropout",
           f"{len(nodes)} Dropout nodes")

    reference = torch_train(data, sites, 0)
    try:
        base = train(work, onnx_path, data_path, 1, 1, 1)
        ok, detail = compare(base, reference)
        record(ok, "dp 1 vs PyTorch with the same masks", detail)
    except RuntimeError as e:
        record(False, "dp 1 vs PyTorch with the same masks", str(e))
        base = None
    for dp, zero, accum in CASES:
        name = f"dp {dp} ZeRO-{zero} grad-accum {accum} vs dp 1"
        try:
            got = train(work, onnx_path, data_path, dp, zero, accum)
        except RuntimeError as e:
            record(False, name, str(e))
            continue
        ok1, d1 = compare(got, base) if base else (False, "no dp 1 run")
        ok2, d2 = compare(got, reference)
        record(ok1 and ok2, name, f"{d1}; vs PyTorch {d2}")
    try:
        other = train(work, onnx_path, data_path, 1, 1, 1, seed=1)
        rel = torch_reference.loss_diff(other, base)[0] if base else 0
        finite = all(math.isfinite(x) for x in other)  # NaN is not "other masks"
        record(finite and rel > 100 * RTOL, "--seed 1 draws other masks than --seed 0",
               f"max rel loss diff {rel:.1e}" + ("" if finite else "; a loss is not finite"))
    except RuntimeError as e:
        record(False, "--seed 1 draws other masks than --seed 0", str(e))
    for precision in ("fp32", "bf16"):
        name = f"the CUDA target ({precision}) builds with nvcc"
        try:
            compile_model(os.path.join(work, f"cuda-{precision}"), onnx_path, 1, 1, 1,
                          ["--target", "cuda", "--precision", precision])
            record(True, name)
        except RuntimeError as e:
            if "nvcc not found" in str(e):
                skip(name, "no CUDA toolkit")
            else:
                record(False, name, str(e))
    name = f"CUDA dp 1 vs the CPU target (within {RTOL:g})"
    present, why = gpu_present()
    if not present:
        skip(name, why)
    else:
        try:
            ok, detail = compare(train(work, onnx_path, data_path, 1, 1, 1, target="cuda"),
                                 base or [])
            record(ok, name, f"{why}: {detail}")
        except (RuntimeError, ValueError) as e:
            record(False, name, str(e))
    passed = sum(results)
    if passed == len(results):
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work files: {work}")
    print(f"dropout tests: {passed} passed, {len(results) - passed} failed, "
          f"{len(skipped)} skipped")
    return 1 if passed != len(results) else 0


if __name__ == "__main__":
    sys.exit(main())
