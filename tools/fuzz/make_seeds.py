#!/usr/bin/python3
"""Writes the fuzzer's binary seeds into the folder given as argv[1].

The seeds reach the importer's external-data path: models whose weights live
in `weights.bin` (the 4 KiB file the fuzzer puts in its model folder), at an
offset, with and without a length, one naming `outside.bin` (a symlink out of
the folder) and one `empty.bin` (too short), so mutations of the locations,
offsets, lengths and dims start from loads that succeed or fail at each check.
`inline-large.onnx` keeps a 20 KiB weight in raw_data inside the model, large
enough that a model file's parse leaves it in the mapping
(frontend/MappedModel.cpp), which the fuzzer checks against protobuf.
The text seeds are test/Frontend/*.onnxtext, copied by scripts/test.sh.
"""
import os
import struct
import sys

import onnx
from onnx import TensorProto, helper


def external_model(location, offset, length, dims=(8, 16)):
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(dims))
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            entry = weight.external_data.add()
            entry.key, entry.value = key, str(value)
    return model_with(weight)


def inline_model(rows, cols):
    values = [0.001 * (i % 89) for i in range(rows * cols)]
    weight = helper.make_tensor("w", TensorProto.FLOAT, [rows, cols],
                                struct.pack(f"<{len(values)}f", *values), raw=True)
    return model_with(weight)


def model_with(weight):
    emb = helper.make_tensor("emb", TensorProto.FLOAT, [32, 8], [0.01 * i for i in range(256)])
    nodes = [
        helper.make_node("Gather", ["emb", "tokens"], ["h"], name="embed"),
        helper.make_node("MatMul", ["h", "w"], ["logits"], name="head"),
        helper.make_node("Transpose", ["logits"], ["scores"], perm=[0, 2, 1], name="classes"),
        helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "targets"], ["loss"],
                         name="loss", reduction="mean"),
    ]
    graph = helper.make_graph(
        nodes, "external",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("targets", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=[emb, weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def main():
    out = sys.argv[1]
    seeds = {
        "external.onnx": external_model("weights.bin", 0, 512),
        "external-offset.onnx": external_model("weights.bin", 1024, None),
        "external-outside.onnx": external_model("outside.bin", 0, 512),
        "external-short.onnx": external_model("empty.bin", 0, None),
        "external-huge.onnx": external_model("weights.bin", 0, None, dims=(1 << 20, 1 << 20)),
        "inline-large.onnx": inline_model(8, 640),
    }
    for name, model in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(model.SerializeToString())


if __name__ == "__main__":
    main()
