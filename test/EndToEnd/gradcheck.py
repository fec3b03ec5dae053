#!/usr/bin/python3
# REQUIRES: torch, onnx
# RUN: %python %s --tool fastllm-opt
"""Every gradient rule of the compiler, checked numerically against PyTorch.

One small PyTorch model holds one term per ONNX op / gradient rule (several
per rule where the rule has distinct cases: broadcasting, batched matmuls,
exponent kinds, reduction axes, ignored targets, ...). Its loss is

    cross_entropy(embedding(tokens) @ head, targets)
      + sum_k c_k * (f_k(params_k) * R_k).sum()

where every term f_k reads its own small parameters (named RULE_VARIANT_ARG,
so a failure names the rule), R_k is a fixed random tensor built inside
forward() with torch.tensor(list) (so it exports as an ONNX Constant, not an
initializer) and c_k a fixed weight in [0.5, 1], folded into R_k. The outer
sum is one ReduceSum over the concatenated products f_k * R_k: the generated
C++ instantiates a template per elementwise op, and a Mul + Add per term
would double the compile time (about 90 s for the whole model as it is).

The model is exported to ONNX (opset 17, no constant folding, so initializer
names are the PyTorch names), compiled with `fastllm-opt compile`, and the
generated binary runs one step with `--dump-grads`. Each dumped gradient must
match PyTorch autograd's gradient of the same loss on the same batch (the
step-0 sequential batch, --grad-accum 1):

    max |ours - torch| <= 1e-6 * max(1, max |torch|)      per parameter,

and no NaN or infinity anywhere (a NaN fails whatever the ratio says).

PyTorch is the oracle, run here at test time (in float64, so the reference
carries no float32 rounding of its own); nothing is a stored expectation.
The test also checks itself: every parameter is an ONNX initializer, every
rule's ONNX op is in the exported graph, and no reference gradient is ~0.

Notes on what the pipeline accepts (all rules fit in one ONNX model):
* Cast: f32 -> f64 -> f32 is supported and tested; casts to f16 / bf16 are
  rejected by the CPU target ("element type 'f16' is not supported by the
  CPU target"), so they are not in the model.
* Every loss bounds the token ids: the binary takes the vocabulary size as
  the smallest class dim over all losses (and gathers of the tokens), so the
  extra CrossEntropy / NLLLoss terms use VOCAB classes.
* torch exports nll_loss(log_softmax(x)) as SoftmaxCrossEntropyLoss, and
  torch.rsqrt as Reciprocal(Sqrt(x)) (model.rsqrt only comes from the RMSNorm
  fusion). The compiler may fuse GELU / SiLU / RMSNorm spelled out by the
  exporter into single ops; the test holds either way and says which form the
  plan used.
* Dropout (training mode, F.dropout(training=True)) is random: the reference
  multiplies by the compiled step's own mask (Philox, test/EndToEnd/dropout.py),
  so the rule checks that the backward regenerates the forward's mask.

Prints `PASS rule (worst ratio R at PARAM)` / `FAIL rule: ...` once per rule,
where ratio = max|ours - torch| / max(1, max|torch|) over the rule's
parameters, and a last line `gradcheck: P passed, F failed`; exits 1 on any
failure. --keep DIR keeps the work files, -v prints every parameter, --rules
A,B checks a subset (a smaller, faster model).
"""
import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import torch_reference  # noqa: E402
import dropout as philox_dropout  # noqa: E402  (the masks, as runtime/Philox.h)

VOCAB = 256
DIM = 8          # embedding width of the main (token) path
BATCH, SEQ = 2, 16
# ratio bound (see the docstring); the worst measured is 3.1e-7 (CrossEntropy's
# head), all but two rules under 1.5e-7.
TOL = 1e-6

# --------------------------------------------------------------------------
# The terms: @term(rule, variant, ONNX ops it must exercise, arg=(shape, domain))
# Domains: "n" standard normal, "p" positive in [0.5, 2], "z" nonzero with
# |x| in [0.3, 1.5] (Relu, Where masks, ReduceMax: no ties, no kinks), "t"
# normal but with the row maximum twice (a ReduceMax tie), "a" as "z" with
# alternating signs in row-major order (a mask that is surely mixed).
# --------------------------------------------------------------------------
TERMS = []
RULE_OPS = {}


def term(rule, variant, ops, **params):
    def wrap(fn):
        TERMS.append((rule, variant, fn, params, set(ops)))
        RULE_OPS.setdefault(rule, set()).update(ops)
        return fn
    return wrap


def targets_const(values):
    """Integer class ids as an ONNX Constant."""
    return torch.tensor(values, dtype=torch.int64)


# Elementwise binary, with broadcasting on the parameter operands.
@term("Add", "bcast", ["Add"], a=((3, 5), "n"), b=((5,), "n"))
def _(P): return P["a"] + P["b"]
@term("Sub", "bcast", ["Sub"], a=((3, 5), "n"), b=((3, 1), "n"))
def _(P): return P["a"] - P["b"]
@term("Mul", "same", ["Mul"], a=((3, 5), "n"), b=((3, 5), "n"))
def _(P): return P["a"] * P["b"]
@term("Mul", "bcast2", ["Mul"], a=((3, 5), "n"), b=((4, 1, 5), "n"))
def _(P): return P["a"] * P["b"]
@term("Div", "same", ["Div"], a=((3, 5), "n"), b=((3, 5), "p"))
def _(P): return P["a"] / P["b"]
@term("Div", "bcast", ["Div"], a=((3, 5), "n"), b=((5,), "p"))
def _(P): return P["a"] / P["b"]
@term("Pow", "c1", ["Pow"], x=((3, 5), "n"))
def _(P): return P["x"] ** 1.0
@term("Pow", "c2", ["Pow"], x=((3, 5), "n"))
def _(P): return P["x"] ** 2.0
@term("Pow", "c3", ["Pow"], x=((3, 5), "n"))
def _(P): return P["x"] ** 3.0
@term("Pow", "c05", ["Pow"], x=((3, 5), "p"))
def _(P): return P["x"] ** 0.5
@term("Pow", "param", ["Pow"], x=((3, 5), "p"), y=((3, 5), "n"))
def _(P): return P["x"] ** P["y"]
@term("Pow", "paramb", ["Pow"], x=((3, 5), "p"), y=((5,), "n"))
def _(P): return P["x"] ** P["y"]
@term("Where", "cmp", ["Where", "Greater"], a=((3, 5), "z"), b=((5,), "n"))
def _(P): return torch.where(P["a"] > 0.0, P["a"], P["b"])
@term("Where", "bcast-cond", ["Where", "Less"], a=((3, 5), "a"), b=((3, 5), "n"))
def _(P): return torch.where(P["a"][:, :1] < 0.0, P["b"], P["a"] * 2.0)
@term("Where", "masked_fill", ["Where"], a=((3, 5), "z"))
def _(P): return P["a"].masked_fill(P["a"] < -0.5, -3.0)

# Elementwise unary.
@term("Sqrt", "p", ["Sqrt"], x=((3, 5), "p"))
def _(P): return torch.sqrt(P["x"])
@term("Reciprocal", "z", ["Reciprocal"], x=((3, 5), "z"))
def _(P): return torch.reciprocal(P["x"])
# torch.rsqrt exports as Reciprocal(Sqrt(x)): model.rsqrt is only reachable
# through the RMSNorm fusion.
@term("Rsqrt", "p", ["Reciprocal", "Sqrt"], x=((3, 5), "p"))
def _(P): return torch.rsqrt(P["x"])
@term("Neg", "n", ["Neg"], x=((3, 5), "n"))
def _(P): return -P["x"]
@term("Exp", "n", ["Exp"], x=((3, 5), "n"))
def _(P): return torch.exp(P["x"])
@term("Log", "p", ["Log"], x=((3, 5), "p"))
def _(P): return torch.log(P["x"])
@term("Tanh", "n", ["Tanh"], x=((3, 5), "n"))
def _(P): return torch.tanh(P["x"])
@term("Erf", "n", ["Erf"], x=((3, 5), "n"))
def _(P): return torch.erf(P["x"])
@term("Sigmoid", "n", ["Sigmoid"], x=((3, 5), "n"))
def _(P): return torch.sigmoid(P["x"])
@term("Relu", "z", ["Relu"], x=((3, 5), "z"))
def _(P): return torch.relu(P["x"])
@term("Sin", "n", ["Sin"], x=((3, 5), "n"))
def _(P): return torch.sin(P["x"])
@term("Cos", "n", ["Cos"], x=((3, 5), "n"))
def _(P): return torch.cos(P["x"])

# Linear algebra.
@term("MatMul", "2d", ["MatMul"], a=((3, 4), "n"), b=((4, 5), "n"))
def _(P): return torch.matmul(P["a"], P["b"])
@term("MatMul", "3dx2d", ["MatMul"], a=((2, 3, 4), "n"), b=((4, 5), "n"))
def _(P): return torch.matmul(P["a"], P["b"])
@term("MatMul", "2dx3d", ["MatMul"], a=((3, 4), "n"), b=((2, 4, 5), "n"))
def _(P): return torch.matmul(P["a"], P["b"])
@term("MatMul", "bcast4d", ["MatMul"], a=((2, 1, 3, 4), "n"), b=((3, 4, 5), "n"))
def _(P): return torch.matmul(P["a"], P["b"])
@term("MatMul", "vec-mat", ["MatMul"], a=((4,), "n"), b=((4, 5), "n"))
def _(P): return torch.matmul(P["a"], P["b"])
@term("MatMul", "mat-vec", ["MatMul"], a=((2, 3, 4), "n"), b=((4,), "n"))
def _(P): return torch.matmul(P["a"], P["b"])
@term("Gemm", "linear", ["Gemm"], x=((3, 4), "n"), w=((5, 4), "n"), b=((5,), "n"))
def _(P): return F.linear(P["x"], P["w"], P["b"])

# Data movement.
@term("Transpose", "perm", ["Transpose"], x=((2, 3, 4), "n"))
def _(P): return P["x"].permute(2, 0, 1)
@term("Transpose", "t", ["Transpose"], x=((3, 5), "n"))
def _(P): return P["x"].t() * 1.5
@term("Reshape", "2d", ["Reshape"], x=((3, 4), "n"))
def _(P): return P["x"].reshape(2, 6)
@term("Reshape", "flatten", ["Flatten"], x=((2, 3, 4), "n"))
def _(P): return torch.flatten(P["x"], 1)
@term("Reshape", "unsqueeze", ["Unsqueeze", "Squeeze"], x=((3, 4), "n"), y=((3, 4), "n"))
def _(P): return (P["x"].unsqueeze(1) * P["y"].unsqueeze(0)).sum(2).unsqueeze(-1).squeeze(-1)
@term("Slice", "step2", ["Slice"], x=((6, 7), "n"))
def _(P): return P["x"][:, 1::2]
@term("Slice", "2axes", ["Slice"], x=((6, 7), "n"))
def _(P): return P["x"][1:5:3, ::3]
@term("Slice", "neg", ["Slice"], x=((6, 7), "n"))
def _(P): return P["x"][-3:, :-2]
@term("Slice", "3d-mid", ["Slice"], x=((2, 6, 3), "n"))
def _(P): return P["x"][:, 1:6:2, 1:]
@term("Concat", "dim1", ["Concat"], a=((3, 2), "n"), b=((3, 4), "n"))
def _(P): return torch.cat([P["a"], P["b"]], dim=1)
@term("Concat", "dim0x3", ["Concat"], a=((1, 4), "n"), b=((2, 4), "n"), c=((3, 4), "n"))
def _(P): return torch.cat([P["a"], P["b"], P["c"]], dim=0)
@term("Split", "all", ["Split"], x=((3, 6), "n"))
def _(P):
    a, b, c = torch.split(P["x"], [1, 2, 3], dim=1)
    return torch.cat([a * 2.0, torch.exp(b), c * c], dim=1)
@term("Split", "unused", ["Split"], x=((3, 6), "n"))
def _(P):
    a, _b, c = torch.split(P["x"], [2, 2, 2], dim=1)
    return a * c
@term("Gather", "rows", ["Gather"], x=((4, 5), "n"))
def _(P): return P["x"][targets_const([0, 2, 2, 1, 2])]
@term("Gather", "dim1", ["Gather"], x=((4, 5), "n"))
def _(P): return torch.index_select(P["x"], 1, targets_const([4, 0, 4, 4]))
@term("Gather", "idx2d", ["Gather"], x=((4, 5), "n"))
def _(P): return P["x"][targets_const([[3, 1], [1, 3], [0, 3]])]
@term("Gather", "negidx", ["Gather"], x=((4, 5), "n"))
def _(P): return P["x"][targets_const([-1, 0, -1, -3])]
@term("Gather", "scalar", ["Gather"], x=((4, 5), "n"))
def _(P): return P["x"][2] * P["x"][0]
@term("Gather", "tied", ["Gather", "MatMul"], x=((6, 4), "n"))
def _(P): return F.embedding(targets_const([5, 1, 5]), P["x"]) @ P["x"].t()
@term("Expand", "col", ["Expand"], x=((3, 1), "n"))
def _(P): return P["x"].expand(3, 5)
@term("Expand", "lead", ["Expand"], x=((5,), "n"))
def _(P): return P["x"].expand(2, 3, 5)
@term("Expand", "mid", ["Expand"], x=((3, 1, 5), "n"))
def _(P): return P["x"].expand(3, 4, 5)
@term("Cast", "f64", ["Cast"], x=((3, 5), "n"))
def _(P):
    y = P["x"].to(torch.float64)
    return (y * y).to(P["x"].dtype)

# Reductions.
@term("ReduceSum", "dim1", ["ReduceSum"], x=((3, 5), "n"))
def _(P): return P["x"].sum(dim=1)
@term("ReduceSum", "keep02", ["ReduceSum"], x=((2, 3, 4), "n"))
def _(P): return P["x"].sum(dim=(0, 2), keepdim=True)
@term("ReduceMean", "dim0", ["ReduceMean"], x=((3, 5), "n"))
def _(P): return P["x"].mean(dim=0)
@term("ReduceMean", "keeplast", ["ReduceMean"], x=((2, 3, 4), "n"))
def _(P): return P["x"].mean(dim=-1, keepdim=True)
@term("ReduceMax", "dim1", ["ReduceMax"], x=((3, 5), "z"))
def _(P): return torch.amax(P["x"], dim=1)
@term("ReduceMax", "keep02", ["ReduceMax"], x=((2, 3, 4), "z"))
def _(P): return torch.amax(P["x"], dim=(0, 2), keepdim=True)
# Ties share the gradient evenly in torch.amax; the rule says it does too.
@term("ReduceMax", "ties", ["ReduceMax"], x=((3, 5), "t"))
def _(P): return torch.amax(P["x"], dim=-1)

# Softmax family and normalisations.
@term("Softmax", "last", ["Softmax"], x=((4, 5), "n"))
def _(P): return torch.softmax(P["x"], dim=-1)
@term("Softmax", "dim0", ["Softmax"], x=((4, 5), "n"))
def _(P): return torch.softmax(P["x"], dim=0)
@term("Softmax", "mid", ["Softmax"], x=((2, 3, 4), "n"))
def _(P): return torch.softmax(P["x"], dim=1)
@term("LogSoftmax", "last", ["LogSoftmax"], x=((4, 5), "n"))
def _(P): return torch.log_softmax(P["x"], dim=-1)
@term("LogSoftmax", "dim0", ["LogSoftmax"], x=((4, 5), "n"))
def _(P): return torch.log_softmax(P["x"], dim=0)
@term("LayerNorm", "bias", ["LayerNormalization"], x=((4, 5), "n"), w=((5,), "n"), b=((5,), "n"))
def _(P): return F.layer_norm(P["x"], (5,), P["w"], P["b"])
@term("LayerNorm", "nobias", ["LayerNormalization"], x=((4, 5), "n"), w=((5,), "n"))
def _(P): return F.layer_norm(P["x"], (5,), P["w"], None)
@term("LayerNorm", "2dims", ["LayerNormalization"], x=((2, 3, 5), "n"), w=((3, 5), "n"), b=((3, 5), "n"))
def _(P): return F.layer_norm(P["x"], (3, 5), P["w"], P["b"], eps=1e-3)

# Losses (the token cross-entropy of the main path counts too). Their class
# dim is VOCAB: the compiler bounds the token ids by the class dim of every
# loss in the graph (CppEmitter::emitPlan), so a smaller one would make the
# binary reject the data.
@term("CrossEntropy", "ignore", ["SoftmaxCrossEntropyLoss"], x=((4, VOCAB), "n"))
def _(P): return F.cross_entropy(P["x"], targets_const([3, -100, 255, 3]))
@term("CrossEntropy", "3d-sum", ["SoftmaxCrossEntropyLoss"], x=((2, VOCAB, 3), "n"))
def _(P): return F.cross_entropy(P["x"], targets_const([[1, 200, 1], [0, -100, 2]]),
                                 reduction="sum")
# torch exports nll_loss(log_softmax(x)) as one SoftmaxCrossEntropyLoss, so
# that spelling is a CrossEntropy case; NegativeLogLikelihoodLoss needs its
# input to come from elsewhere (the "* 1.0" keeps the exporter from fusing).
@term("CrossEntropy", "nll(log_softmax)", ["SoftmaxCrossEntropyLoss"], x=((4, VOCAB), "n"))
def _(P): return F.nll_loss(F.log_softmax(P["x"], dim=-1), targets_const([7, -100, 7, 0]))
@term("NLLLoss", "logsm-ignore", ["NegativeLogLikelihoodLoss", "LogSoftmax"], x=((4, VOCAB), "n"))
def _(P): return F.nll_loss(F.log_softmax(P["x"], dim=-1) * 1.0, targets_const([7, -100, 7, 0]))
@term("NLLLoss", "raw", ["NegativeLogLikelihoodLoss"], x=((3, VOCAB), "n"))
def _(P): return F.nll_loss(P["x"], targets_const([9, 1, 9]))
@term("NLLLoss", "3d-sum", ["NegativeLogLikelihoodLoss", "LogSoftmax"], x=((2, VOCAB, 2), "n"))
def _(P): return F.nll_loss(F.log_softmax(P["x"], dim=1) * 1.0, targets_const([[3, 0], [-100, 3]]),
                            reduction="sum")

# Composites the compiler may fuse.
@term("GELU-erf", "F.gelu", ["Erf"], x=((3, 5), "n"))
def _(P): return F.gelu(P["x"])
@term("GELU-tanh", "F.gelu", ["Tanh"], x=((3, 5), "n"))
def _(P): return F.gelu(P["x"], approximate="tanh")
@term("SiLU", "F.silu", ["Sigmoid", "Mul"], x=((3, 5), "n"))
def _(P): return F.silu(P["x"])
@term("SiLU", "manual", ["Sigmoid", "Mul"], x=((3, 5), "n"))
def _(P): return P["x"] * torch.sigmoid(P["x"])
@term("CausalAttention", "masked_fill", ["MatMul", "Softmax", "Where"],
      q=((2, 4, 3), "n"), k=((2, 4, 3), "n"), v=((2, 4, 5), "n"))
def _(P):
    scores = P["q"] @ P["k"].transpose(-1, -2) * 0.5
    keep = torch.ones(4, 4, dtype=torch.bool).tril()
    p = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return p @ P["v"]
@term("RMSNorm", "manual", ["Pow", "ReduceMean", "Sqrt"], x=((4, 6), "n"), w=((6,), "n"))
def _(P):
    x = P["x"]
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * P["w"]


# Dropout in training mode (exported as Dropout with training_mode true). The
# reference drops what the compiled step drops: the Philox mask of --seed 0,
# step 0 and global samples 0 .. BATCH - 1 (the leading dim holds BATCH
# samples) at the node's site (test/EndToEnd/dropout.py computes it). Squaring
# makes the gradient 2 y m / (1 - p): it needs the backward's mask to be the
# forward's.
DROPOUT = {"sites": [], "calls": 0}


def dropout_term(x, p):
    if torch.onnx.is_in_onnx_export():
        return F.dropout(x, p, training=True)
    call = DROPOUT["calls"]
    DROPOUT["calls"] += 1
    site = DROPOUT["sites"][call] if call < len(DROPOUT["sites"]) else 0
    keep = philox_dropout.keep_mask(tuple(x.shape), p, 0, 0, 0, site, batch=BATCH)
    return x * torch.tensor(keep * float(philox_dropout.scale(p)), dtype=x.dtype)


@term("Dropout", "p0.3", ["Dropout"], x=((4, 6), "n"))
def _(P):
    y = dropout_term(P["x"], 0.3)
    return y * y
@term("Dropout", "p0.5-3d", ["Dropout"], x=((2, 3, 5), "n"))
def _(P): return dropout_term(P["x"], 0.5) * P["x"]

# The main path: these parameters test these rules too.
MAIN_PARAMS = {"Gather_tokens_emb": ("Gather", "embedding(tokens)"),
               "CrossEntropy_tokens_head": ("CrossEntropy", "lm head (3-D matmul)")}


def ident(s):
    return re.sub(r"[^A-Za-z0-9]", "", s)


# --------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------

def init_values(rng, shape, domain):
    if domain == "n":
        v = rng.standard_normal(shape)
    elif domain == "p":
        v = rng.uniform(0.5, 2.0, shape)
    elif domain == "t":  # two equal maxima (columns 1 and 3) in every row
        v = rng.standard_normal(shape)
        v[..., 1] = v[..., 3] = v.max(axis=-1) + 0.5
    elif domain == "a":
        signs = np.where(np.arange(math.prod(shape)) % 2, -1.0, 1.0)
        v = rng.uniform(0.3, 1.5, shape) * signs.reshape(shape)
    elif domain == "z":
        v = rng.uniform(0.3, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    else:
        raise ValueError(domain)
    return torch.tensor(v, dtype=torch.float32)


class GradCheckModel(nn.Module):
    def __init__(self, terms, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.emb_name, self.head_name = list(MAIN_PARAMS)
        self.register_parameter(self.emb_name, nn.Parameter(
            torch.tensor(rng.standard_normal((VOCAB, DIM)), dtype=torch.float32)))
        self.register_parameter(self.head_name, nn.Parameter(
            torch.tensor(rng.standard_normal((DIM, VOCAB)) / math.sqrt(DIM),
                         dtype=torch.float32)))
        self.terms = []
        for rule, variant, fn, params, _ops in terms:
            names = {}
            for arg, (shape, domain) in params.items():
                name = f"{ident(rule)}_{ident(variant)}_{arg}"
                self.register_parameter(name, nn.Parameter(init_values(rng, shape, domain)))
                names[arg] = name
            with torch.no_grad():
                out = fn({a: self._parameters[n] for a, n in names.items()})
            # R_k with its weight c_k folded in.
            R = rng.standard_normal(tuple(out.shape)) * rng.uniform(0.5, 1.0)
            self.terms.append((rule, variant, fn, names, R))

    def forward(self, tokens, targets):
        DROPOUT["calls"] = 0
        dt = self._parameters[self.emb_name].dtype
        h = F.embedding(tokens, self._parameters[self.emb_name])
        logits = torch.matmul(h, self._parameters[self.head_name])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        # sum_k (f_k * R_k).sum(), as one ReduceSum over the concatenated
        # products: the generated C++ instantiates a template per elementwise
        # op, so a Mul + Add per term would double the compile time.
        products = []
        for _rule, _variant, fn, names, R in self.terms:
            y = fn({a: self._parameters[n] for a, n in names.items()})
            r = torch.tensor(R.tolist(), dtype=dt)  # exported as a Constant
            products.append((y * r).reshape(-1))
        if products:
            loss = loss + torch.cat(products).sum()
        return loss

    def rule_of(self):
        """Parameter name -> (rule, variant)."""
        out = dict(MAIN_PARAMS)
        for rule, variant, _fn, names, _R in self.terms:
            for n in names.values():
                out[n] = (rule, variant)
        return out


# --------------------------------------------------------------------------
# Plumbing
# --------------------------------------------------------------------------

def token_data(n=40000):
    path = "/usr/share/common-licenses/GPL-3"
    if os.path.exists(path):
        data = np.frombuffer(open(path, "rb").read(), dtype=np.uint8)[:n]
        return data.astype(np.uint16)
    return np.random.default_rng(0).integers(0, VOCAB, n).astype(np.uint16)


def step0_batch(data, batch, seq):
    """The batch `--sampler sequential` trains on at step 0 (grad-accum 1)."""
    n = len(data)
    offs = [(i * seq) % (n - seq - 1) for i in range(batch)]
    x = np.stack([data[o:o + seq] for o in offs]).astype(np.int64)
    y = np.stack([data[o + 1:o + seq + 1] for o in offs]).astype(np.int64)
    return torch.tensor(x), torch.tensor(y)


def grad_problem(g, r):
    """(problem or None, ratio) of our gradient G against PyTorch's R:
    ratio = max|G - R| / max(1, max|R|) must be <= TOL; a NaN or infinity in
    G is a problem whatever the ratio."""
    if not np.isfinite(g).all():
        k = int(np.flatnonzero(~np.isfinite(g))[0])
        return (f"non-finite gradient {g.flat[k]} at "
                f"{list(map(int, np.unravel_index(k, g.shape)))} "
                f"({int((~np.isfinite(g)).sum())} of {g.size} elements)"), float("inf")
    diff = np.abs(g - r)
    ratio = float(diff.max()) / max(1.0, float(np.abs(r).max()))
    if not ratio <= TOL:
        k = int(diff.argmax())
        return (f"max|ours - torch| = {diff.max():.3e} (ratio {ratio:.2e} > {TOL:g}) at "
                f"{list(map(int, np.unravel_index(k, r.shape)))}: ours {g.flat[k]:.7g}, "
                f"torch {r.flat[k]:.7g}; ours {np.array2string(g.ravel()[:6], precision=5)} "
                f"vs torch {np.array2string(r.ravel()[:6], precision=5)}"), ratio
    return None, ratio


def bound_catches(ours, ref):
    """Wrong gradients the check must fail, made from a real one (the
    parameter with the largest reference gradient): one element off by three
    times the bound, one NaN. Returns the ones that passed."""
    name = max(ref, key=lambda n: float(np.abs(ref[n]).max()))
    r = ref[name]
    scale = max(1.0, float(np.abs(r).max()))
    k = int(np.abs(r).argmax())
    off = r.copy()
    off.flat[k] += 3 * TOL * scale
    nan = r.copy()
    nan.flat[k] = np.nan
    return name, [what for what, g in (("off by 3x the bound", off), ("a NaN", nan))
                  if grad_problem(g, r)[0] is None]


def export(model, path):
    tokens, targets = step0_batch(token_data(), BATCH, SEQ)
    torch.onnx.export(
        model, (tokens, targets), path,
        input_names=["tokens", "targets"], output_names=["loss"],
        dynamic_axes={"tokens": {0: "batch", 1: "seq"},
                      "targets": {0: "batch", 1: "seq"}},
        opset_version=17, do_constant_folding=False,
        keep_initializers_as_inputs=False)
    proto = onnx.load(path)
    onnx.checker.check_model(proto)
    return proto


def torch_grads(model, tokens, targets):
    ref = GradCheckModel.__new__(GradCheckModel)
    ref.__dict__ = dict(model.__dict__)
    ref._parameters = {n: nn.Parameter(p.detach().to(torch.float64).clone())
                       for n, p in model._parameters.items()}
    loss = ref(tokens, targets)
    loss.backward()
    return float(loss), {n: (p.grad if p.grad is not None else torch.zeros_like(p)).numpy()
                         for n, p in ref._parameters.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "bin", "fastllm-opt"))
    ap.add_argument("--keep", metavar="DIR", help="keep the work files here")
    ap.add_argument("--rules", help="comma-separated subset of rules (debugging)")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print every parameter's error")
    args = ap.parse_args()
    torch.set_num_threads(2)
    t_start = time.perf_counter()

    terms = TERMS
    if args.rules:
        wanted = set(args.rules.split(","))
        unknown = wanted - set(RULE_OPS)
        if unknown:
            ap.error(f"unknown rules {sorted(unknown)}; known: {', '.join(RULE_OPS)}")
        terms = [t for t in TERMS if t[0] in wanted]
    workdir = args.keep or tempfile.mkdtemp(prefix="gradcheck-")
    os.makedirs(workdir, exist_ok=True)

    torch.manual_seed(0)
    model = GradCheckModel(terms)
    rule_of = model.rule_of()
    rules = [r for r in RULE_OPS if r in {rv[0] for rv in rule_of.values()}]

    def finish(results):
        passed = sum(ok for ok, _ in results.values())
        for rule in rules:
            ok, detail = results[rule]
            print(f"PASS {rule} ({detail})" if ok else f"FAIL {rule}: {detail}")
        failed = len(results) - passed
        if failed or args.keep:
            print(f"work files: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        print(f"{len(model._parameters)} parameters, {len(model.terms) + 1} terms, "
              f"{time.perf_counter() - t_start:.1f} s")
        print(f"gradcheck: {passed} passed, {failed} failed")
        sys.exit(1 if failed else 0)

    onnx_path = os.path.join(workdir, "gradcheck.onnx")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = export(model, onnx_path)
    inits = {t.name for t in proto.graph.initializer}
    op_types = {n.op_type for n in proto.graph.node}
    DROPOUT["sites"] = [philox_dropout.fnv1a32(n.output[0])
                        for n in proto.graph.node if n.op_type == "Dropout"]
    if args.verbose:
        print(f"ONNX ops: {' '.join(sorted(op_types))}")
    # The test itself must hold: initializers are exactly the parameters,
    # and every rule's ONNX op is in the graph.
    problems = {}
    missing_init = set(model._parameters) - inits
    extra_init = inits - set(model._parameters)
    if extra_init:
        print(f"note: initializers that are not parameters: {sorted(extra_init)}")
    for name in missing_init:
        problems.setdefault(rule_of[name][0], []).append(
            f"{name} is not an ONNX initializer (export renamed or folded it)")
    needed = {"Gather": {"Gather"}, "CrossEntropy": {"SoftmaxCrossEntropyLoss"}}
    for rule, _variant, _fn, _params, ops in terms:
        needed.setdefault(rule, set()).update(ops)
    for rule in rules:
        absent = sorted(needed.get(rule, set()) - op_types)
        if absent:
            problems.setdefault(rule, []).append(
                f"not exercised: the ONNX graph has no {', '.join(absent)}")

    data = token_data()
    data_path = os.path.join(workdir, "tokens.u16")
    data.tofile(data_path)
    out = os.path.join(workdir, "run")
    t0 = time.perf_counter()
    # One try: a compile killed by a signal is a failure like any other.
    # The Sin and Cos terms' inputs reach the loss only through sin and cos,
    # as a rotary frequency buffer does: without an exporter's parameter
    # list compile asks, and the test says they are weights.
    proc = subprocess.run([args.tool, "compile", onnx_path, "-o", out,
                           "--batch-size", str(BATCH), "--seq-len", str(SEQ),
                           "--train", "^(Sin|Cos)_n_x$"],
                          capture_output=True, text=True)
    if args.verbose:
        print(f"compile: {time.perf_counter() - t0:.1f} s")
    if proc.returncode != 0:
        msg = (f"compile {'killed by signal ' + str(-proc.returncode) if proc.returncode < 0 else 'failed'}: "
               + proc.stderr.strip()[-3000:])
        finish({r: (False, msg) for r in rules})
    grads_path = os.path.join(workdir, "grads.safetensors")
    proc = subprocess.run([os.path.join(out, "train"), "--data", data_path,
                           "--steps", "1", "--lr", "1e-3", "--sampler", "sequential",
                           "--grad-accum", "1", "--dump-grads", grads_path],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        msg = "train failed: " + proc.stderr.strip()[-3000:]
        finish({r: (False, msg) for r in rules})
    ours = torch_reference.read_safetensors(grads_path)

    plan = open(os.path.join(out, "plan.mlir")).read()
    # Which form the plan differentiated (fused op or the exporter's chain).
    fused = {"GELU-erf": r"model\.gelu_grad [^\n]*approximate\s+none",
             "GELU-tanh": r"model\.gelu_grad [^\n]*approximate\s+tanh",
             "SiLU": r"model\.silu ", "RMSNorm": r"model\.rms_norm_grad ",
             "Rsqrt": r"model\.rsqrt ",
             "CausalAttention": r"model\.causal_attention_grad "}

    tokens, targets = step0_batch(data, BATCH, SEQ)
    loss, ref = torch_grads(model, tokens, targets)
    if args.verbose:
        print(f"torch loss {loss:.6f}")

    results = {}
    worst = {}
    for name in model._parameters:
        rule, variant = rule_of[name]
        if name not in ours:
            problems.setdefault(rule, []).append(f"{name}: no gradient dumped")
            continue
        g, r = ours[name].astype(np.float64), ref[name]
        if g.shape != r.shape:
            problems.setdefault(rule, []).append(
                f"{name}: gradient shape {list(g.shape)}, expected {list(r.shape)}")
            continue
        problem, ratio = grad_problem(g, r)
        if problem:
            problems.setdefault(rule, []).append(f"{name} ({variant}): {problem}")
        if np.abs(r).max() < 1e-2:  # the term would test nothing
            problems.setdefault(rule, []).append(
                f"{name}: torch's gradient is ~0 (max {np.abs(r).max():.1e}): "
                f"the test's term is degenerate")
        if args.verbose:
            print(f"  {name:34s} {list(r.shape)!s:12s} max|torch| {np.abs(r).max():.3e} "
                  f"ratio {ratio:.2e}")
        if rule not in worst or ratio > worst[rule][0]:
            worst[rule] = (ratio, name)
    for rule in rules:
        note = ""
        if rule in fused:
            m = re.search(fused[rule], plan)
            note = (f"; plan has {m.group(0).split()[0]}" if m else
                     "; plan has no fused op: composite rules")
        if rule in problems:
            results[rule] = (False, "; ".join(problems[rule]) + note)
        else:
            ratio, name = worst[rule]
            results[rule] = (True, f"worst ratio {ratio:.2e} at {name}{note}")
    # The check itself must catch a wrong gradient (outside any rule).
    name, passed_wrongly = bound_catches(ours, ref)
    rules.append("the bound fails wrong gradients")
    results[rules[-1]] = (not passed_wrongly, (
        f"{name}'s gradient with one element off by 3x the bound, and with a NaN, fail it"
        if not passed_wrongly else f"these passed: {', '.join(passed_wrongly)} ({name})"))
    finish(results)


if __name__ == "__main__":
    main()
