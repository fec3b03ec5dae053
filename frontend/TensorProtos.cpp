//===- TensorProtos.cpp - ONNX element types and tensor data ----*- C++ -*-===//
//
// What a TensorProto holds: its element type and dims, and its elements,
// stored in raw_data or in the typed fields. Initializers (Initializers.cpp)
// and Constant nodes (the converters) both read tensors through these.
//
//===----------------------------------------------------------------------===//

#include "frontend/GraphImporter.h"

#include "llvm/ADT/APFloat.h"

#include <cstring>

using namespace mlir;
using namespace mlir::fastllm;

//===----------------------------------------------------------------------===//
// Element types
//===----------------------------------------------------------------------===//

Type mlir::fastllm::convertOnnxElementType(MLIRContext *context,
                                           int32_t dataType) {
  Builder b(context);
  switch (dataType) {
  case onnx::TensorProto::FLOAT:
    return b.getF32Type();
  case onnx::TensorProto::DOUBLE:
    return b.getF64Type();
  case onnx::TensorProto::FLOAT16:
    return b.getF16Type();
  case onnx::TensorProto::BFLOAT16:
    return b.getBF16Type();
  case onnx::TensorProto::INT64:
    return b.getI64Type();
  case onnx::TensorProto::INT32:
    return b.getI32Type();
  case onnx::TensorProto::INT8:
    return b.getI8Type();
  case onnx::TensorProto::BOOL:
    return b.getI1Type();
  default:
    return nullptr;
  }
}

std::string mlir::fastllm::onnxDataTypeName(int32_t dataType) {
  if (onnx::TensorProto::DataType_IsValid(dataType))
    return onnx::TensorProto::DataType_Name(
        static_cast<onnx::TensorProto::DataType>(dataType));
  return "data type " + std::to_string(dataType);
}

size_t mlir::fastllm::byteWidth(Type type) {
  return type.isInteger(1) ? 1 : type.getIntOrFloatBitWidth() / 8;
}

std::string mlir::fastllm::shapeString(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape))
    s += (i ? ", " : "") + std::to_string(d);
  return s + "]";
}

//===----------------------------------------------------------------------===//
// Tensor data
//===----------------------------------------------------------------------===//

/// Decodes element `k` of little-endian raw bytes of `type`.
static double decodeRaw(Type type, const char *data, int64_t k) {
  auto load = [&](auto tag) {
    decltype(tag) v;
    std::memcpy(&v, data + k * sizeof(v), sizeof(v));
    return v;
  };
  if (type.isF32())
    return load(float());
  if (type.isF64())
    return load(double());
  if (type.isF16() || type.isBF16()) {
    uint16_t bits = load(uint16_t());
    APFloat f(cast<FloatType>(type).getFloatSemantics(), APInt(16, bits));
    return f.convertToDouble();
  }
  if (type.isInteger(64))
    return (double)load(int64_t());
  if (type.isInteger(32))
    return load(int32_t());
  if (type.isInteger(8))
    return load(int8_t());
  return load(uint8_t()) != 0; // bool
}

static int64_t decodeRawInt(Type type, const char *data, int64_t k) {
  if (type.isInteger(64)) {
    int64_t v;
    std::memcpy(&v, data + k * 8, 8);
    return v;
  }
  return (int64_t)decodeRaw(type, data, k);
}

FailureOr<RankedTensorType>
mlir::fastllm::tensorProtoType(const onnx::TensorProto &tensor,
                               MLIRContext *context,
                               llvm::function_ref<InFlightDiagnostic()> error) {
  Type elementType = convertOnnxElementType(context, tensor.data_type());
  if (!elementType)
    return error() << "unsupported element type "
                   << onnxDataTypeName(tensor.data_type()),
           failure();
  SmallVector<int64_t> shape;
  int64_t count = 1;
  for (int64_t d : tensor.dims()) {
    if (d < 0 || (d > 0 && count > (int64_t(1) << 40) / d))
      return error() << "invalid dims", failure();
    shape.push_back(d);
    count *= d;
  }
  return RankedTensorType::get(shape, elementType);
}

FailureOr<std::unique_ptr<std::string>> mlir::fastllm::tensorProtoBytes(
    const onnx::TensorProto &tensor, RankedTensorType type,
    llvm::function_ref<InFlightDiagnostic()> error) {
  Type elementType = type.getElementType();
  int64_t count = type.getNumElements();
  size_t width = byteWidth(elementType);
  size_t expected = count * width;
  if (tensor.has_raw_data()) {
    if (tensor.raw_data().size() != expected)
      return error() << "has " << tensor.raw_data().size()
                     << " bytes of data but its dims "
                     << shapeString(type.getShape()) << " need " << expected,
             failure();
    return std::make_unique<std::string>(tensor.raw_data());
  }
  int64_t have;
  if (elementType.isF32())
    have = tensor.float_data_size();
  else if (elementType.isF64())
    have = tensor.double_data_size();
  else if (elementType.isInteger(64))
    have = tensor.int64_data_size();
  else // int32_data holds int32, int8, bool and the bits of f16/bf16.
    have = tensor.int32_data_size();
  if (have != count)
    return error() << "has " << have << " values but its dims "
                   << shapeString(type.getShape()) << " need " << count,
           failure();
  auto bytes = std::make_unique<std::string>(expected, '\0');
  char *out = bytes->data();
  if (elementType.isF32())
    std::memcpy(out, tensor.float_data().data(), expected);
  else if (elementType.isF64())
    std::memcpy(out, tensor.double_data().data(), expected);
  else if (elementType.isInteger(64))
    std::memcpy(out, tensor.int64_data().data(), expected);
  else
    for (int64_t k = 0; k < count; ++k) {
      int32_t v = tensor.int32_data(k);
      std::memcpy(out + k * width, &v, width);
    }
  return bytes;
}

HostTensor mlir::fastllm::decodeHost(RankedTensorType type, StringRef bytes) {
  HostTensor host;
  host.elementType = type.getElementType();
  host.shape.assign(type.getShape().begin(), type.getShape().end());
  int64_t count = type.getNumElements();
  if (host.isFloat()) {
    host.floats.resize(count);
    for (int64_t k = 0; k < count; ++k)
      host.floats[k] = decodeRaw(host.elementType, bytes.data(), k);
  } else {
    host.ints.resize(count);
    for (int64_t k = 0; k < count; ++k)
      host.ints[k] = decodeRawInt(host.elementType, bytes.data(), k);
  }
  return host;
}

FailureOr<HostTensor> mlir::fastllm::decodeTensorProto(
    const onnx::TensorProto &tensor, MLIRContext *context,
    llvm::function_ref<InFlightDiagnostic()> error) {
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL)
    return error() << "external data is only supported for initializers",
           failure();
  auto type = tensorProtoType(tensor, context, error);
  if (failed(type))
    return failure();
  auto bytes = tensorProtoBytes(tensor, *type, error);
  if (failed(bytes))
    return failure();
  return decodeHost(*type, **bytes);
}
