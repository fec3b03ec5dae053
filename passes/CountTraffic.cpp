//===- CountTraffic.cpp - what the collectives move, in the plan ----------===//
//
// The communication figures of the plan: an analysis of the step's
// collectives, apart from fastllm-verify-collectives, which proves them and
// changes nothing. And the step's model FLOPs, which the training binary's
// throughput and MFU divide by time (countFlops below says what is counted).
//
//===----------------------------------------------------------------------===//

#include "ir/ModelDialect.h"
#include "ir/Plan.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::fastllm {
#define GEN_PASS_DEF_COUNTTRAFFICPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {

/// The model FLOPs of one micro-batch's step on one rank, as the step runs
/// them: 2*M*N*K for every model.matmul of the forward and the backward
/// (M*N the product of the result's dims, batch dims included; K the
/// contracted dim), and for fused causal attention over batch*heads = B
/// problems of t queries, with tri = t*(t+1)/2 query-key pairs on and below
/// the diagonal, 2*B*tri*(d + dv) forward (q k^T, then p v) and
/// 2*B*tri*(3*d + 2*dv) backward (the scores again, dv, dp, dq and dk).
/// Elementwise ops, reductions, norms, softmax and the loss are not
/// counted, as in the usual definition of MFU. `bf16` gets the part whose
/// operands are bf16.
struct Flops {
  int64_t total = 0, bf16 = 0;
  void add(int64_t flops, Type element) {
    total += flops;
    if (element.isBF16())
      bf16 += flops;
  }
};

/// Counts `step` into `flops`; fails on an op whose FLOPs it cannot count
/// (a matmul fused with its gradient's accumulation: count before
/// fastllm-fuse-grad-accumulation).
LogicalResult countFlops(func::FuncOp step, Flops &flops) {
  WalkResult walk = step.walk([&](Operation *op) {
    if (auto mm = dyn_cast<MatmulOp>(op)) {
      auto lhs = cast<RankedTensorType>(mm.getLhs().getType());
      auto result = cast<RankedTensorType>(mm.getResult().getType());
      int64_t k =
          lhs.getDimSize(lhs.getRank() - (mm.getTransposeLhs() ? 2 : 1));
      flops.add(2 * result.getNumElements() * k, lhs.getElementType());
    } else if (isa<CausalAttentionOp, CausalAttentionGradOp>(op)) {
      auto q = cast<RankedTensorType>(op->getOperand(0).getType());
      auto v = cast<RankedTensorType>(op->getOperand(2).getType());
      int64_t t = q.getDimSize(q.getRank() - 2);
      int64_t d = q.getDimSize(q.getRank() - 1);
      int64_t dv = v.getDimSize(v.getRank() - 1);
      int64_t problems = q.getNumElements() / std::max<int64_t>(1, t * d);
      int64_t pairs = problems * t * (t + 1) / 2;
      bool forward = isa<CausalAttentionOp>(op);
      flops.add(2 * pairs * (forward ? d + dv : 3 * d + 2 * dv),
                q.getElementType());
    } else if (isa<MatmulAccumulateGradOp>(op)) {
      op->emitOpError("cannot be counted: count the FLOPs before "
                      "fastllm-fuse-grad-accumulation");
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return failure(walk.wasInterrupted());
}

struct CountTrafficPass
    : fastllm::impl::CountTrafficPassBase<CountTrafficPass> {
  void runOnOperation() override;
};
} // namespace

void CountTrafficPass::runOnOperation() {
  ModuleOp module = getOperation();
  std::optional<MemoryPlan> plan =
      MemoryPlan::get(module, PlanParts(PlanPart::Layout));
  if (!plan)
    return signalPassFailure();
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!step) {
    module.emitError("no func.func @train_step whose collectives to count");
    return signalPassFailure();
  }
  auto stageBytes = [&](Operation *op,
                        int64_t stage) -> std::optional<int64_t> {
    if (stage < 0 || stage >= plan->numStages()) {
      op->emitOpError("names stage ")
          << stage << " of a plan with " << plan->numStages() << " stages";
      return std::nullopt;
    }
    return plan->stageElements[stage] * 4;
  };
  int64_t reduceBytes = 0, gatherBytes = 0;
  WalkResult walk = step.walk([&](Operation *op) {
    std::optional<int64_t> bytes = 0;
    if (auto gather = dyn_cast<AllGatherOp>(op)) {
      if ((bytes = stageBytes(op, gather.getStage())))
        gatherBytes += *bytes;
    } else if (auto reduce = dyn_cast<ReduceScatterOp>(op)) {
      if ((bytes = stageBytes(op, reduce.getStage())))
        reduceBytes += *bytes;
    }
    return bytes ? WalkResult::advance() : WalkResult::interrupt();
  });
  if (walk.wasInterrupted())
    return signalPassFailure();
  // A collective of one rank moves its full buffer's bytes; dp 1 moves
  // nothing.
  const int64_t full = plan->paramElements * 4;
  const bool moves = plan->dataParallel > 1;
  plan->reduceScatterBytesPerMicroBatch = moves ? reduceBytes : 0;
  plan->allGatherBytesPerMicroBatch = moves ? gatherBytes : 0;
  plan->reduceScatterBytesPerStep = moves && plan->zeroStage == 1 ? full : 0;
  plan->allGatherBytesPerStep = moves && plan->zeroStage <= 2 ? full : 0;
  Flops flops;
  if (failed(countFlops(step, flops)))
    return signalPassFailure();
  plan->flopsPerMicroBatch = flops.total;
  plan->bf16FlopsPerMicroBatch = flops.bf16;
  plan->set(module, PlanPart::Traffic);
}
