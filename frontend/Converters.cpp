//===- Converters.cpp - one converter per ONNX op and opset form ----------===//
//
// Each converter either evaluates its node on host tensors (when everything it
// reads is known at import time: shape arithmetic, masks, position tables) or
// emits model-dialect ops. Shapes are checked by the converters so that a
// malformed model gets a diagnostic naming the node, not a verifier failure.
// The converters live in one file per op family (Converters.h lists them);
// this file holds the helpers they share and the table of them.
//
//===----------------------------------------------------------------------===//

#include "frontend/Converters.h"
#include "ir/ModelDialect.h"

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::converters;
namespace m = mlir::fastllm::model;

//===----------------------------------------------------------------------===//
// Shared helpers
//===----------------------------------------------------------------------===//

Value converters::constant(NodeImporter &n, const HostTensor &t) {
  return n.getBuilder().create<m::ConstantOp>(n.getLoc(), t.toAttr());
}

HostTensor converters::reshaped(const HostTensor &t, ArrayRef<int64_t> shape) {
  HostTensor out = t;
  out.shape.assign(shape.begin(), shape.end());
  return out;
}

Value converters::reshape(NodeImporter &n, Value v, ArrayRef<int64_t> shape) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getShape() == shape)
    return v;
  return n.create<m::ReshapeOp>(tensorOf(shape, type.getElementType()), v);
}

LogicalResult converters::setReshaped(NodeImporter &n, unsigned in,
                                      ArrayRef<int64_t> shape) {
  if (product(shape) != product(n.inputShape(in)))
    return n.error() << "cannot reshape " << shapeString(n.inputShape(in))
                     << " to " << shapeString(shape);
  if (const HostTensor *h = n.hostInput(in))
    n.setOutput(0, reshaped(*h, shape));
  else
    n.setOutput(0, reshape(n, n.operand(in), shape));
  return success();
}

HostTensor converters::hostElementwise(
    ArrayRef<const HostTensor *> ins, ArrayRef<int64_t> shape, Type outType,
    llvm::function_ref<void(HostTensor &, int64_t, ArrayRef<int64_t>)> fn) {
  HostTensor out = HostTensor::filled(outType, shape, 0);
  SmallVector<int64_t> src(ins.size());
  forEachIndex(shape, [&](ArrayRef<int64_t> index, int64_t k) {
    for (auto [i, in] : llvm::enumerate(ins))
      src[i] = broadcastSourceIndex(index, in->shape);
    fn(out, k, src);
  });
  return out;
}

FailureOr<SmallVector<int64_t>>
converters::shapeInput(NodeImporter &n, unsigned i, StringRef what) {
  auto t = n.requireHostInput(i, what);
  if (failed(t))
    return failure();
  if ((*t)->shape.size() > 1 || (*t)->isFloat())
    return n.error() << what << " must be a 1-D integer tensor", failure();
  return (*t)->toInts();
}

FailureOr<std::optional<SmallVector<int64_t>>>
converters::axesOperand(NodeImporter &n, unsigned i, bool fromInput) {
  if (!fromInput)
    return n.intsAttr("axes");
  if (!n.hasInput(i))
    return std::optional<SmallVector<int64_t>>();
  auto axes = shapeInput(n, i, "axes");
  if (failed(axes))
    return failure();
  return std::optional<SmallVector<int64_t>>(*axes);
}

FailureOr<SmallVector<int64_t>>
converters::normalizeAxes(NodeImporter &n, ArrayRef<int64_t> axes,
                          int64_t rank) {
  SmallVector<int64_t> out;
  for (int64_t a : axes) {
    auto axis = n.normalizeAxis(a, rank);
    if (failed(axis))
      return failure();
    if (llvm::is_contained(out, *axis))
      return n.error() << "axis " << a << " is repeated", failure();
    out.push_back(*axis);
  }
  llvm::sort(out);
  return out;
}

//===----------------------------------------------------------------------===//
// The table
//===----------------------------------------------------------------------===//

static const OnnxConverterEntry kConverters[] = {
    {"Add", 13, 2, convertAdd},
    {"Sub", 13, 2, convertSub},
    {"Mul", 13, 2, convertMul},
    {"Div", 13, 2, convertDiv},
    {"Pow", 13, 2, convertPow},
    {"And", 7, 2, convertAnd},
    {"Or", 7, 2, convertOr},
    {"Equal", 13, 2, convertEqual},
    {"Less", 13, 2, convertLess},
    {"LessOrEqual", 12, 2, convertLessOrEqual},
    {"Greater", 13, 2, convertGreater},
    {"GreaterOrEqual", 12, 2, convertGreaterOrEqual},
    {"Not", 1, 1, convertNot},
    {"Where", 9, 3, convertWhere},
    {"Sqrt", 13, 1, convertSqrt},
    {"Reciprocal", 13, 1, convertReciprocal},
    {"Exp", 13, 1, convertExp},
    {"Log", 13, 1, convertLog},
    {"Tanh", 13, 1, convertTanh},
    {"Erf", 13, 1, convertErf},
    {"Sigmoid", 13, 1, convertSigmoid},
    {"Relu", 13, 1, convertRelu},
    {"Sin", 7, 1, convertSin},
    {"Cos", 7, 1, convertCos},
    {"Neg", 13, 1, convertNeg},
    {"Cast", 13, 1, convertCast},
    {"Identity", 13, 1, convertIdentity},
    {"Dropout", 13, 1, convertDropout},
    {"Constant", 13, 0, convertConstant},
    {"ConstantOfShape", 9, 1, convertConstantOfShape},
    {"Shape", 13, 1, convertShape},
    {"Size", 13, 1, convertSize},
    {"Range", 11, 3, convertRange},
    {"Reshape", 13, 2, convertReshape},
    {"Flatten", 13, 1, convertFlatten},
    {"Squeeze", 13, 1, convertSqueeze},
    {"Unsqueeze", 13, 2, convertUnsqueeze},
    {"Expand", 13, 2, convertExpand},
    {"Trilu", 14, 1, convertTrilu},
    {"Transpose", 13, 1, convertTranspose},
    {"Concat", 13, 1, convertConcat},
    {"Slice", 13, 3, convertSlice},
    {"Split", 13, 1, convertSplit},
    {"Gather", 13, 2, convertGather},
    {"MatMul", 13, 2, convertMatMul},
    {"Gemm", 13, 2, convertGemm},
    {"ReduceSum", 13, 1, convertReduceSum},
    {"ReduceMean", 13, 1, convertReduceMean},
    {"ReduceMax", 13, 1, convertReduceMax},
    {"Softmax", 13, 1, convertSoftmax},
    {"LogSoftmax", 13, 1, convertLogSoftmax},
    {"LayerNormalization", 17, 2, convertLayerNorm},
    {"SoftmaxCrossEntropyLoss", 13, 2, convertSoftmaxCrossEntropyLoss},
    {"NegativeLogLikelihoodLoss", 13, 2, convertNegativeLogLikelihoodLoss},
};

ArrayRef<OnnxConverterEntry> mlir::fastllm::getOnnxConverters() {
  return kConverters;
}

const OnnxConverterEntry *mlir::fastllm::lookupOnnxConverter(StringRef opType,
                                                             int64_t opset) {
  const OnnxConverterEntry *best = nullptr;
  for (const OnnxConverterEntry &e : kConverters)
    if (opType == e.opType && e.sinceVersion <= opset &&
        (!best || e.sinceVersion > best->sinceVersion))
      best = &e;
  return best;
}
