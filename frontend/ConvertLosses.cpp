//===- ConvertLosses.cpp - the ONNX losses ----------------------*- C++ -*-===//
//
// The two ONNX losses become model.cross_entropy and model.nll_loss, whose
// class dimension is the last one.
//
//===----------------------------------------------------------------------===//

#include "frontend/Converters.h"
#include "ir/ModelDialect.h"

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::converters;
namespace m = mlir::fastllm::model;

/// SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss: inputs are
/// [N, C, d1..dk] with targets [N, d1..dk]; the model ops want classes last.
template <typename OpTy> static LogicalResult convertLoss(NodeImporter &n) {
  if (failed(n.requireFloat(0)))
    return failure();
  if (n.hasInput(2))
    return n.error() << "class weights are not supported";
  RankedTensorType scores = n.inputType(0);
  ArrayRef<int64_t> s = scores.getShape(), t = n.inputShape(1);
  Type targetType = n.inputType(1).getElementType();
  if (!targetType.isInteger(64) && !targetType.isInteger(32))
    return n.error() << "labels must be int32 or int64, got " << targetType;
  if (s.size() < 2 || t.size() != s.size() - 1 || t[0] != s[0] ||
      t.drop_front() != s.drop_front(2))
    return n.error() << "scores " << shapeString(s) << " and labels "
                     << shapeString(t)
                     << " do not match ([N, C, d...] and [N, d...])";
  std::string reduction = n.stringAttr("reduction", "mean");
  std::optional<m::LossReduction> red = m::symbolizeLossReduction(reduction);
  if (!red)
    return n.error() << "unknown reduction '" << reduction << "'";
  Value input = n.operand(0);
  if (s.size() > 2) {
    SmallVector<int64_t> perm{0};
    for (size_t i = 2; i < s.size(); ++i)
      perm.push_back(i);
    perm.push_back(1);
    input = n.createInferred<m::TransposeOp>(input, perm);
  }
  IntegerAttr ignore;
  if (n.hasAttribute("ignore_index"))
    ignore = n.getBuilder().getI64IntegerAttr(n.intAttr("ignore_index", 0));
  n.setOutput(0, n.createInferred<OpTy>(input, n.operand(1), ignore, *red));
  if (n.outputUsed(1)) // log_prob, in the input's [N, C, d...] layout
    n.setOutput(1, n.create<m::LogSoftmaxOp>(scores, n.operand(0), 1));
  return success();
}

LogicalResult converters::convertSoftmaxCrossEntropyLoss(NodeImporter &n) {
  return convertLoss<m::CrossEntropyOp>(n);
}

LogicalResult converters::convertNegativeLogLikelihoodLoss(NodeImporter &n) {
  return convertLoss<m::NllLossOp>(n);
}
