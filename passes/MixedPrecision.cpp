//===- MixedPrecision.cpp - bf16 compute, fp32 weights and loss -----------===//
//
// Rewrites @forward (before autodiff) to compute in bf16 while the master
// weights, their gradients and the loss stay fp32:
//  - every read of a float parameter is followed by a model.cast to bf16,
//    which all its uses read instead;
//  - an op with a bf16 float operand computes in bf16: its other f32 float
//    operands are cast to bf16 (constants included; a cast of a constant
//    has the constant's own shape) and its float results become bf16;
//  - losses (cross_entropy, nll_loss) read bf16 logits and return fp32,
//    causal attention keeps its log-sum-exp in fp32, and the function
//    returns fp32 (a cast is added where needed).
// Autodiff then differentiates through the casts: each parameter's gradient
// is computed in bf16 and cast back to fp32 before model.accumulate_grad
// adds it into the fp32 gradient buffers. The kernels accumulate in fp32.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/Zero.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"

namespace mlir::fastllm {
#define GEN_PASS_DEF_MIXEDPRECISIONPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {
struct MixedPrecisionPass
    : fastllm::impl::MixedPrecisionPassBase<MixedPrecisionPass> {
  using MixedPrecisionPassBase::MixedPrecisionPassBase;
  void runOnOperation() override;
};

RankedTensorType floatTensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && isa<FloatType>(t.getElementType()) ? t : RankedTensorType();
}

/// A cast of `v` to element type `to` before `before`, in its stage.
Value castBefore(OpBuilder &b, Operation *before, Value v, Type to) {
  b.setInsertionPoint(before);
  auto t = cast<RankedTensorType>(v.getType());
  auto c = b.create<CastOp>(before->getLoc(), t.clone(to), v);
  copyStage(before, c);
  return c.getResult();
}
} // namespace

void MixedPrecisionPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (compute != "bf16") {
    module.emitError("compute must be bf16, got '") << compute << "'";
    return signalPassFailure();
  }
  auto forward = module.lookupSymbol<func::FuncOp>("forward");
  if (!forward) {
    module.emitError("no func.func @forward to rewrite");
    return signalPassFailure();
  }
  OpBuilder b(module.getContext());
  Type low = b.getBF16Type(), f32 = b.getF32Type();
  SmallVector<Operation *> ops;
  for (Operation &op : forward.getBody().front())
    ops.push_back(&op);
  for (Operation *op : ops) {
    if (auto get = dyn_cast<GetParameterOp>(op)) {
      RankedTensorType t = floatTensor(get.getResult());
      if (!t || !t.getElementType().isF32())
        continue;
      b.setInsertionPointAfter(get);
      auto c = b.create<CastOp>(get.getLoc(), t.clone(low), get.getResult());
      copyStage(get, c);
      get.getResult().replaceAllUsesExcept(c.getResult(), c);
      continue;
    }
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      for (OpOperand &operand : ret->getOpOperands())
        if (RankedTensorType t = floatTensor(operand.get());
            t && t.getElementType() == low)
          operand.set(castBefore(b, ret, operand.get(), f32));
      continue;
    }
    if (isa<CastOp, ConstantOp>(op))
      continue;
    bool anyLow = llvm::any_of(op->getOperands(), [&](Value v) {
      RankedTensorType t = floatTensor(v);
      return t && t.getElementType() == low;
    });
    if (!anyLow)
      continue;
    for (OpOperand &operand : op->getOpOperands())
      if (RankedTensorType t = floatTensor(operand.get());
          t && t.getElementType().isF32())
        operand.set(castBefore(b, op, operand.get(), low));
    // Losses stay fp32: bf16 logits in, an fp32 loss out.
    if (isa<CrossEntropyOp, NllLossOp>(op))
      continue;
    for (Value r : op->getResults()) {
      // Attention's log-sum-exp, kept for the backward, stays fp32.
      if (auto attention = dyn_cast<CausalAttentionOp>(op);
          attention && r == attention.getLse())
        continue;
      if (RankedTensorType t = floatTensor(r); t && t.getElementType().isF32())
        r.setType(t.clone(low));
    }
  }
  // Result types changed in place: every op must still verify.
  if (failed(verify(forward))) {
    forward.emitError("the mixed-precision rewrite broke an op (see above)");
    return signalPassFailure();
  }
}
