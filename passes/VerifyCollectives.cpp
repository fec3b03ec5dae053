//===- VerifyCollectives.cpp - the step's collectives are consistent ------===//
//
// Proves, before any code is generated, what docs/DESIGN.md section 3 promises of
// a step's communication, by running the step's ops in order over an
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
} // namespace

void VerifyCollectivesPass::runOnOperation() {
  ModuleOp module = getOperation();
  std::optional<MemoryPlan> plan = MemoryPlan::get(module, PlanParts(PlanPart::Layout));
  if (!plan)
    return signalPassFailure();
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!step || step.getBody().getBlocks().size() != 1) {
    module.emitError("expected a func.func @train_step of one block");
    return signalPassFailure();
  }
  SymbolTable symbols(module);
  const int64_t zero = plan->zeroStage, numStages = plan->numStages();
  const int64_t numGradSlots = plan->gradSlotElements.size();
  const int64_t numWeightSlots = plan->weightSlotElements.size();

  // The abstract state.
  SmallVector<int64_t> weightHolds(numWeightSlots, kUnknown);
  SmallVector<bool> weightArriving(numWeightSlots, false);
  enum class Grad { Free, Accumulating, Reducing };
  SmallVector<Grad> gradState(numGradSlots, Grad::Free);
  SmallVector<int64_t> gradStage(numGradSlots, -1);
  SmallVector<Operation *> gradAdded(numGradSlots, nullptr); // since the clear
  SmallVector<int64_t> reduced(numStages, 0);
  DenseMap<Value, Operation *> inFlight;
  DenseMap<Value, std::pair<int64_t, int64_t>> paramView; // value -> (slot, stage)

  auto stageOk = [&](Operation *op, int64_t stage) -> LogicalResult {
    if (stage >= numStages || plan->stageElements[stage] == 0)
      return op->emitOpError("names stage ")
             << stage << ", which has no parameters (the plan has "
             << numStages << " stages)";
    return success();
  };
  auto slotOk = [&](Operation *op, int64_t slot, int64_t stage,
                    ArrayRef<int64_t> elements, StringRef kind) -> LogicalResult {
    if (slot >= int64_t(elements.size()))
      return op->emitOpError("names ")
             << kind << " slot " << slot << " but the plan has "
             << elements.size();
    if (elements[slot] < plan->stageElements[stage])
      return op->emitOpError() << kind << " slot " << slot << " holds "
                               << elements[slot] << " elements, stage "
                               << stage << " needs "
                               << plan->stageElements[stage];
    return success();
  };

  for (Operation &op : step.getBody().front()) {
    if (op.getNumRegions()) {
      op.emitOpError("has regions; the step must be straight-line code so "
                     "that every rank issues the same collectives");
      return signalPassFailure();
    }
    LogicalResult result = success();
    if (auto gather = dyn_cast<AllGatherOp>(op)) {
      int64_t s = gather.getStage(), j = gather.getSlot();
      if (zero != 3)
        result = op.emitOpError("gathers weights in a ZeRO-")
                 << zero << " step; only ZeRO-3 gathers inside the step";
      else if (succeeded(result = stageOk(&op, s)) &&
               succeeded(result = slotOk(&op, j, s, plan->weightSlotElements,
                                         "weight"))) {
        if (weightArriving[j])
          result = op.emitOpError("starts an all-gather into weight slot ")
                   << j << " while another one into it is in flight";
        weightArriving[j] = true;
        weightHolds[j] = s;
        inFlight[gather.getRequest()] = &op;
      }
    } else if (auto reduce = dyn_cast<ReduceScatterOp>(op)) {
      int64_t s = reduce.getStage(), j = reduce.getSlot();
      if (zero == 1)
        result = op.emitOpError("reduces gradients in a ZeRO-1 step; ZeRO-1 "
                                "reduces once per step, in the runtime");
      else if (succeeded(result = stageOk(&op, s)) &&
               succeeded(result = slotOk(&op, j, s, plan->gradSlotElements,
                                         "gradient"))) {
        if (gradState[j] != Grad::Accumulating || gradStage[j] != s)
          result = op.emitOpError("reduces stage ")
                   << s << " from gradient slot " << j
                   << ", which was not cleared for stage " << s
                   << " (or is already being reduced)";
        gradState[j] = Grad::Reducing;
        inFlight[reduce.getRequest()] = &op;
      }
    } else if (auto wait = dyn_cast<WaitOp>(op)) {
      Operation *started = inFlight.lookup(wait.getRequest());
      if (!started) {
        result = op.emitOpError("waits for a request that is not in flight");
      } else if (auto gather = dyn_cast<AllGatherOp>(started)) {
        weightArriving[gather.getSlot()] = false;
      } else if (auto reduce = dyn_cast<ReduceScatterOp>(started)) {
        gradState[reduce.getSlot()] = Grad::Free;
        if (++reduced[reduce.getStage()] > 1)
          result = op.emitOpError("completes a second reduce-scatter of stage ")
                   << reduce.getStage()
                   << " in one micro-batch; each gradient must be reduced "
                      "exactly once";
      }
      inFlight.erase(wait.getRequest());
    } else if (auto clear = dyn_cast<ClearGradsOp>(op)) {
      int64_t s = clear.getStage(), j = clear.getSlot();
      if (succeeded(result = stageOk(&op, s)) &&
          succeeded(result = slotOk(&op, j, s, plan->gradSlotElements,
                                    "gradient"))) {
        if (gradState[j] == Grad::Reducing)
          result = op.emitOpError("clears gradient slot ")
                   << j << " while its reduce-scatter is in flight";
        else if (gradState[j] == Grad::Accumulating && gradAdded[j])
          result = (op.emitOpError("clears gradient slot ")
                    << j << ", which holds gradients of stage " << gradStage[j]
                    << " not yet reduced")
                       .attachNote(gradAdded[j]->getLoc())
                   << "added here";
        gradState[j] = Grad::Accumulating;
        gradStage[j] = s;
        gradAdded[j] = nullptr;
      }
    } else if (auto acc = dyn_cast<AccumulateGradOp>(op)) {
      auto param = symbols.lookup<ParameterOp>(acc.getName());
      int64_t s = parameterStage(param), j = slotOf(acc);
      if (param.getTensorType().getNumElements() == 0)
        ; // adds nothing
      else if (zero >= 2 && (j < 0 || j >= numGradSlots))
        result = op.emitOpError("has no gradient slot (plan.slot) in a ZeRO-")
                 << zero << " step";
      else if (zero >= 2 &&
               (gradState[j] != Grad::Accumulating || gradStage[j] != s))
        result = op.emitOpError("adds the gradient of @")
                 << acc.getName() << " (stage " << s << ") into gradient slot "
                 << j << ", which is "
                 << (gradState[j] == Grad::Reducing ? "being reduced"
                     : gradState[j] == Grad::Free
                         ? "not cleared for a stage"
                         : "cleared for stage " + std::to_string(gradStage[j]));
      else if (zero >= 2)
        gradAdded[j] = &op;
    } else if (auto get = dyn_cast<GetParameterOp>(op)) {
      auto param = symbols.lookup<ParameterOp>(get.getName());
      int64_t owner = parameterStage(param), j = slotOf(get);
      if (param.getFrozen() || param.getTensorType().getNumElements() == 0)
        ; // the frozen array is always there; an empty tensor reads nothing
      else if (zero == 3 && (j < 0 || j >= numWeightSlots))
        result = op.emitOpError("reads @")
                 << get.getName() << " without a weight slot (plan.slot) in a "
                 << "ZeRO-3 step";
      else if (zero == 3)
        paramView[get.getResult()] = {j, owner};
    } else if (auto view = dyn_cast<ViewLikeOpInterface>(op)) {
      if (auto it = paramView.find(view.getViewSource()); it != paramView.end())
        paramView[op.getResult(0)] = it->second;
    } else {
      for (Value operand : op.getOperands()) {
        auto it = paramView.find(operand);
        if (it == paramView.end())
          continue;
        auto [j, owner] = it->second;
        if (weightArriving[j] || weightHolds[j] != owner) {
          result = op.emitOpError("reads a parameter of stage ")
                   << owner << " from weight slot " << j << ", which "
                   << (weightArriving[j]
                           ? "an all-gather in flight is writing"
                           : weightHolds[j] == kUnknown
                                 ? "holds nothing yet"
                                 : "holds stage " +
                                       std::to_string(weightHolds[j]));
          break;
        }
      }
    }
    if (failed(result))
      return signalPassFailure();
  }

  if (!inFlight.empty()) {
    SmallVector<Operation *> open;
    for (auto &[value, op] : inFlight)
      open.push_back(op);
    llvm::sort(open, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    open.front()->emitOpError("is still in flight when the step returns");
    return signalPassFailure();
  }
  if (zero >= 2)
    for (int64_t s = 0; s < numStages; ++s)
      if (plan->stageElements[s] && reduced[s] != 1) {
        step.emitError("stage ") << s << "'s gradients are reduced " << reduced[s]
                                 << " times per micro-batch; each must be "
                                    "reduced exactly once";
        return signalPassFailure();
      }
}
