"""A model whose 200 biases each lie in an external-data file of their own
(as PyTorch writes every tensor of a large model). argv[1]: folder."""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
n = 200
inits = [numpy_helper.from_array(np.linspace(-1, 1, 64 * 8).astype(np.float32).reshape(64, 8), "emb"),
         numpy_helper.from_array(np.linspace(-1, 1, 8 * 64).astype(np.float32).reshape(8, 64), "head")]
nodes = [helper.make_node("Gather", ["emb", "tokens"], ["h0"])]
for i in range(n):
    inits.append(numpy_helper.from_array(np.full(8, 0.001 * i, np.float32), f"b{i}"))
    nodes.append(helper.make_node("Add", [f"h{i}", f"b{i}"], [f"h{i + 1}"]))
nodes += [helper.make_node("MatMul", [f"h{n}", "head"], ["logits"]),
          helper.make_node("Transpose", ["logits"], ["scores"], perm=[0, 2, 1]),
          helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "targets"], ["loss"], reduction="mean")]
graph = helper.make_graph(
    nodes, "many_files",
    [helper.make_tensor_value_info("tokens", TensorProto.INT64, [2, 4]),
     helper.make_tensor_value_info("targets", TensorProto.INT64, [2, 4])],
    [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], initializer=inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
onnx.save_model(model, os.path.join(out, "model.onnx"), save_as_external_data=True,
                all_tensors_to_one_file=False, size_threshold=0)
print(len(os.listdir(out)), "files")
