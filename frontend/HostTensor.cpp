//===- HostTensor.cpp -----------------------------------------------------===//

#include "frontend/HostTensor.h"

#include "llvm/ADT/APFloat.h"

using namespace mlir;
using namespace mlir::fastllm;

HostTensor HostTensor::filled(Type elementType, ArrayRef<int64_t> shape,
                              double value) {
  HostTensor t;
  t.elementType = elementType;
  t.shape.assign(shape.begin(), shape.end());
  int64_t n = t.numElements();
  if (t.isFloat())
    t.floats.assign(n, roundToType(elementType, value));
  else
    t.ints.assign(n, truncateToInt64(roundToType(elementType, value)));
  return t;
}

int64_t HostTensor::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

void HostTensor::set(int64_t k, double v) {
  if (isFloat())
    floats[k] = roundToType(elementType, v);
  else
    ints[k] = truncateToInt64(roundToType(elementType, v));
}

void HostTensor::setInt(int64_t k, int64_t v) {
  if (isFloat())
    floats[k] = roundToType(elementType, (double)v);
  else if (elementType.isInteger(1))
    ints[k] = v != 0;
  else
    ints[k] = v;
}

SmallVector<int64_t> HostTensor::toInts() const {
  SmallVector<int64_t> out;
  for (int64_t k = 0, n = numElements(); k < n; ++k)
    out.push_back(getInt(k));
  return out;
}

double mlir::fastllm::roundToType(Type type, double v) {
  if (type.isF32())
    return (double)(float)v;
  if (type.isF64())
    return v;
  if (auto ft = dyn_cast<FloatType>(type)) {
    bool lost;
    llvm::APFloat f(v);
    f.convert(ft.getFloatSemantics(), llvm::APFloat::rmNearestTiesToEven,
              &lost);
    return f.convertToDouble();
  }
  if (type.isInteger(1))
    return v != 0.0;
  // Float to integer truncates toward zero, as ONNX Cast does.
  return (double)truncateToInt64(v);
}

DenseElementsAttr HostTensor::toAttr() const {
  RankedTensorType type = getType();
  int64_t n = numElements();
  auto allSame = [&] {
    for (int64_t k = 1; k < n; ++k)
      if (isFloat() ? floats[k] != floats[0] : ints[k] != ints[0])
        return false;
    return true;
  };
  // Splats keep big masks and fills small in the IR.
  int64_t count = (n > 1 && allSame()) ? 1 : n;
  RankedTensorType storage =
      count == n ? type : RankedTensorType::get({}, elementType);
  DenseElementsAttr attr;
  if (elementType.isF32()) {
    std::vector<float> v(floats.begin(), floats.begin() + count);
    attr = DenseElementsAttr::get(storage, ArrayRef<float>(v));
  } else if (elementType.isF64()) {
    attr =
        DenseElementsAttr::get(storage, ArrayRef<double>(floats.data(), count));
  } else if (auto ft = dyn_cast<FloatType>(elementType)) {
    SmallVector<APFloat> v;
    for (int64_t k = 0; k < count; ++k) {
      bool lost;
      APFloat f(floats[k]);
      f.convert(ft.getFloatSemantics(), APFloat::rmNearestTiesToEven, &lost);
      v.push_back(f);
    }
    attr = DenseElementsAttr::get(storage, v);
  } else if (elementType.isInteger(1)) {
    SmallVector<bool> v(ints.begin(), ints.begin() + count);
    attr = DenseElementsAttr::get(storage, ArrayRef<bool>(v));
  } else {
    unsigned width = elementType.getIntOrFloatBitWidth();
    SmallVector<APInt> v;
    for (int64_t k = 0; k < count; ++k)
      v.push_back(APInt(width, (uint64_t)ints[k], /*isSigned=*/true));
    attr = DenseElementsAttr::get(storage, v);
  }
  return count == n ? attr : attr.resizeSplat(type);
}

std::optional<SmallVector<int64_t>>
mlir::fastllm::broadcastShapes(ArrayRef<int64_t> a, ArrayRef<int64_t> b) {
  size_t rank = std::max(a.size(), b.size());
  SmallVector<int64_t> out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

SmallVector<int64_t> mlir::fastllm::stridesOf(ArrayRef<int64_t> shape) {
  SmallVector<int64_t> strides(shape.size(), 1);
  for (int64_t i = (int64_t)shape.size() - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

int64_t mlir::fastllm::broadcastSourceIndex(ArrayRef<int64_t> index,
                                            ArrayRef<int64_t> operand) {
  size_t offset = index.size() - operand.size();
  int64_t linear = 0;
  for (size_t i = 0; i < operand.size(); ++i)
    linear = linear * operand[i] + (operand[i] == 1 ? 0 : index[offset + i]);
  return linear;
}

void mlir::fastllm::forEachIndex(
    ArrayRef<int64_t> shape,
    llvm::function_ref<void(ArrayRef<int64_t>, int64_t)> fn) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  SmallVector<int64_t> index(shape.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    fn(index, k);
    for (int64_t i = (int64_t)shape.size() - 1; i >= 0; --i) {
      if (++index[i] < shape[i])
        break;
      index[i] = 0;
    }
  }
}
