#!/usr/bin/python3
"""Export small GPT-2 / Llama style training graphs to ONNX for fastllm-opt.

Why this script exists
----------------------
fastllm-opt consumes an ONNX graph whose single output is the scalar training
loss and treats every floating-point initializer as a trainable parameter.
This script produces such graphs from PyTorch models with seeded random
weights (no downloads), so the importer and the passes can be tested on the
exact graph shapes that ``torch.onnx.export`` emits, in both constant-folding
modes.

Run it with the system interpreter (Debian python3-torch 1.13 and
python3-onnx 1.12), e.g.::

    /usr/bin/python3 test/models/export_models.py --model gpt2 \\
        --out /tmp/gpt2.onnx --fold on --info /tmp/gpt2.json

Graph contract
--------------
* inputs ``tokens`` and ``targets``: int64 ``[batch, seq]``, with the
  symbolic dims named "batch" and "seq";
* output ``loss``: float32 scalar, ``F.cross_entropy`` with mean reduction
  (exported as SoftmaxCrossEntropyLoss);
* the float initializers are exactly the model's nn.Parameters, the tied
  GPT-2 embedding/head weight once. The script checks this after export and
  exits non-zero if it does not hold.

How the models are written to keep that contract
------------------------------------------------
* With ``do_constant_folding`` on, the exporter turns ``Transpose(weight)``
  (emitted for every ``F.linear``/``nn.Linear`` on a 3-D input) into a new,
  pre-transposed initializer named ``onnx::MatMul_N``. For an untied weight
  that is just a relayout of the same parameter (same element count), so the
  body's nn.Linear layers are left in their natural form; ``--info`` records
  the mapping in ``param_map``. For the tied GPT-2 head it would duplicate
  the embedding, so the head is written as ``torch.mm(x2d, wte.weight.t())``,
  which the exporter's peephole pass turns into ``Gemm(transB=1)`` reading
  ``wte.weight`` directly, in both folding modes.
* Nothing float is registered as a buffer. The rotary ``inv_freq`` is
  computed inside ``forward`` from Python constants, so the tracer records it
  as a Constant node (never an initializer); the cos/sin tables depend on
  ``torch.arange(T)`` with the dynamic T and stay as graph ops.
* The causal mask is built from the dynamic T: ``torch.tril(ones(T, T))``
  (exported as ConstantOfShape + Trilu, opset >= 14), or, for opset 13 where
  the exporter has no ``tril``, from comparing two ``arange(T)`` vectors.
* Weights are seeded; norm gains and biases are perturbed away from 1/0 so
  that a numeric test notices any parameter that is dropped or misused
  (``--init-std`` raises the weight scale when more sensitivity is wanted).

Checks done after export: onnx.checker, float-initializer element count ==
``sum(p.numel() for p in model.parameters())``, input dims named
batch/seq, single output ``loss``; with ``--check-numeric`` also the loss of
the ONNX graph (run by onnx_numpy_ref.py, beside this file) at a batch/seq
different from the traced one against PyTorch. Any failure exits 1.
Output is byte-identical across runs for the same arguments.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import onnx
from onnx import numpy_helper

FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
}


# --------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------

def causal_mask(T, mask_kind, device=None):
    """Boolean [T, T] lower-triangular mask built from the dynamic length T
    (on `device`: the tokens', so that the model also runs on a GPU)."""
    if mask_kind == "tril":
        return torch.tril(torch.ones(T, T, dtype=torch.bool, device=device))
    # "compare": key position <= query position; no Trilu needed.
    pos = torch.arange(T, device=device)
    return pos.unsqueeze(0) <= pos.unsqueeze(1)


def attention(q, k, v, mask, fill, head_dim):
    """Hand-written causal attention on [B, H, T, hd] tensors."""
    scale = 1.0 / math.sqrt(head_dim)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~mask, fill)
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v)


def split_heads(x, n_heads, head_dim):
    """[B, T, H*hd] -> [B, H, T, hd]; H and hd are Python ints (constants)."""
    B, T = x.shape[0], x.shape[1]
    return x.view(B, T, n_heads, head_dim).transpose(1, 2)


def merge_heads(x, d_model):
    """[B, H, T, hd] -> [B, T, H*hd]."""
    B, T = x.shape[0], x.shape[2]
    return x.transpose(1, 2).reshape(B, T, d_model)


def mask_fill_value(kind):
    return float("-inf") if kind == "inf" else torch.finfo(torch.float32).min


# --------------------------------------------------------------------------
# GPT-2
# --------------------------------------------------------------------------

def gelu_tanh(x):
    """0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))), written out by hand."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                       * (x + 0.044715 * x * x * x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.d_model
        self.cfg = cfg
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def gelu(self, x):
        if self.cfg.gelu == "erf":
            return F.gelu(x)
        if self.cfg.gelu == "tanh":
            # torch 1.13 exports approximate='tanh' as the spelled-out formula.
            return F.gelu(x, approximate="tanh")
        return gelu_tanh(x)  # "tanh-manual"

    def forward(self, x, mask):
        cfg = self.cfg
        d = cfg.d_model
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        hd = d // cfg.heads
        y = attention(split_heads(q, cfg.heads, hd),
                      split_heads(k, cfg.heads, hd),
                      split_heads(v, cfg.heads, hd), mask,
                      mask_fill_value(cfg.mask_fill), hd)
        x = x + self.c_proj(merge_heads(y, d))
        x = x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))
        return x


class GPT2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
        mask = causal_mask(T, self.cfg.mask, tokens.device)
        for blk in self.blocks:
            x = blk(x, mask)
        x = self.ln_f(x)
        # Tied head. torch.mm + .t() becomes Gemm(transB=1) on wte.weight;
        # F.linear would give a foldable Transpose (duplicate initializer).
        logits = torch.mm(x.reshape(-1, self.cfg.d_model), self.wte.weight.t())
        return F.cross_entropy(logits, targets.reshape(-1))


# --------------------------------------------------------------------------
# Llama
# --------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) \
            * self.weight


def rotate_half(x, head_dim):
    half = head_dim // 2  # Python int: constant Slice bounds
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_tables(T, head_dim, base=10000.0, device=None):
    """cos/sin [T, head_dim] computed in forward (no float buffers).

    inv_freq only depends on Python constants, so the tracer records it as a
    Constant node; positions come from the dynamic T.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    pos = torch.arange(T, device=device).float()
    freqs = pos.unsqueeze(1) * inv_freq.unsqueeze(0)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class LlamaBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.d_model
        self.cfg = cfg
        self.attn_norm = RMSNorm(d)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.ffn_norm = RMSNorm(d)
        self.w1 = nn.Linear(d, cfg.ffn, bias=False)
        self.w3 = nn.Linear(d, cfg.ffn, bias=False)
        self.w2 = nn.Linear(cfg.ffn, d, bias=False)

    def forward(self, x, mask, cos, sin):
        cfg = self.cfg
        h = self.attn_norm(x)
        hd = cfg.d_model // cfg.heads
        q = split_heads(self.wq(h), cfg.heads, hd)
        k = split_heads(self.wk(h), cfg.heads, hd)
        v = split_heads(self.wv(h), cfg.heads, hd)
        q = q * cos + rotate_half(q, hd) * sin
        k = k * cos + rotate_half(k, hd) * sin
        y = attention(q, k, v, mask, mask_fill_value(cfg.mask_fill), hd)
        x = x + self.wo(merge_heads(y, cfg.d_model))
        h = self.ffn_norm(x)
        x = x + self.w2(F.silu(self.w1(h)) * self.w3(h))
        return x


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.tok_embeddings(tokens)
        mask = causal_mask(T, self.cfg.mask, tokens.device)
        cos, sin = rotary_tables(T, self.cfg.d_model // self.cfg.heads, device=tokens.device)
        for blk in self.blocks:
            x = blk(x, mask, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, self.cfg.vocab),
                               targets.view(-1))


# --------------------------------------------------------------------------
# Construction, export, verification
# --------------------------------------------------------------------------

def init_weights(model, seed, std):
    """Deterministic init: N(0, std) matrices and biases, norm gains 1 +/- 0.1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 or name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            else:  # LayerNorm / RMSNorm gain
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.1)


def build_model(cfg):
    torch.manual_seed(cfg.seed)
    model = GPT2(cfg) if cfg.model == "gpt2" else Llama(cfg)
    init_weights(model, cfg.seed, cfg.init_std)
    model.eval()
    return model


def example_inputs(cfg, batch=2):
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq), generator=gen)
    targets = torch.randint(0, cfg.vocab, (batch, cfg.seq), generator=gen)
    return tokens, targets


def float_initializers(graph):
    return [t for t in graph.initializer if t.data_type in FLOAT_TYPES]


def param_map(model, inits):
    """Map each float initializer to the torch parameter it holds.

    Returns {onnx_name: {"param": torch_name, "transposed": bool}}; a folded
    linear weight is stored as the transpose of the torch weight.
    """
    params = [(n, p.detach().numpy()) for n, p in model.named_parameters()]
    out = {}
    for t in inits:
        arr = numpy_helper.to_array(t)
        hit = None
        for n, p in params:
            if p.shape == arr.shape and (p == arr).all():
                hit = {"param": n, "transposed": False}
                break
        if hit is None:
            for n, p in params:
                if p.ndim == 2 and p.T.shape == arr.shape and (p.T == arr).all():
                    hit = {"param": n, "transposed": True}
                    break
        out[t.name] = hit
    return out


def check_numeric(cfg, model, proto, batch=3, rtol=1e-4):
    """Loss of the ONNX graph (NumPy reference) vs PyTorch at a new shape."""
    sys.dont_write_bytecode = True  # keep test/models free of __pycache__
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import onnx_numpy_ref

    T = max(2, cfg.seq // 2 + 1)
    gen = torch.Generator().manual_seed(cfg.seed + 2)
    tokens = torch.randint(0, cfg.vocab, (batch, T), generator=gen)
    targets = torch.randint(0, cfg.vocab, (batch, T), generator=gen)
    with torch.no_grad():
        ref = float(model(tokens, targets))
    (got,) = onnx_numpy_ref.evaluate(
        proto, {"tokens": tokens.numpy(), "targets": targets.numpy()})
    got = float(got)
    return {"batch": batch, "seq": T, "torch": ref, "onnx": got,
            "ok": abs(got - ref) <= rtol * abs(ref)}


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Export a seeded GPT-2/Llama training-loss graph to ONNX.")
    ap.add_argument("--model", choices=["gpt2", "llama"], required=True)
    ap.add_argument("--out", required=True, help="output .onnx file")
    ap.add_argument("--fold", choices=["on", "off"], default="on",
                    help="torch.onnx.export do_constant_folding")
    ap.add_argument("--gelu", choices=["erf", "tanh", "tanh-manual"],
                    default="erf",
                    help="gpt2 GELU: erf (F.gelu), tanh (F.gelu approximate="
                         "'tanh'), tanh-manual (formula written in torch)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq", type=int, default=64,
                    help="gpt2 max positions; also the example/trace length")
    ap.add_argument("--ffn", type=int, default=None,
                    help="llama MLP hidden size (default: 8d/3 rounded up "
                         "to a multiple of 32)")
    ap.add_argument("--mask", choices=["auto", "tril", "compare"],
                    default="auto",
                    help="causal mask form; auto = tril for opset >= 14, "
                         "compare (arange <= arange) below")
    ap.add_argument("--mask-fill", choices=["inf", "min"], default="inf",
                    help="masked score value: -inf or float32 lowest")
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-std", type=float, default=0.02,
                    help="std of the random weights (larger values make the "
                         "loss more sensitive to numeric errors)")
    ap.add_argument("--info", default=None, help="write metadata JSON here")
    ap.add_argument("--check-numeric", action="store_true",
                    help="also run the exported graph with onnx_numpy_ref.py "
                         "at batch 3, seq//2+1 (not the traced shape) and "
                         "compare the loss with PyTorch")
    cfg = ap.parse_args(argv)
    if cfg.d_model % cfg.heads:
        ap.error("--d-model must be divisible by --heads")
    if cfg.model == "llama" and (cfg.d_model // cfg.heads) % 2:
        ap.error("llama head dim must be even (rotary)")
    if cfg.ffn is None:
        cfg.ffn = 32 * math.ceil(int(8 * cfg.d_model / 3) / 32)
    if cfg.mask == "auto":
        cfg.mask = "tril" if cfg.opset >= 14 else "compare"
    if cfg.mask == "tril" and cfg.opset < 14:
        ap.error("--mask tril needs opset >= 14 (Trilu)")
    return cfg


def main(argv=None):
    cfg = parse_args(argv)
    model = build_model(cfg)
    tokens, targets = example_inputs(cfg)
    with torch.no_grad():
        loss = float(model(tokens, targets))

    out_dir = os.path.dirname(os.path.abspath(cfg.out))
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.perf_counter()
    torch.onnx.export(
        model, (tokens, targets), cfg.out,
        input_names=["tokens", "targets"],
        output_names=["loss"],
        dynamic_axes={"tokens": {0: "batch", 1: "seq"},
                      "targets": {0: "batch", 1: "seq"}},
        opset_version=cfg.opset,
        do_constant_folding=(cfg.fold == "on"))
    export_s = time.perf_counter() - t0

    proto = onnx.load(cfg.out)
    onnx.checker.check_model(proto)
    graph = proto.graph
    inits = float_initializers(graph)
    onnx_params = sum(math.prod(t.dims) for t in inits)
    torch_params = sum(p.numel() for p in model.parameters())
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    op_types = sorted({n.op_type for n in graph.node})

    print(f"{cfg.out}: {os.path.getsize(cfg.out)} bytes, export {export_s:.2f}s, "
          f"opset {opset}, ir_version {proto.ir_version}, "
          f"{len(graph.node)} nodes, float init elems {onnx_params}, "
          f"torch params {torch_params}, loss {loss:.6f}", file=sys.stderr)

    errors = []
    if onnx_params != torch_params:
        errors.append(f"float initializer elements {onnx_params} != "
                      f"torch parameter elements {torch_params}: "
                      + ", ".join(f"{t.name}{list(t.dims)}" for t in inits))
    for inp in graph.input[:2]:
        dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
        if dims != ["batch", "seq"]:
            errors.append(f"input {inp.name} has dims {dims}, "
                          "expected ['batch', 'seq']")
    if [o.name for o in graph.output] != ["loss"]:
        errors.append("graph output is not just 'loss'")

    numeric = None
    if cfg.check_numeric:
        numeric = check_numeric(cfg, model, proto)
        print(f"numeric check: {numeric}", file=sys.stderr)
        if not numeric["ok"]:
            errors.append(f"ONNX loss differs from PyTorch: {numeric}")

    if cfg.info:
        pmap = param_map(model, inits)
        info = {
            "model": cfg.model,
            "fold": cfg.fold,
            "gelu": cfg.gelu if cfg.model == "gpt2" else None,
            "config": {"layers": cfg.layers, "d_model": cfg.d_model,
                       "heads": cfg.heads, "vocab": cfg.vocab, "seq": cfg.seq,
                       "ffn": cfg.ffn if cfg.model == "llama" else 4 * cfg.d_model,
                       "mask": cfg.mask, "mask_fill": cfg.mask_fill,
                       "seed": cfg.seed, "init_std": cfg.init_std},
            "trainable_params": onnx_params,
            "param_names": [t.name for t in inits],
            "param_map": pmap,
            "op_types": op_types,
            "opset": opset,
            "ir_version": proto.ir_version,
            "loss": loss,
            "numeric_check": numeric,
            "example": {"batch": int(tokens.shape[0]), "seq": int(tokens.shape[1]),
                        "generator": "torch.Generator().manual_seed(seed+1); "
                                     "tokens then targets = randint(0, vocab, (2, seq))",
                        "tokens_sha256": hashlib.sha256(tokens.numpy().tobytes()).hexdigest()},
        }
        if any(v is None for v in pmap.values()):
            errors.append("float initializers not matching any parameter: "
                          + ", ".join(k for k, v in pmap.items() if v is None))
        with open(cfg.info, "w") as f:
            json.dump(info, f, indent=1)
            f.write("\n")

    if errors:
        for e in errors:
            print("export_models.py: ERROR: " + e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
