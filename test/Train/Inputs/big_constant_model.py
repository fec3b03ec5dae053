#!/usr/bin/python3
"""big_constant_model.py OUT.onnx: a small model whose graph holds an 8192-
element float Constant (a fixed projection, tokens -> embedding (8) ->
constant projection (1024) -> tanh -> head (vocab 16) -> cross-entropy),
large enough that a CPU step defines it in a part of its own."""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)
V, D, P = 16, 8, 1024
emb = numpy_helper.from_array((rng.standard_normal((V, D)) * 0.1).astype(np.float32), "emb")
head = numpy_helper.from_array((rng.standard_normal((P, V)) * 0.02).astype(np.float32), "head")
proj = numpy_helper.from_array((rng.standard_normal((D, P)) * 0.3).astype(np.float32), "proj_value")
shape = numpy_helper.from_array(np.array([-1, V], dtype=np.int64), "shape_value")
tshape = numpy_helper.from_array(np.array([-1], dtype=np.int64), "tshape_value")
nodes = [
    helper.make_node("Constant", [], ["proj"], value=proj),
    helper.make_node("Constant", [], ["shape"], value=shape),
    helper.make_node("Constant", [], ["tshape"], value=tshape),
    helper.make_node("Gather", ["emb", "tokens"], ["x"]),
    helper.make_node("MatMul", ["x", "proj"], ["u"]),
    helper.make_node("Tanh", ["u"], ["h"]),
    helper.make_node("MatMul", ["h", "head"], ["logits"]),
    helper.make_node("Reshape", ["logits", "shape"], ["flat"]),
    helper.make_node("Reshape", ["targets", "tshape"], ["t"]),
    helper.make_node("SoftmaxCrossEntropyLoss", ["flat", "t"], ["loss"]),
]
graph = helper.make_graph(
    nodes, "big_constant",
    [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"]),
     helper.make_tensor_value_info("targets", TensorProto.INT64, ["batch", "seq"])],
    [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    [emb, head])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save(model, sys.argv[1])
