//===- FoldTransposes.cpp - matmuls read transposed operands in place -----===//
//
// After autodiff, a model.transpose that swaps the last two dims and feeds a
// model.matmul is folded into the matmul's transpose_lhs / transpose_rhs flag:
// the GEMM reads the untransposed buffer with a transpose flag and the copy
// disappears (and with it its time and memory; the planner then keeps the
// input alive until the matmul).
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
} // namespace

void FoldTransposesPass::runOnOperation() {
  SmallVector<TransposeOp> transposes;
  getOperation().walk([&](TransposeOp t) {
    if (swapsLastTwo(t))
      transposes.push_back(t);
  });
  Builder b(&getContext());
  for (TransposeOp t : transposes) {
    for (OpOperand &use : llvm::make_early_inc_range(t.getResult().getUses())) {
      auto matmul = dyn_cast<MatmulOp>(use.getOwner());
      if (!matmul)
        continue;
      bool lhs = use.getOperandNumber() == 0;
      // Operand 0 is lhs, 1 is rhs; an operand already transposed stays.
      if (lhs ? matmul.getTransposeLhs() : matmul.getTransposeRhs())
        continue;
      use.set(t.getInput());
      matmul->setAttr(lhs ? matmul.getTransposeLhsAttrName()
                          : matmul.getTransposeRhsAttrName(),
                      b.getUnitAttr());
    }
    if (t.getResult().use_empty())
      t.erase();
  }
}
