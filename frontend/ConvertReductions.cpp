//===- ConvertReductions.cpp - reductions, softmax, norms -------*- C++ -*-===//
//
// ReduceSum, ReduceMean and ReduceMax (axes an attribute or an input,
// depending on the op and opset), Softmax and LogSoftmax along one axis, and
// LayerNormalization.
//
//===----------------------------------------------------------------------===//

#include "frontend/Converters.h"
#include "ir/ModelDialect.h"

#include <cmath>

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::converters;
namespace m = mlir::fastllm::model;

template <typename OpTy, bool AxesFromInputSince13>
static LogicalResult convertReduce(NodeImporter &n) {
  ArrayRef<int64_t> in = n.inputShape(0);
  // ReduceSum takes axes as an input from opset 13, the others from 18.
  bool fromInput = AxesFromInputSince13 || n.getOpset() >= 18;
  auto axes = axesOperand(n, 1, fromInput);
  if (failed(axes))
    return failure();
  bool keepDims = n.intAttr("keepdims", 1) != 0;
  SmallVector<int64_t> dims;
  if (*axes && !(*axes)->empty()) {
    auto sorted = normalizeAxes(n, **axes, in.size());
    if (failed(sorted))
      return failure();
    dims = *sorted;
  } else if (n.intAttr("noop_with_empty_axes", 0)) {
    n.forwardInput(0, 0);
    return success();
  } else {
    for (size_t i = 0; i < in.size(); ++i)
      dims.push_back(i);
  }
  n.setOutput(0, n.createInferred<OpTy>(n.operand(0), dims, keepDims));
  return success();
}

LogicalResult converters::convertReduceSum(NodeImporter &n) {
  return convertReduce<m::ReduceSumOp, true>(n);
}

LogicalResult converters::convertReduceMean(NodeImporter &n) {
  return convertReduce<m::ReduceMeanOp, false>(n);
}

LogicalResult converters::convertReduceMax(NodeImporter &n) {
  return convertReduce<m::ReduceMaxOp, false>(n);
}

template <typename OpTy>
static LogicalResult convertSoftmaxLike(NodeImporter &n) {
  if (failed(n.requireFloat(0)))
    return failure();
  auto axis = n.normalizeAxis(n.intAttr("axis", -1), n.inputType(0).getRank());
  if (failed(axis))
    return failure();
  n.setOutput(0, n.create<OpTy>(n.inputType(0), n.operand(0), *axis));
  return success();
}

LogicalResult converters::convertSoftmax(NodeImporter &n) {
  return convertSoftmaxLike<m::SoftmaxOp>(n);
}

LogicalResult converters::convertLogSoftmax(NodeImporter &n) {
  return convertSoftmaxLike<m::LogSoftmaxOp>(n);
}

LogicalResult converters::convertLayerNorm(NodeImporter &n) {
  if (failed(n.requireFloat(0)))
    return failure();
  RankedTensorType type = n.inputType(0);
  auto axis = n.normalizeAxis(n.intAttr("axis", -1), type.getRank());
  if (failed(axis))
    return failure();
  if (n.outputUsed(1) || n.outputUsed(2))
    return n.error() << "the Mean and InvStdDev outputs are not supported";
  ArrayRef<int64_t> normalized = type.getShape().drop_front(*axis);
  auto affine = [&](unsigned i) -> FailureOr<Value> {
    if (n.inputType(i).getElementType() != type.getElementType())
      return n.error() << "scale and bias must have the input's element type",
             failure();
    if (product(n.inputShape(i)) != product(normalized))
      return n.error() << "scale/bias of shape " << shapeString(n.inputShape(i))
                       << " does not match the normalised shape "
                       << shapeString(normalized),
             failure();
    return reshape(n, n.operand(i), normalized);
  };
  auto scale = affine(1);
  if (failed(scale))
    return failure();
  Value bias;
  if (n.hasInput(2)) {
    auto b = affine(2);
    if (failed(b))
      return failure();
    bias = *b;
  }
  float eps = n.floatAttr("epsilon", 1e-5f);
  if (!std::isfinite(eps) || eps <= 0)
    return n.error() << "epsilon must be finite and positive, got " << eps;
  n.setOutput(0, n.createInferred<m::LayerNormOp>(
                     n.operand(0), *scale, bias,
                     n.getBuilder().getI64IntegerAttr(*axis),
                     n.getBuilder().getF32FloatAttr(eps)));
  return success();
}

/// SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss: inputs are
