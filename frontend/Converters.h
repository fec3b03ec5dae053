//===- Converters.h - what the converter files share ------------*- C++ -*-===//
//
// Private to frontend/. The converters live in one file per op family; the
// table that maps ONNX op types to them (kConverters) and the helpers they
// share live in Converters.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_FRONTEND_CONVERTERS_H
#define FASTLLM_FRONTEND_CONVERTERS_H

#include "frontend/NodeImporter.h"

#include <optional>

namespace mlir::fastllm::converters {

//===----------------------------------------------------------------------===//
// Shared helpers (Converters.cpp)
//===----------------------------------------------------------------------===//

inline RankedTensorType tensorOf(ArrayRef<int64_t> shape, Type elementType) {
  return RankedTensorType::get(shape, elementType);
}

inline int64_t product(ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// Materialises a host tensor as an SSA constant.
Value constant(NodeImporter &n, const HostTensor &t);

/// A host tensor with another shape but the same elements (row-major).
HostTensor reshaped(const HostTensor &t, ArrayRef<int64_t> shape);

/// Emits a reshape unless the shape already matches.
Value reshape(NodeImporter &n, Value v, ArrayRef<int64_t> shape);

/// Output 0 becomes input `in` reshaped to `shape` (host or emitted).
LogicalResult setReshaped(NodeImporter &n, unsigned in,
                          ArrayRef<int64_t> shape);

/// Host evaluation of an elementwise op over broadcast operands:
/// `fn(out, k, src)` sets element `k` of the result from element `src[i]` of
/// input `i`.
HostTensor hostElementwise(
    ArrayRef<const HostTensor *> ins, ArrayRef<int64_t> shape, Type outType,
    llvm::function_ref<void(HostTensor &, int64_t, ArrayRef<int64_t>)> fn);

/// Reads a 1-D int64 shape input.
FailureOr<SmallVector<int64_t>> shapeInput(NodeImporter &n, unsigned i,
                                           StringRef what);

/// Axes from the input at `i` (opset 13+) or the `axes` attribute (older).
FailureOr<std::optional<SmallVector<int64_t>>>
axesOperand(NodeImporter &n, unsigned i, bool fromInput);

/// Normalised, sorted, distinct axes.
FailureOr<SmallVector<int64_t>>
normalizeAxes(NodeImporter &n, ArrayRef<int64_t> axes, int64_t rank);

//===----------------------------------------------------------------------===//
// The converters, by file
//===----------------------------------------------------------------------===//

// ConvertElementwise.cpp
LogicalResult convertAdd(NodeImporter &n);
LogicalResult convertSub(NodeImporter &n);
LogicalResult convertMul(NodeImporter &n);
LogicalResult convertDiv(NodeImporter &n);
LogicalResult convertPow(NodeImporter &n);
LogicalResult convertAnd(NodeImporter &n);
LogicalResult convertOr(NodeImporter &n);
LogicalResult convertEqual(NodeImporter &n);
LogicalResult convertLess(NodeImporter &n);
LogicalResult convertLessOrEqual(NodeImporter &n);
LogicalResult convertGreater(NodeImporter &n);
LogicalResult convertGreaterOrEqual(NodeImporter &n);
LogicalResult convertNot(NodeImporter &n);
LogicalResult convertWhere(NodeImporter &n);
LogicalResult convertSqrt(NodeImporter &n);
LogicalResult convertReciprocal(NodeImporter &n);
LogicalResult convertExp(NodeImporter &n);
LogicalResult convertLog(NodeImporter &n);
LogicalResult convertTanh(NodeImporter &n);
LogicalResult convertErf(NodeImporter &n);
LogicalResult convertSigmoid(NodeImporter &n);
LogicalResult convertRelu(NodeImporter &n);
LogicalResult convertSin(NodeImporter &n);
LogicalResult convertCos(NodeImporter &n);
LogicalResult convertNeg(NodeImporter &n);
LogicalResult convertCast(NodeImporter &n);
LogicalResult convertIdentity(NodeImporter &n);
LogicalResult convertDropout(NodeImporter &n);

// ConvertConstants.cpp
LogicalResult convertConstant(NodeImporter &n);
LogicalResult convertConstantOfShape(NodeImporter &n);
LogicalResult convertShape(NodeImporter &n);
LogicalResult convertSize(NodeImporter &n);
LogicalResult convertRange(NodeImporter &n);
LogicalResult convertReshape(NodeImporter &n);
LogicalResult convertFlatten(NodeImporter &n);
LogicalResult convertSqueeze(NodeImporter &n);
LogicalResult convertUnsqueeze(NodeImporter &n);
LogicalResult convertExpand(NodeImporter &n);
LogicalResult convertTrilu(NodeImporter &n);

// ConvertDataMovement.cpp
LogicalResult convertTranspose(NodeImporter &n);
LogicalResult convertConcat(NodeImporter &n);
LogicalResult convertSlice(NodeImporter &n);
LogicalResult convertSplit(NodeImporter &n);
LogicalResult convertGather(NodeImporter &n);

// ConvertMatMul.cpp
LogicalResult convertMatMul(NodeImporter &n);
LogicalResult convertGemm(NodeImporter &n);

// ConvertReductions.cpp
LogicalResult convertReduceSum(NodeImporter &n);
LogicalResult convertReduceMean(NodeImporter &n);
LogicalResult convertReduceMax(NodeImporter &n);
LogicalResult convertSoftmax(NodeImporter &n);
LogicalResult convertLogSoftmax(NodeImporter &n);
LogicalResult convertLayerNorm(NodeImporter &n);

// ConvertLosses.cpp
LogicalResult convertSoftmaxCrossEntropyLoss(NodeImporter &n);
LogicalResult convertNegativeLogLikelihoodLoss(NodeImporter &n);

} // namespace mlir::fastllm::converters

#endif // FASTLLM_FRONTEND_CONVERTERS_H
