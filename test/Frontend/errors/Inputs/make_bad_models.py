#!/usr/bin/python3
"""Writes one malformed ONNX model per bad-input case into OUTDIR.

Usage: make_bad_models.py OUTDIR
Each case is named after what is wrong with it; the lit tests beside this
folder import them and check the diagnostic. Built with onnx.helper (Debian's
python3-onnx) so the files are real protobufs, broken in exactly one way.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


def save(name, model, check=False):
    if check:
        onnx.checker.check_model(model)
    with open(os.path.join(out, name + ".onnx"), "wb") as f:
        f.write(model.SerializeToString())


def model(nodes, inputs, outputs, inits=(), opset=17, ir=8, value_info=()):
    graph = helper.make_graph(nodes, "bad", inputs, outputs,
                              initializer=list(inits), value_info=list(value_info))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir
    return m


x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
relu = helper.make_node("Relu", ["x"], ["y"], name="relu0")

# A valid model, for the well-formed baseline and for truncation.
good = model([relu], [x], [y])
save("good", good, check=True)
data = good.SerializeToString()
with open(os.path.join(out, "truncated.onnx"), "wb") as f:
    f.write(data[: len(data) // 2])
rng = np.random.default_rng(1234)
with open(os.path.join(out, "random.onnx"), "wb") as f:
    f.write(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
open(os.path.join(out, "empty.onnx"), "wb").close()

save("empty-graph", model([], [], []))
save("no-outputs", model([relu], [x], []))
save("opset-too-old", model([relu], [x], [y], opset=9))
save("opset-too-new", model([relu], [x], [y], opset=99))
save("ir-too-old", model([relu], [x], [y], ir=3))
save("ir-too-new", model([relu], [x], [y], ir=99))
no_ir = model([relu], [x], [y])
no_ir.ClearField("ir_version")
save("no-ir-version", no_ir)

save("unsupported-op",
     model([helper.make_node("Celu", ["x"], ["y"], name="celu7")], [x], [y]))
save("unsupported-domain",
     model([helper.make_node("Relu", ["x"], ["y"], name="custom0",
                             domain="com.example")], [x], [y]))
save("undefined-input",
     model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add0")], [x], [y]))
save("undefined-output", model([relu], [x], [helper.make_tensor_value_info(
    "nowhere", TensorProto.FLOAT, [2, 3])]))
save("cycle", model([helper.make_node("Add", ["x", "b"], ["a"], name="add_a"),
                     helper.make_node("Relu", ["a"], ["b"], name="relu_b"),
                     helper.make_node("Relu", ["a"], ["y"], name="relu_y")],
                    [x], [y]))
save("duplicate-definition",
     model([relu, helper.make_node("Neg", ["x"], ["y"], name="neg0")], [x], [y]))

# Inconsistent shapes: operands that do not broadcast, a contraction
# mismatch, and a declared output shape the graph does not produce.
z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [5])
save("add-no-broadcast",
     model([helper.make_node("Add", ["x", "z"], ["y"], name="add_xz")], [x, z], [y]))
w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 2])
save("matmul-mismatch",
     model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm0")], [x, w],
           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])]))
save("declared-shape-mismatch", model([relu], [x], [
    helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])]))
save("value-info-mismatch",
     model([relu, helper.make_node("Neg", ["y"], ["n"], name="neg1")], [x],
           [helper.make_tensor_value_info("n", TensorProto.FLOAT, [2, 3])],
           value_info=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 3])]))
save("reshape-bad-count",
     model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape0")],
           [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])],
           inits=[numpy_helper.from_array(np.array([5], np.int64), "shape")]))

# Initializer bytes that disagree with their dims.
bad_init = numpy_helper.from_array(np.ones((2, 3), np.float32), "b")
bad_init.raw_data = bad_init.raw_data[:-4]
save("initializer-short",
     model([helper.make_node("Add", ["x", "b"], ["y"], name="add_b")], [x], [y],
           inits=[bad_init]))
typed = helper.make_tensor("b", TensorProto.FLOAT, [2, 3], [1.0] * 6)
del typed.float_data[-1]
save("initializer-typed-short",
     model([helper.make_node("Add", ["x", "b"], ["y"], name="add_b")], [x], [y],
           inits=[typed]))

# Symbolic dims: bound with --bind-dim or rejected.
xs = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
ys = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
save("symbolic", model([relu], [xs], [ys]))


# External data: a valid one, and paths that leave the model's folder.
def external(name, location):
    t = numpy_helper.from_array(np.ones((2, 3), np.float32), "b")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "24")):
        e = t.external_data.add()
        e.key, e.value = k, v
    save(name, model([helper.make_node("Add", ["x", "b"], ["y"], name="add_b")],
                     [x], [y], inits=[t]))


with open(os.path.join(out, "weights.bin"), "wb") as f:
    f.write(np.full((2, 3), 2.0, np.float32).tobytes())
outside = os.path.join(os.path.dirname(os.path.abspath(out)), "outside.bin")
with open(outside, "wb") as f:
    f.write(np.ones((2, 3), np.float32).tobytes())
link = os.path.join(out, "link.bin")
if os.path.lexists(link):
    os.remove(link)
os.symlink(outside, link)
external("external-ok", "weights.bin")
external("external-absolute", outside)
external("external-dotdot", "../outside.bin")
external("external-symlink", "link.bin")
external("external-missing", "missing.bin")
