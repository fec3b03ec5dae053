//===- FuseGradAccumulation.cpp - weight gradients accumulated by GEMMs ---===//
//
// After the distributed plan and before memory planning,
//
//   %p = model.matmul %a, %b {flags}        (its only use below)
//   [%w = model.cast %p : bf16 -> f32]      (bf16: autodiff's widening cast)
//   [%t = model.transpose %w [1, 0]]        (2-D: a tied embedding's head)
//   model.accumulate_grad @x, %t
//
// becomes `model.matmul_accumulate_grad @x, %a, %b {flags}` at the
// accumulate's place: the GEMM adds its fp32 product into the gradient
// buffer, so the product is never stored (nor, for bf16, rounded to bf16),
// widened or added by separate kernels. A transpose is absorbed by swapping
// the operands: (A·B)ᵀ = Bᵀ·Aᵀ. The chain is left alone when one of its
// values has another use or an op with memory effects lies between the
// matmul and the accumulate (its operands are read at the accumulate).
//
// Any other accumulate of a widened bf16 value adds the bf16 value itself
// (model.accumulate_grad widens as it adds): no f32 copy is stored.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/Zero.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::fastllm {
#define GEN_PASS_DEF_FUSEGRADACCUMULATIONPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {
struct FuseGradAccumulationPass
    : fastllm::impl::FuseGradAccumulationPassBase<FuseGradAccumulationPass> {
  void runOnOperation() override;
};

/// Whether `cast` only widens bf16 to f32 (exactly).
bool isWidening(CastOp cast) {
  auto from = cast.getInput().getType().getElementType();
  auto to = cast.getResult().getType().getElementType();
  return from.isBF16() && to.isF32();
}

/// Whether `t` swaps the two dims of a matrix.
bool isMatrixTranspose(TransposeOp t) {
  return t.getPermutation() == ArrayRef<int64_t>{1, 0};
}

/// Makes `acc` add the bf16 value a widening cast of it reads (the
/// accumulate widens it as it adds).
void foldWideningCast(AccumulateGradOp acc) {
  auto cast = acc.getGrad().getDefiningOp<CastOp>();
  if (!cast || !isWidening(cast) || !cast.getResult().hasOneUse() ||
      cast->getBlock() != acc->getBlock() || !quietBetween(cast, acc))
    return;
  acc.getGradMutable().assign(cast.getInput());
  cast.erase();
}

/// Rewrites (and erases) `acc` when its gradient is a matmul's product (see
/// the file comment); returns whether it did.
bool fuse(AccumulateGradOp acc) {
  SmallVector<Operation *> chain; // accumulate first, matmul last
  bool transposed = false;
  Value v = acc.getGrad();
  MatmulOp matmul;
  while (!matmul) {
    Operation *def = v.getDefiningOp();
    if (!def || !v.hasOneUse() || def->getBlock() != acc->getBlock())
      return false;
    if (auto cast = dyn_cast<CastOp>(def); cast && isWidening(cast)) {
      v = cast.getInput();
    } else if (auto t = dyn_cast<TransposeOp>(def);
               t && isMatrixTranspose(t) && !transposed) {
      transposed = true;
      v = t.getInput();
    } else if (auto m = dyn_cast<MatmulOp>(def)) {
      matmul = m;
    } else {
      return false;
    }
    chain.push_back(def);
  }
  if (!quietBetween(matmul, acc))
    return false;
  Value lhs = matmul.getLhs(), rhs = matmul.getRhs();
  bool transLhs = matmul.getTransposeLhs(), transRhs = matmul.getTransposeRhs();
  if (transposed) {
    std::swap(lhs, rhs);
    std::swap(transLhs, transRhs);
    transLhs = !transLhs;
    transRhs = !transRhs;
  }
  OpBuilder b(acc);
  auto fused = b.create<MatmulAccumulateGradOp>(
      b.getFusedLoc({matmul.getLoc(), acc.getLoc()}), acc.getName(), lhs, rhs,
      transLhs, transRhs);
  // The accumulate's stage, direction and gradient slot.
  fused->setDiscardableAttrs(acc->getDiscardableAttrDictionary());
  acc.erase();
  for (Operation *op : chain)
    op->erase();
  return true;
}
} // namespace

void FuseGradAccumulationPass::runOnOperation() {
  SmallVector<AccumulateGradOp> accumulates;
  getOperation().walk(
      [&](AccumulateGradOp acc) { accumulates.push_back(acc); });
  for (AccumulateGradOp acc : accumulates)
    if (!fuse(acc))
      foldWideningCast(acc);
}
