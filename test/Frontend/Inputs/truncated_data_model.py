#!/usr/bin/python3
"""A training model whose weights lie in one external-data file, laid out so
that cutting the file at 64 KiB loses one weight and keeps the other, and a
stand-in for fastllm-plot that cuts it (external-data-truncated.test).

  truncated_data_model.py OUT_DIR
      writes OUT_DIR/model.onnx and OUT_DIR/data.bin: `emb.weight` at offset
      0 (written to weights.safetensors straight from the mapping) and the
      folded Linear weight `onnx::MatMul_3` ([in, out], transposed by this
      process while weights.safetensors is written) at offset 64 KiB, each
      on pages of its own whatever the page size (up to 64 KiB)
  truncated_data_model.py --fake-plot BIN_DIR DATA SIZE
      writes BIN_DIR/fastllm-plot, an executable that truncates DATA to SIZE
      bytes and creates BIN_DIR/plot-ran. `compile --report-chart` runs
      the fastllm-plot beside its executable and waits for it, after the
      import has mapped the model's files and before weights.safetensors is
      written: a fastllm-opt copied into BIN_DIR has its data file cut at
      that point, every time.
"""
import os
import stat
import sys

import numpy as np

V, D, B, T = 8, 4, 2, 3
SECOND = 64 << 10  # where the folded weight starts
rng = np.random.default_rng(11)
EMB = rng.standard_normal((V, D)).astype(np.float32)
MATMUL = rng.standard_normal((D, V)).astype(np.float32)  # x @ W.T, stored [in, out]


def write(out):
    from onnx import TensorProto, helper
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "data.bin"), "wb") as f:
        f.write(EMB.tobytes())
        f.write(b"\0" * (SECOND - f.tell()))
        f.write(MATMUL.tobytes())
        f.write(b"\0" * (2 * SECOND - f.tell()))

    def ext(name, dims, offset, nbytes):
        t = TensorProto()
        t.name, t.data_type = name, TensorProto.FLOAT
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "data.bin"), ("offset", str(offset)),
                     ("length", str(nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, v
        return t

    inits = [ext("emb.weight", [V, D], 0, EMB.nbytes),
             ext("onnx::MatMul_3", [D, V], SECOND, MATMUL.nbytes),
             helper.make_tensor("shape2", TensorProto.INT64, [2], [-1, V]),
             helper.make_tensor("shape1", TensorProto.INT64, [1], [-1])]
    nodes = [
        helper.make_node("Gather", ["emb.weight", "tokens"], ["x"], name="/emb/Gather"),
        helper.make_node("MatMul", ["x", "onnx::MatMul_3"], ["y"], name="/lin/MatMul"),
        helper.make_node("Reshape", ["y", "shape2"], ["logits"], name="/Reshape"),
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


def fake_plot(bin_dir, data, size):
    path = os.path.join(bin_dir, "fastllm-plot")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n"
                f"truncate -s {int(size)} '{os.path.abspath(data)}' || exit 1\n"
                f": > '{os.path.abspath(os.path.join(bin_dir, 'plot-ran'))}'\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


if __name__ == "__main__":
    if sys.argv[1] == "--fake-plot":
        fake_plot(*sys.argv[2:5])
    else:
        write(sys.argv[1])
