//===- VerifyCollectives.cpp - the step's collectives are consistent ------===//
//
// Proves, before any code is generated, what docs/DESIGN.md section 3 promises
// of a step's communication, by running the step's ops in order over an
// abstract state of the slots:
//  - every rank issues the same collectives with the same sizes: the step is
//    one straight-line block (no control flow, nothing depends on the rank)
//    and each collective's size is its stage's, which splits into dp shards;
//  - each read of a weight slot (ZeRO-3) finds the stage it expects there,
//    with no all-gather into the slot in flight;
//  - each gradient is added into a slot cleared for its stage and not being
//    reduced, and no slot is cleared over gradients not yet reduced, so a
//    stage's slot holds every addition (those of later stages reading a
//    tied parameter too) when it is reduced; every stage with parameters is
//    reduce-scattered exactly once
//    per micro-batch (ZeRO-2/3; the reduction is the mean over ranks and
//    micro-batches) or, with ZeRO-1, by the runtime once per step;
//  - every collective is waited before the step returns.
// It then records the bytes each rank moves per micro-batch and per step in
// the plan, the figures the report prints and the runtime's counters must
// match.
//
//===----------------------------------------------------------------------===//

#include "ir/Plan.h"
#include "passes/Passes.h"
#include "passes/Zero.h"

namespace mlir::fastllm {
#define GEN_PASS_DEF_VERIFYCOLLECTIVESPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {
struct VerifyCollectivesPass
    : fastllm::impl::VerifyCollectivesPassBase<VerifyCollectivesPass> {
  void runOnOperation() override;
};

constexpr int64_t kUnknown = -1; ///< weight slot content before a gather

/// The step's ops run in order over an abstract state of the slots; each
/// visit fails (with a diagnostic) where an op breaks a promise.
class StepChecker {
public:
  StepChecker(ModuleOp module, const MemoryPlan &plan);

  LogicalResult visit(Operation &op);
  /// After the last op: nothing in flight, every stage reduced once.
  LogicalResult finish(func::FuncOp step);

private:
  LogicalResult visitGather(AllGatherOp gather);
  LogicalResult visitReduceScatter(ReduceScatterOp reduce);
  LogicalResult visitWait(WaitOp wait);
  LogicalResult visitClear(ClearGradsOp clear);
  LogicalResult visitAccumulate(AccumulateGradOp acc);
  LogicalResult visitGetParameter(GetParameterOp get);
  /// Any other op: the parameters it reads must be in their weight slots.
  LogicalResult visitReads(Operation &op);

  LogicalResult stageOk(Operation *op, int64_t stage);
  LogicalResult slotOk(Operation *op, int64_t slot, int64_t stage,
                       ArrayRef<int64_t> elements, StringRef kind);

  const MemoryPlan &plan;
  SymbolTable symbols;
  const int64_t zero, numStages, numGradSlots, numWeightSlots;

  // The abstract state.
  SmallVector<int64_t> weightHolds;
  SmallVector<bool> weightArriving;
  enum class Grad { Free, Accumulating, Reducing };
  SmallVector<Grad> gradState;
  SmallVector<int64_t> gradStage;
  SmallVector<Operation *> gradAdded; // since the clear
  SmallVector<int64_t> reduced;
  DenseMap<Value, Operation *> inFlight;
  DenseMap<Value, std::pair<int64_t, int64_t>> paramView; // -> (slot, stage)
};
} // namespace

StepChecker::StepChecker(ModuleOp module, const MemoryPlan &plan)
    : plan(plan), symbols(module), zero(plan.zeroStage),
      numStages(plan.numStages()), numGradSlots(plan.gradSlotElements.size()),
      numWeightSlots(plan.weightSlotElements.size()),
      weightHolds(numWeightSlots, kUnknown),
      weightArriving(numWeightSlots, false),
      gradState(numGradSlots, Grad::Free), gradStage(numGradSlots, -1),
      gradAdded(numGradSlots, nullptr), reduced(numStages, 0) {}

LogicalResult StepChecker::stageOk(Operation *op, int64_t stage) {
  if (stage >= numStages || plan.stageElements[stage] == 0)
    return op->emitOpError("names stage ")
           << stage << ", which has no parameters (the plan has " << numStages
           << " stages)";
  return success();
}

LogicalResult StepChecker::slotOk(Operation *op, int64_t slot, int64_t stage,
                                  ArrayRef<int64_t> elements, StringRef kind) {
  if (slot >= int64_t(elements.size()))
    return op->emitOpError("names ") << kind << " slot " << slot
                                     << " but the plan has " << elements.size();
  if (elements[slot] < plan.stageElements[stage])
    return op->emitOpError() << kind << " slot " << slot << " holds "
                             << elements[slot] << " elements, stage " << stage
                             << " needs " << plan.stageElements[stage];
  return success();
}

LogicalResult StepChecker::visit(Operation &op) {
  if (op.getNumRegions())
    return op.emitOpError("has regions; the step must be straight-line code "
                          "so that every rank issues the same collectives");
  if (auto gather = dyn_cast<AllGatherOp>(op))
    return visitGather(gather);
  if (auto reduce = dyn_cast<ReduceScatterOp>(op))
    return visitReduceScatter(reduce);
  if (auto wait = dyn_cast<WaitOp>(op))
    return visitWait(wait);
  if (auto clear = dyn_cast<ClearGradsOp>(op))
    return visitClear(clear);
  if (auto acc = dyn_cast<AccumulateGradOp>(op))
    return visitAccumulate(acc);
  if (auto get = dyn_cast<GetParameterOp>(op))
    return visitGetParameter(get);
  if (auto view = dyn_cast<ViewLikeOpInterface>(op)) {
    if (auto it = paramView.find(view.getViewSource()); it != paramView.end())
      paramView[op.getResult(0)] = it->second;
    return success();
  }
  return visitReads(op);
}

LogicalResult StepChecker::visitGather(AllGatherOp gather) {
  int64_t s = gather.getStage(), j = gather.getSlot();
  if (zero != 3)
    return gather.emitOpError("gathers weights in a ZeRO-")
           << zero << " step; only ZeRO-3 gathers inside the step";
  if (failed(stageOk(gather, s)) ||
      failed(slotOk(gather, j, s, plan.weightSlotElements, "weight")))
    return failure();
  if (weightArriving[j])
    return gather.emitOpError("starts an all-gather into weight slot ")
           << j << " while another one into it is in flight";
  weightArriving[j] = true;
  weightHolds[j] = s;
  inFlight[gather.getRequest()] = gather;
  return success();
}

LogicalResult StepChecker::visitReduceScatter(ReduceScatterOp reduce) {
  int64_t s = reduce.getStage(), j = reduce.getSlot();
  if (zero == 1)
    return reduce.emitOpError("reduces gradients in a ZeRO-1 step; ZeRO-1 "
                              "reduces once per step, in the runtime");
  if (failed(stageOk(reduce, s)) ||
      failed(slotOk(reduce, j, s, plan.gradSlotElements, "gradient")))
    return failure();
  if (gradState[j] != Grad::Accumulating || gradStage[j] != s)
    return reduce.emitOpError("reduces stage ")
           << s << " from gradient slot " << j
           << ", which was not cleared for stage " << s
           << " (or is already being reduced)";
  gradState[j] = Grad::Reducing;
  inFlight[reduce.getRequest()] = reduce;
  return success();
}

LogicalResult StepChecker::visitWait(WaitOp wait) {
  Operation *started = inFlight.lookup(wait.getRequest());
  if (!started)
    return wait.emitOpError("waits for a request that is not in flight");
  inFlight.erase(wait.getRequest());
  if (auto gather = dyn_cast<AllGatherOp>(started)) {
    weightArriving[gather.getSlot()] = false;
  } else if (auto reduce = dyn_cast<ReduceScatterOp>(started)) {
    gradState[reduce.getSlot()] = Grad::Free;
    if (++reduced[reduce.getStage()] > 1)
      return wait.emitOpError("completes a second reduce-scatter of stage ")
             << reduce.getStage()
             << " in one micro-batch; each gradient must be reduced "
                "exactly once";
  }
  return success();
}

LogicalResult StepChecker::visitClear(ClearGradsOp clear) {
  int64_t s = clear.getStage(), j = clear.getSlot();
  if (failed(stageOk(clear, s)) ||
      failed(slotOk(clear, j, s, plan.gradSlotElements, "gradient")))
    return failure();
  if (gradState[j] == Grad::Reducing)
    return clear.emitOpError("clears gradient slot ")
           << j << " while its reduce-scatter is in flight";
  if (gradState[j] == Grad::Accumulating && gradAdded[j])
    return (clear.emitOpError("clears gradient slot ")
            << j << ", which holds gradients of stage " << gradStage[j]
            << " not yet reduced")
               .attachNote(gradAdded[j]->getLoc())
           << "added here";
  gradState[j] = Grad::Accumulating;
  gradStage[j] = s;
  gradAdded[j] = nullptr;
  return success();
}

LogicalResult StepChecker::visitAccumulate(AccumulateGradOp acc) {
  auto param = symbols.lookup<ParameterOp>(acc.getName());
  int64_t s = parameterStage(param), j = slotOf(acc);
  if (param.getTensorType().getNumElements() == 0 || zero < 2)
    return success(); // adds nothing, or ZeRO-1: no gradient slots
  if (j < 0 || j >= numGradSlots)
    return acc.emitOpError("has no gradient slot (plan.slot) in a ZeRO-")
           << zero << " step";
  if (gradState[j] != Grad::Accumulating || gradStage[j] != s)
    return acc.emitOpError("adds the gradient of @")
           << acc.getName() << " (stage " << s << ") into gradient slot " << j
           << ", which is "
           << (gradState[j] == Grad::Reducing ? "being reduced"
               : gradState[j] == Grad::Free
                   ? "not cleared for a stage"
                   : "cleared for stage " + std::to_string(gradStage[j]));
  gradAdded[j] = acc;
  return success();
}

LogicalResult StepChecker::visitGetParameter(GetParameterOp get) {
  auto param = symbols.lookup<ParameterOp>(get.getName());
  int64_t owner = parameterStage(param), j = slotOf(get);
  // The frozen array is always there; an empty tensor reads nothing.
  if (param.getFrozen() || param.getTensorType().getNumElements() == 0 ||
      zero != 3)
    return success();
  if (j < 0 || j >= numWeightSlots)
    return get.emitOpError("reads @")
           << get.getName() << " without a weight slot (plan.slot) in a "
           << "ZeRO-3 step";
  paramView[get.getResult()] = {j, owner};
  return success();
}

LogicalResult StepChecker::visitReads(Operation &op) {
  for (Value operand : op.getOperands()) {
    auto it = paramView.find(operand);
    if (it == paramView.end())
      continue;
    auto [j, owner] = it->second;
    if (weightArriving[j] || weightHolds[j] != owner)
      return op.emitOpError("reads a parameter of stage ")
             << owner << " from weight slot " << j << ", which "
             << (weightArriving[j] ? "an all-gather in flight is writing"
                 : weightHolds[j] == kUnknown
                     ? "holds nothing yet"
                     : "holds stage " + std::to_string(weightHolds[j]));
  }
  return success();
}

LogicalResult StepChecker::finish(func::FuncOp step) {
  if (!inFlight.empty()) {
    SmallVector<Operation *> open;
    for (auto &[value, op] : inFlight)
      open.push_back(op);
    llvm::sort(
        open, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    return open.front()->emitOpError(
        "is still in flight when the step returns");
  }
  if (zero >= 2)
    for (int64_t s = 0; s < numStages; ++s)
      if (plan.stageElements[s] && reduced[s] != 1)
        return step.emitError("stage ")
               << s << "'s gradients are reduced " << reduced[s]
               << " times per micro-batch; each must be reduced exactly once";
  return success();
}

void VerifyCollectivesPass::runOnOperation() {
  ModuleOp module = getOperation();
  std::optional<MemoryPlan> plan =
      MemoryPlan::get(module, PlanParts(PlanPart::Layout));
  if (!plan)
    return signalPassFailure();
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!step || step.getBody().getBlocks().size() != 1) {
    module.emitError("expected a func.func @train_step of one block");
    return signalPassFailure();
  }
  StepChecker checker(module, *plan);
  for (Operation &op : step.getBody().front())
    if (failed(checker.visit(op)))
      return signalPassFailure();
  if (failed(checker.finish(step)))
    return signalPassFailure();
}
