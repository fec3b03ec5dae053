//===- ConvertMatMul.cpp - MatMul and Gemm ----------------------*- C++ -*-===//
//
// ONNX's MatMul (NumPy's matmul: 1-D operands promoted, batch dims
// broadcast) and Gemm (2-D, optional transposes, alpha, beta and C) become
// model.matmul with the reshapes, transposes and scaling around it.
//
//===----------------------------------------------------------------------===//

#include "frontend/Converters.h"
#include "ir/ModelDialect.h"

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::converters;
namespace m = mlir::fastllm::model;

LogicalResult converters::convertMatMul(NodeImporter &n) {
  if (failed(n.requireFloat(0)) || failed(n.requireFloat(1)))
    return failure();
  Type elementType = n.inputType(0).getElementType();
  if (n.inputType(1).getElementType() != elementType)
    return n.error() << "input element types differ";
  SmallVector<int64_t> a(n.inputShape(0)), b(n.inputShape(1));
  if (a.empty() || b.empty())
    return n.error() << "inputs must have rank >= 1";
  // 1-D operands are promoted to matrices and the extra dim dropped after.
  bool vecA = a.size() == 1, vecB = b.size() == 1;
  if (vecA)
    a.insert(a.begin(), 1);
  if (vecB)
    b.push_back(1);
  if (a.back() != b[b.size() - 2])
    return n.error() << "inner dims differ: " << shapeString(n.inputShape(0))
                     << " x " << shapeString(n.inputShape(1));
  auto batch = broadcastShapes(ArrayRef<int64_t>(a).drop_back(2),
                               ArrayRef<int64_t>(b).drop_back(2));
  if (!batch)
    return n.error() << "batch dims of " << shapeString(n.inputShape(0))
                     << " and " << shapeString(n.inputShape(1))
                     << " do not broadcast";
  Value lhs = reshape(n, n.operand(0), a), rhs = reshape(n, n.operand(1), b);
  Value result = n.createInferred<m::MatmulOp>(lhs, rhs);
  SmallVector<int64_t> final(*batch);
  if (!vecA)
    final.push_back(a[a.size() - 2]);
  if (!vecB)
    final.push_back(b.back());
  n.setOutput(0, reshape(n, result, final));
  return success();
}

static Value transpose2d(NodeImporter &n, Value v) {
  return n.createInferred<m::TransposeOp>(v, ArrayRef<int64_t>{1, 0});
}

LogicalResult converters::convertGemm(NodeImporter &n) {
  if (failed(n.requireFloat(0)) || failed(n.requireFloat(1)))
    return failure();
  ArrayRef<int64_t> a = n.inputShape(0), b = n.inputShape(1);
  if (a.size() != 2 || b.size() != 2)
    return n.error() << "A and B must be matrices, got " << shapeString(a)
                     << " and " << shapeString(b);
  bool transA = n.intAttr("transA", 0), transB = n.intAttr("transB", 0);
  float alpha = n.floatAttr("alpha", 1.0f), beta = n.floatAttr("beta", 1.0f);
  int64_t M = transA ? a[1] : a[0], K = transA ? a[0] : a[1];
  int64_t K2 = transB ? b[1] : b[0], N = transB ? b[0] : b[1];
  if (K != K2)
    return n.error() << "inner dims differ: " << shapeString(a)
                     << (transA ? "^T" : "") << " x " << shapeString(b)
                     << (transB ? "^T" : "");
  Type elementType = n.inputType(0).getElementType();
  Value lhs = n.operand(0), rhs = n.operand(1);
  if (transA)
    lhs = transpose2d(n, lhs);
  if (transB)
    rhs = transpose2d(n, rhs);
  Value result = n.createInferred<m::MatmulOp>(lhs, rhs);
  if (alpha != 1.0f)
    result = n.createInferred<m::MulOp>(
        result, constant(n, HostTensor::filled(elementType, {}, alpha)));
  if (n.hasInput(2) && beta != 0.0f) {
    auto shape = broadcastShapes({M, N}, n.inputShape(2));
    if (!shape || ArrayRef<int64_t>(*shape) != ArrayRef<int64_t>{M, N})
      return n.error() << "C of shape " << shapeString(n.inputShape(2))
                       << " does not broadcast to [" << M << ", " << N << "]";
    Value c = n.operand(2);
    if (beta != 1.0f)
      c = n.createInferred<m::MulOp>(
          c, constant(n, HostTensor::filled(elementType, {}, beta)));
    result = n.createInferred<m::AddOp>(result, c);
  }
  n.setOutput(0, result);
  return success();
}
