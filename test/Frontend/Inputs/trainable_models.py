"""Writes the models of trainable.test to the folder given as argv[1].

onnx.helper rather than ONNX text: the text format has no -inf literal, no
node names and no metadata_props, all three of which the test needs.
"""
import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
f32 = lambda name, values: numpy_helper.from_array(np.array(values, np.float32), name)

inits = [
    f32("w", [1.0, 2.0, 3.0]),
    f32("tril", [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]),
    f32("shift", [1.0, 0.0, 2.0]),
    f32("neg_inf_mask", [[0.0, -np.inf, -np.inf], [0.0, 0.0, -np.inf]]),
    f32("onnx::MatMul_7", [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]),
    f32("onnx::MatMul_8", [[1.0, 2.0], [3.0, 4.5]]),
    f32("zero", 0.0),
    f32("fill", -1000.0),
    f32("running_scale", [2.0, 2.0, 2.0]),
]
nodes = [
    helper.make_node("Equal", ["tril", "zero"], ["cond"]),
    helper.make_node("Mul", ["X", "w"], ["a0"]),
    helper.make_node("Mul", ["a0", "running_scale"], ["a"]),
    helper.make_node("Where", ["cond", "fill", "a"], ["masked"]),
    helper.make_node("Cast", ["shift"], ["idx"], to=TensorProto.INT64),
    helper.make_node("Gather", ["masked", "idx"], ["picked"], axis=1),
    helper.make_node("Add", ["picked", "neg_inf_mask"], ["scores"]),
    helper.make_node("Softmax", ["scores"], ["soft"], axis=-1),
    helper.make_node("MatMul", ["soft", "onnx::MatMul_7"], ["projected"], name="/blk/fc/MatMul"),
    helper.make_node("MatMul", ["projected", "onnx::MatMul_8"], ["mixed"], name="/MatMul"),
    helper.make_node("ReduceSum", ["mixed"], ["loss"], keepdims=0),
]
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)


def save(name, metadata):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in metadata.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, os.path.join(out, name))


save("plain.onnx", {})
# What tools/fastllm_export.py writes: running_scale is a buffer, w frozen.
save("listed.onnx", {"fastllm.trainable_parameters": json.dumps(["fill", "zero"]),
                     "fastllm.frozen_parameters": json.dumps(["w"])})
save("bad-metadata.onnx", {"fastllm.trainable_parameters": '{"w": 1}'})

# A module path that is not UTF-8 (ONNX's protobuf does not check node
# names): the folded weight keeps its generated name rather than become a
# parameter name no weights file can hold.
with open(os.path.join(out, "plain.onnx"), "rb") as f:
    data = f.read()
assert data.count(b"/blk/fc/MatMul") == 1
with open(os.path.join(out, "bad-node-name.onnx"), "wb") as f:
    f.write(data.replace(b"/blk/fc/MatMul", b"/blk/\xff\xfe/MatMul"))
