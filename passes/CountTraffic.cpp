//===- CountTraffic.cpp - what the collectives move, in the plan ----------===//
//
// The communication figures of the plan: an analysis of the step's
// collectives, apart from fastllm-verify-collectives, which proves them and
// changes nothing.
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
  plan->set(module, PlanPart::Traffic);
}
