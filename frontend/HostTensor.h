//===- HostTensor.h - tensors the importer knows at import time -*- C++ -*-===//
//
// Exporters spell shape arithmetic, masks and position tables as small ONNX
// subgraphs over constants. Once symbolic dims are bound, all of it is known
// at import time: the importer evaluates it on these host tensors and only the
// results that feed real compute become `model.constant`s.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_FRONTEND_HOSTTENSOR_H
#define FASTLLM_FRONTEND_HOSTTENSOR_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace mlir::fastllm {

/// `v` truncated toward zero, saturated to int64's range (NaN gives 0): C++'s
/// conversion is undefined outside the range, and constants come from the
/// input.
inline int64_t truncateToInt64(double v) {
  if (!(v == v))
    return 0;
  if (v >= 9223372036854775808.0)
    return INT64_MAX;
  if (v < -9223372036854775808.0)
    return INT64_MIN;
  return (int64_t)v;
}

/// A tensor whose elements the importer holds. Float element types keep
/// their values as doubles rounded to the element type after every operation;
/// integer and boolean ones as int64.
struct HostTensor {
  Type elementType;
  llvm::SmallVector<int64_t> shape;
  std::vector<double> floats;
  std::vector<int64_t> ints;

  static HostTensor filled(Type elementType, llvm::ArrayRef<int64_t> shape,
                           double value);
  bool isFloat() const { return llvm::isa<FloatType>(elementType); }
  int64_t numElements() const;
  double getDouble(int64_t k) const {
    return isFloat() ? floats[k] : (double)ints[k];
  }
  int64_t getInt(int64_t k) const {
    return isFloat() ? truncateToInt64(floats[k]) : ints[k];
  }
  /// Stores `v` at `k`, rounded/truncated to the element type.
  void set(int64_t k, double v);
  void setInt(int64_t k, int64_t v);
  /// The elements as int64 (truncating floats).
  llvm::SmallVector<int64_t> toInts() const;
  RankedTensorType getType() const {
    return RankedTensorType::get(shape, elementType);
  }
  DenseElementsAttr toAttr() const;
};

/// Rounds `v` to what `type` can hold (f32, f16, bf16, f64; ints truncate).
double roundToType(Type type, double v);

/// NumPy broadcast of two shapes, or nullopt when they are incompatible.
std::optional<llvm::SmallVector<int64_t>>
broadcastShapes(llvm::ArrayRef<int64_t> a, llvm::ArrayRef<int64_t> b);

/// Linear index into an operand of shape `operand` for the element at
/// multi-index `index` of its broadcast result.
int64_t broadcastSourceIndex(llvm::ArrayRef<int64_t> index,
                             llvm::ArrayRef<int64_t> operand);

/// Calls `fn(multiIndex, linear)` for every element of `shape`, row-major.
void forEachIndex(
    llvm::ArrayRef<int64_t> shape,
    llvm::function_ref<void(llvm::ArrayRef<int64_t>, int64_t)> fn);

/// Row-major strides of `shape`.
llvm::SmallVector<int64_t> stridesOf(llvm::ArrayRef<int64_t> shape);

} // namespace mlir::fastllm

#endif // FASTLLM_FRONTEND_HOSTTENSOR_H
