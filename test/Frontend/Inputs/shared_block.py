"""Writes the model of shared-block.test to the file given as argv[1].

What PyTorch's eval-mode export writes for a block called by several layers
(ALBERT): the block's Linear weight is folded once per call into equal
transposed copies, merged into one initializer read directly by the first
call (`/block/fc/MatMul`) and through Identity copies under generated names
by the later calls (`/block/fc_1/MatMul`, ...). Beside it, a distinct module
whose weight happens to be equal (`/other/fc/MatMul`), and a module really
named `fc_2` (it has a bias of its own), also equal.
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

w = numpy_helper.from_array(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), "onnx::MatMul_1")
bias = numpy_helper.from_array(np.array([0.5, 0.25], np.float32), "block.fc_2.bias")
nodes = [
    helper.make_node("Identity", ["onnx::MatMul_1"], ["onnx::MatMul_2"]),
    helper.make_node("Identity", ["onnx::MatMul_1"], ["onnx::MatMul_3"]),
    helper.make_node("Identity", ["onnx::MatMul_1"], ["onnx::MatMul_4"]),
    helper.make_node("MatMul", ["X", "onnx::MatMul_1"], ["a"], name="/block/fc/MatMul"),
    helper.make_node("MatMul", ["a", "onnx::MatMul_2"], ["b"], name="/block/fc_1/MatMul"),
    helper.make_node("MatMul", ["b", "onnx::MatMul_3"], ["c"], name="/other/fc/MatMul"),
    helper.make_node("MatMul", ["c", "onnx::MatMul_4"], ["d0"], name="/block/fc_2/MatMul"),
    helper.make_node("Add", ["d0", "block.fc_2.bias"], ["d"], name="/block/fc_2/Add"),
    helper.make_node("ReduceSum", ["d"], ["loss"], keepdims=0),
]
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 2])],
                          [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [w, bias])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.save(model, sys.argv[1])
