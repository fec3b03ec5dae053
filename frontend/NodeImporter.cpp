//===- NodeImporter.cpp - what an op converter sees -------------*- C++ -*-===//
//
// A converter reads its node's inputs and attributes and defines its outputs
// through NodeImporter, which looks them up in (and records them into) the
// GraphImporter.
//
//===----------------------------------------------------------------------===//

#include "frontend/NodeImporter.h"
#include "frontend/GraphImporter.h"

using namespace mlir;
using namespace mlir::fastllm;

InFlightDiagnostic NodeImporter::error() {
  return mlir::emitError(loc)
         << "node '" << displayName << "' (" << node.op_type() << "): ";
}

RankedTensorType NodeImporter::inputType(unsigned i) {
  return graph.lookup(node.input(i))->type;
}

const HostTensor *NodeImporter::hostInput(unsigned i) {
  if (!hasInput(i))
    return nullptr;
  return graph.lookup(node.input(i))->host.get();
}

FailureOr<const HostTensor *> NodeImporter::requireHostInput(unsigned i,
                                                             StringRef what) {
  if (!hasInput(i))
    return error() << "missing input " << what, failure();
  if (const HostTensor *t = hostInput(i))
    return t;
  return error() << what << " (input '" << node.input(i)
                 << "') must be known at import time",
         failure();
}

bool NodeImporter::allInputsHost() {
  for (unsigned i = 0; i < numInputs(); ++i)
    if (hasInput(i) && !hostInput(i))
      return false;
  return true;
}

Value NodeImporter::operand(unsigned i) {
  return graph.materialize(*graph.lookup(node.input(i)));
}

LogicalResult NodeImporter::requireFloat(unsigned i) {
  Type t = inputType(i).getElementType();
  if (isa<FloatType>(t))
    return success();
  return error() << "input '" << node.input(i)
                 << "' must be a float tensor, got " << t;
}

const onnx::AttributeProto *NodeImporter::attribute(StringRef name) const {
  for (const onnx::AttributeProto &a : node.attribute())
    if (a.name() == name)
      return &a;
  return nullptr;
}

const onnx::AttributeProto *
NodeImporter::typedAttribute(StringRef name,
                             onnx::AttributeProto::AttributeType type) const {
  const onnx::AttributeProto *a = attribute(name);
  if (!a || a->type() == type)
    return a;
  if (attributeError.empty())
    attributeError =
        ("attribute '" + name + "' must be of type " +
         onnx::AttributeProto::AttributeType_Name(type) + ", got " +
         onnx::AttributeProto::AttributeType_Name(a->type()))
            .str();
  return nullptr;
}

int64_t NodeImporter::intAttr(StringRef name, int64_t defaultValue) const {
  const onnx::AttributeProto *a =
      typedAttribute(name, onnx::AttributeProto::INT);
  return a ? a->i() : defaultValue;
}

float NodeImporter::floatAttr(StringRef name, float defaultValue) const {
  const onnx::AttributeProto *a =
      typedAttribute(name, onnx::AttributeProto::FLOAT);
  return a ? a->f() : defaultValue;
}

std::string NodeImporter::stringAttr(StringRef name,
                                     StringRef defaultValue) const {
  const onnx::AttributeProto *a =
      typedAttribute(name, onnx::AttributeProto::STRING);
  return a ? a->s() : defaultValue.str();
}

std::optional<SmallVector<int64_t>>
NodeImporter::intsAttr(StringRef name) const {
  const onnx::AttributeProto *a =
      typedAttribute(name, onnx::AttributeProto::INTS);
  if (!a)
    return std::nullopt;
  return SmallVector<int64_t>(a->ints().begin(), a->ints().end());
}

bool NodeImporter::outputUsed(unsigned i) const {
  return (int)i < node.output_size() && !node.output(i).empty() &&
         graph.isUsed(node.output(i));
}

void NodeImporter::setOutput(unsigned i, Value value) {
  if ((int)i >= node.output_size() || node.output(i).empty())
    return;
  ImportedValue v;
  v.type = cast<RankedTensorType>(value.getType());
  v.value = value;
  graph.define(node.output(i), std::move(v));
}

void NodeImporter::setOutput(unsigned i, HostTensor tensor) {
  if ((int)i >= node.output_size() || node.output(i).empty())
    return;
  ImportedValue v;
  v.type = tensor.getType();
  v.host = std::make_shared<HostTensor>(std::move(tensor));
  graph.define(node.output(i), std::move(v));
}

bool NodeImporter::splitParameter(unsigned out, unsigned in) {
  if ((int)out >= node.output_size() || node.output(out).empty() ||
      !hasInput(in))
    return false;
  return graph.splitParameter(node.input(in), node.output(out));
}

void NodeImporter::forwardInput(unsigned out, unsigned in) {
  if ((int)out >= node.output_size() || node.output(out).empty())
    return;
  ImportedValue copy = *graph.lookup(node.input(in));
  graph.define(node.output(out), std::move(copy));
}

LogicalResult NodeImporter::checkFoldSize(ArrayRef<int64_t> shape) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d != 0 && count > kMaxFoldElements / d)
      count = kMaxFoldElements + 1;
    else
      count *= d;
  }
  if (count > kMaxFoldElements)
    return error() << "folding this node would create a constant of more than "
                   << kMaxFoldElements << " elements";
  if (!graph.chargeFold(count))
    return error() << "folding this node would take the model's folded "
                      "constants past "
                   << kMaxTotalFoldElements << " elements in all";
  return success();
}

FailureOr<int64_t> NodeImporter::normalizeAxis(int64_t axis, int64_t rank) {
  if (rank == 0 || axis < -rank || axis >= rank)
    return error() << "axis " << axis << " is out of range for rank " << rank,
           failure();
  return axis < 0 ? axis + rank : axis;
}

FailureOr<HostTensor>
NodeImporter::decodeTensorAttribute(const onnx::AttributeProto &attr) {
  std::string what =
      "node '" + displayName + "' (" + node.op_type() + "): " + attr.name();
  return graph.decodeConstantTensor(
      attr.t(), what, [&]() { return error() << attr.name() << " "; });
}
