#!/usr/bin/python3
"""Tiny NumPy interpreter for the ONNX ops that export_models.py emits.

Why: onnxruntime is not installed here and onnx 1.12 has no reference
evaluator, yet we want to know that an exported graph computes the same loss
as the PyTorch model at a batch/seq *different* from the traced one (i.e. the
dynamic dims were really kept dynamic). Only the ops and attribute forms that
torch 1.13 emits at opsets 13..17 are covered; anything else raises.

Usage as a script:
    onnx_numpy_ref.py MODEL.onnx --batch 3 --seq 17 --vocab 256 [--seed 0]
prints the loss for seeded random tokens/targets.
"""

import argparse
import math
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _dtype(onnx_type):
    return helper.tensor_dtype_to_np_dtype(onnx_type) \
        if hasattr(helper, "tensor_dtype_to_np_dtype") \
        else onnx.mapping.TENSOR_TYPE_TO_NP_TYPE[onnx_type]


def _softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def run_node(node, ins, opset):
    a = _attrs(node)
    op = node.op_type
    if op == "Constant":
        return [numpy_helper.to_array(a["value"])]
    if op == "Shape":
        return [np.array(ins[0].shape, dtype=np.int64)]
    if op == "Gather":
        return [np.take(ins[0], ins[1].astype(np.int64), axis=a.get("axis", 0))]
    if op == "Cast":
        return [ins[0].astype(_dtype(a["to"]))]
    if op == "Range":
        return [np.arange(ins[0], ins[1], ins[2]).astype(ins[0].dtype)]
    if op == "Unsqueeze":
        axes = a["axes"] if "axes" in a else ins[1].tolist()
        out = ins[0]
        rank = out.ndim + len(axes)
        for ax in sorted(x % rank for x in axes):
            out = np.expand_dims(out, ax)
        return [out]
    if op == "Concat":
        return [np.concatenate(ins, axis=a["axis"])]
    if op == "ConstantOfShape":
        v = numpy_helper.to_array(a["value"]) if "value" in a \
            else np.zeros(1, np.float32)
        return [np.full(tuple(ins[0].tolist()), v.reshape(-1)[0], dtype=v.dtype)]
    if op == "Trilu":
        k = int(ins[1]) if len(ins) > 1 and ins[1] is not None else 0
        f = np.triu if a.get("upper", 1) else np.tril
        return [f(ins[0], k)]
    if op == "Reshape":
        shape = ins[1].tolist()
        shape = [ins[0].shape[i] if (s == 0 and not a.get("allowzero", 0)) else s
                 for i, s in enumerate(shape)]
        return [ins[0].reshape(shape)]
    if op == "Transpose":
        return [np.transpose(ins[0], a.get("perm"))]
    if op == "Split":
        axis = a.get("axis", 0)
        sizes = a["split"] if "split" in a else ins[1].tolist()
        return np.split(ins[0], np.cumsum(sizes)[:-1], axis=axis)
    if op == "Slice":
        data, starts, ends = ins[0], ins[1], ins[2]
        axes = ins[3] if len(ins) > 3 else np.arange(len(starts))
        steps = ins[4] if len(ins) > 4 else np.ones(len(starts), np.int64)
        sl = [slice(None)] * data.ndim
        for s, e, ax, st in zip(starts, ends, axes, steps):
            sl[int(ax)] = slice(int(s), int(e), int(st))
        return [data[tuple(sl)]]
    if op in ("Add", "Sub", "Mul", "Pow"):
        f = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
             "Pow": np.power}[op]
        return [f(ins[0], ins[1]).astype(ins[0].dtype)]
    if op == "Div":
        if np.issubdtype(ins[0].dtype, np.integer):
            return [np.trunc(ins[0] / ins[1]).astype(ins[0].dtype)]
        return [(ins[0] / ins[1]).astype(ins[0].dtype)]
    if op in ("Neg", "Sqrt", "Cos", "Sin", "Tanh", "Not"):
        f = {"Neg": np.negative, "Sqrt": np.sqrt, "Cos": np.cos, "Sin": np.sin,
             "Tanh": np.tanh, "Not": np.logical_not}[op]
        return [f(ins[0])]
    if op == "Erf":
        return [_erf(ins[0]).astype(ins[0].dtype)]
    if op == "Sigmoid":
        return [(1.0 / (1.0 + np.exp(-ins[0]))).astype(ins[0].dtype)]
    if op == "LessOrEqual":
        return [ins[0] <= ins[1]]
    if op == "Where":
        return [np.where(ins[0], ins[1], ins[2])]
    if op == "MatMul":
        return [np.matmul(ins[0], ins[1])]
    if op == "Gemm":
        A = ins[0].T if a.get("transA", 0) else ins[0]
        B = ins[1].T if a.get("transB", 0) else ins[1]
        y = a.get("alpha", 1.0) * (A @ B)
        if len(ins) > 2 and ins[2] is not None:
            y = y + a.get("beta", 1.0) * ins[2]
        return [y.astype(ins[0].dtype)]
    if op == "Softmax":
        return [_softmax(ins[0], a.get("axis", -1))]
    if op == "ReduceMean":
        axes = a["axes"] if "axes" in a else ins[1].tolist()
        return [np.mean(ins[0], axis=tuple(axes), keepdims=bool(a.get("keepdims", 1)))]
    if op == "LayerNormalization":
        x = ins[0]
        axis = a.get("axis", -1) % x.ndim
        axes = tuple(range(axis, x.ndim))
        mu = x.mean(axis=axes, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
        y = (x - mu) / np.sqrt(var + a.get("epsilon", 1e-5)) * ins[1]
        if len(ins) > 2 and ins[2] is not None:
            y = y + ins[2]
        return [y.astype(x.dtype)]
    if op == "SoftmaxCrossEntropyLoss":
        logits, labels = ins[0], ins[1]
        assert logits.ndim == 2 and len(ins) == 2, "only [N, C] without weights"
        ignore = a.get("ignore_index", None)
        m = logits.max(axis=1, keepdims=True)
        logp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
        keep = np.ones(labels.shape, bool) if ignore is None else labels != ignore
        safe = np.where(keep, labels, 0)
        nll = -np.take_along_axis(logp, safe[:, None], axis=1)[:, 0] * keep
        red = a.get("reduction", b"mean")
        red = red.decode() if isinstance(red, bytes) else red
        if red == "mean":
            return [np.array(nll.sum() / keep.sum(), dtype=logits.dtype)]
        if red == "sum":
            return [np.array(nll.sum(), dtype=logits.dtype)]
        return [nll.astype(logits.dtype)]
    raise NotImplementedError(f"onnx_numpy_ref: op {op} not supported")


def evaluate(model, feeds):
    """Run `model` (onnx.ModelProto) on the dict `feeds`; return outputs list."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    env = {"": None}
    for t in model.graph.initializer:
        env[t.name] = numpy_helper.to_array(t)
    env.update(feeds)
    for node in model.graph.node:
        outs = run_node(node, [env[i] for i in node.input], opset)
        for name, val in zip(node.output, outs):
            env[name] = np.asarray(val)
    return [env[o.name] for o in model.graph.output]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    tokens = rng.integers(0, args.vocab, (args.batch, args.seq), dtype=np.int64)
    targets = rng.integers(0, args.vocab, (args.batch, args.seq), dtype=np.int64)
    (loss,) = evaluate(onnx.load(args.model), {"tokens": tokens, "targets": targets})
    print(float(loss))
    return 0


if __name__ == "__main__":
    sys.exit(main())
