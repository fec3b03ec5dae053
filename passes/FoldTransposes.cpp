//===- FoldTransposes.cpp - matmuls read transposed operands in place -----===//
//
// After autodiff, a model.transpose that swaps the last two dims and feeds a
// model.matmul is folded into the matmul's transpose_lhs / transpose_rhs flag
// (set, or cleared where the matmul already read that operand transposed):
// the GEMM reads the untransposed buffer and the copy disappears (and with
// it its time and memory; the planner then keeps the input alive until the
// matmul). A transpose of a 2-D matmul's result that nothing else reads
// becomes the transposed product (operands swapped, flags toggled).
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::fastllm {
#define GEN_PASS_DEF_FOLDTRANSPOSESPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {
struct FoldTransposesPass
    : fastllm::impl::FoldTransposesPassBase<FoldTransposesPass> {
  void runOnOperation() override;
};

/// Whether `t` only swaps its last two dims.
bool swapsLastTwo(TransposeOp t) {
  ArrayRef<int64_t> perm = t.getPermutation();
  int64_t rank = perm.size();
  if (rank < 2 || perm[rank - 1] != rank - 2 || perm[rank - 2] != rank - 1)
    return false;
  for (int64_t i = 0; i < rank - 2; ++i)
    if (perm[i] != i)
      return false;
  return true;
}
/// The rank of a ranked tensor value.
int64_t rankOf(Value v) { return cast<RankedTensorType>(v.getType()).getRank(); }
} // namespace

void FoldTransposesPass::runOnOperation() {
  SmallVector<TransposeOp> transposes;
  getOperation().walk([&](TransposeOp t) {
    if (swapsLastTwo(t))
      transposes.push_back(t);
  });
  Builder b(&getContext());
  // Last first: autodiff's transpose of a forward transpose (dX = dY·(Wᵀ)ᵀ)
  // folds into its matmul as a flag on the forward transpose, which then
  // folds into both matmuls (the backward one's flag cleared).
  for (TransposeOp t : llvm::reverse(transposes)) {
    // (op(A)·op(B))ᵀ = op(B)ᵀ·op(A)ᵀ: a 2-D matmul read only by this
    // transpose (autodiff's dW of a tied head, [d, vocab] then transposed)
    // computes the transposed product itself.
    if (auto product = t.getInput().getDefiningOp<MatmulOp>();
        product && product->hasOneUse() &&
        rankOf(product.getResult()) == 2 && rankOf(product.getLhs()) == 2 &&
        rankOf(product.getRhs()) == 2) {
      const bool lhsT = product.getTransposeLhs(),
                 rhsT = product.getTransposeRhs();
      Value lhs = product.getLhs(), rhs = product.getRhs();
      product->setOperands({rhs, lhs});
      auto setFlag = [&](StringAttr name, bool on) {
        if (on)
          product->setAttr(name, b.getUnitAttr());
        else
          product->removeAttr(name);
      };
      setFlag(product.getTransposeLhsAttrName(), !rhsT);
      setFlag(product.getTransposeRhsAttrName(), !lhsT);
      product.getResult().setType(t.getType());
      t.getResult().replaceAllUsesWith(product.getResult());
      t.erase();
      continue;
    }
    for (OpOperand &use : llvm::make_early_inc_range(t.getResult().getUses())) {
      auto matmul = dyn_cast<MatmulOp>(use.getOwner());
      if (!matmul)
        continue;
      // Operand 0 is lhs, 1 is rhs. The flag toggles: an operand the
      // matmul already reads transposed (autodiff's dX = dY·(Wᵀ)ᵀ) reads
      // the transpose's input as it is.
      bool lhs = use.getOperandNumber() == 0;
      StringAttr flag = lhs ? matmul.getTransposeLhsAttrName()
                            : matmul.getTransposeRhsAttrName();
      const bool transposed =
          lhs ? matmul.getTransposeLhs() : matmul.getTransposeRhs();
      use.set(t.getInput());
      if (transposed)
        matmul->removeAttr(flag);
      else
        matmul->setAttr(flag, b.getUnitAttr());
    }
    if (t.getResult().use_empty())
      t.erase();
  }
}
