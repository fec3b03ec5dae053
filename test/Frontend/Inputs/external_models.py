#!/usr/bin/python3
"""A model whose weights and one Constant live in external data, as
torch.onnx.export writes a model past 2 GB: an embedding, a folded Linear
weight (`onnx::MatMul_7`, [in, out]) in the same data file, a bias at an
offset that is not a multiple of 4 (read, not mapped), and a Constant node's
value in a file of its own.

  external_models.py OUT_DIR          writes OUT_DIR/model.onnx and its data
  external_models.py --check OUT_DIR WEIGHTS
      compares compile's weights.safetensors with the data written (the
      folded weight transposed to PyTorch's [out, in]); prints OK or exits 1
"""
import json
import os
import struct
import sys

import numpy as np

V, D, B, T = 8, 4, 2, 3
rng = np.random.default_rng(7)
EMB = rng.standard_normal((V, D)).astype(np.float32)
MATMUL = rng.standard_normal((D, V)).astype(np.float32)  # x @ W.T, stored [in, out]
BIAS = rng.standard_normal(V).astype(np.float32)
CONST = np.array([0.5, -1.5, 2.25, 0, 1, 2, 3, 4], dtype=np.float32)


def write(out):
    import onnx
    from onnx import TensorProto, helper
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "data.bin"), "wb") as f:
        f.write(EMB.tobytes())           # offset 0
        f.write(b"\0" * (128 - f.tell()))
        f.write(MATMUL.tobytes())        # offset 128
        f.write(b"\0" * (1026 - f.tell()))
        f.write(BIAS.tobytes())          # offset 1026: not 4-byte aligned
    with open(os.path.join(out, "const.bin"), "wb") as f:
        f.write(CONST.tobytes())

    def ext(name, dims, location, offset, nbytes):
        t = TensorProto()
        t.name, t.data_type = name, TensorProto.FLOAT
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", location), ("offset", str(offset)),
                     ("length", str(nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, v
        return t

    inits = [ext("emb.weight", [V, D], "data.bin", 0, EMB.nbytes),
             ext("onnx::MatMul_7", [D, V], "data.bin", 128, MATMUL.nbytes),
             ext("out.bias", [V], "data.bin", 1026, BIAS.nbytes),
             helper.make_tensor("shape2", TensorProto.INT64, [2], [-1, V]),
             helper.make_tensor("shape1", TensorProto.INT64, [1], [-1])]
    const = ext("", [V], "const.bin", 0, CONST.nbytes)
    nodes = [
        helper.make_node("Gather", ["emb.weight", "tokens"], ["x"], name="/emb/Gather"),
        helper.make_node("MatMul", ["x", "onnx::MatMul_7"], ["y"], name="/lin/MatMul"),
        helper.make_node("Add", ["y", "out.bias"], ["z"], name="/Add"),
        helper.make_node("Constant", [], ["c"], name="/Constant", value=const),
        helper.make_node("Add", ["z", "c"], ["w"], name="/Add_1"),
        helper.make_node("Reshape", ["w", "shape2"], ["logits"], name="/Reshape"),
        helper.make_node("Reshape", ["targets", "shape1"], ["t"], name="/Reshape_1"),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "t"], ["loss"],
                         name="/SoftmaxCrossEntropyLoss", reduction="mean"),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [B, T]),
         helper.make_tensor_value_info("targets", TensorProto.INT64, [B, T])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with open(os.path.join(out, "model.onnx"), "wb") as f:
        f.write(model.SerializeToString())


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", e
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[b:end], dtype=np.float32).reshape(e["shape"])
    return out


def check(weights):
    got = read_safetensors(weights)
    want = {"emb.weight": EMB, "lin.weight": MATMUL.T, "out.bias": BIAS}
    if sorted(got) != sorted(want):
        sys.exit(f"FAIL: tensors {sorted(got)}, expected {sorted(want)}")
    for name, value in want.items():
        if got[name].shape != value.shape or not np.array_equal(got[name], value):
            sys.exit(f"FAIL: {name} differs from the external data")
    print("OK")


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        check(sys.argv[3])
    else:
        write(sys.argv[1])
