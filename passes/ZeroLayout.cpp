//===- ZeroLayout.cpp - stage layout and buffer slots (ZeRO step 1) -------===//
//
// Decides where every parameter lives and which buffers the stages use
// (docs/DESIGN.md section 3), before any collective is placed:
//  - the flat layout: parameters grouped by stage, each tensor aligned, each
//    stage padded to a multiple of dp * 32 elements (dp equal shards);
//  - slots: ZeRO-2 and 3 share num-grad-buffers gradient slots, ZeRO-3
//    num-weight-buffers weight slots, round-robin over the stages that have
//    parameters, each slot sized for the largest stage it serves. A stage
//    whose parameters later stages read (a tied embedding read by the head,
//    weights every layer reuses) has ties: ZeRO-2/3 give it a gradient slot
//    of its own, into which the later stages' backwards add before its own
//    backward ends (reduced once, after it), and ZeRO-3 a weight slot of its
//    own (its tie slot), gathered once per micro-batch and read by those
//    stages too;
//  - the step's ops: every op of @train_step gets a stage (an accumulation
//    the stage of its read, autodiff's sums that of what follows them), and
//    a ZeRO-2/3 step must run the stages in order forward and in reverse
//    order backward; ZeRO-3 gives each stage that reads a parameter its own
//    model.get_parameter, so each read names its slot.
//
//===----------------------------------------------------------------------===//

#include "ir/Plan.h"
#include "passes/Passes.h"
#include "passes/Pipelines.h"
#include "passes/Zero.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/MathExtras.h"

#include <map>
#include <numeric>
#include <set>

namespace mlir::fastllm {
#define GEN_PASS_DEF_ZEROLAYOUTPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {
struct ZeroLayoutPass : fastllm::impl::ZeroLayoutPassBase<ZeroLayoutPass> {
  using ZeroLayoutPassBase::ZeroLayoutPassBase;
  void runOnOperation() override;

private:
  LogicalResult validateOptions(ModuleOp module);
  void layOutParameters(ModuleOp module, MemoryPlan &plan);
  LogicalResult assignStages(func::FuncOp step, SymbolTable &symbols);
  void assignSlots(MemoryPlan &plan, int64_t numGrad, int64_t numWeight,
                   const std::set<int64_t> &gradTies,
                   const std::set<int64_t> &weightTies);
  void splitParameterReads(func::FuncOp step, SymbolTable &symbols,
                           MemoryPlan &plan);
};
} // namespace

LogicalResult ZeroLayoutPass::validateOptions(ModuleOp module) {
  auto fail = [&](const Twine &msg) {
    module.emitError(msg);
    return failure();
  };
  if (failed(verifyZeroOptions(dp, zeroStage, givenValue(numGradBuffers),
                               givenValue(numWeightBuffers), "",
                               [&](const Twine &msg) { fail(msg); })))
    return failure();
  if (alignment <= 0 || !llvm::isPowerOf2_64(alignment) || alignment % 4)
    return fail("alignment must be a power of two of at least 4 bytes, got " +
                Twine(alignment.getValue()));
  return success();
}

/// One flat fp32 array ordered by stage, each tensor aligned, each stage
/// padded to a multiple of dp * 32 elements so it splits into equal shards.
/// Frozen parameters are not in it: they have an array of their own, whole
/// on every rank, with no gradient, shard or optimizer state.
void ZeroLayoutPass::layOutParameters(ModuleOp module, MemoryPlan &plan) {
  Builder b(module.getContext());
  int64_t elemAlign = alignment / 4;
  std::map<int64_t, SmallVector<ParameterOp>> byStage;
  for (auto param : module.getOps<ParameterOp>()) {
    if (param.getFrozen()) {
      param->setAttr(kParamOffsetAttr,
                     b.getI64IntegerAttr(plan.frozenElements));
      plan.frozenElements +=
          llvm::alignTo(param.getTensorType().getNumElements(), elemAlign);
      continue;
    }
    byStage[parameterStage(param)].push_back(param);
  }
  int64_t numStages = byStage.empty() ? 0 : byStage.rbegin()->first + 1;
  int64_t stageAlign = std::lcm<int64_t>(dp * 32, elemAlign);
  for (int64_t stage = 0; stage < numStages; ++stage) {
    int64_t start = plan.paramElements;
    for (ParameterOp param : byStage[stage]) {
      param->setAttr(kParamOffsetAttr, b.getI64IntegerAttr(plan.paramElements));
      plan.paramElements +=
          llvm::alignTo(param.getTensorType().getNumElements(), elemAlign);
    }
    plan.paramElements = llvm::alignTo(plan.paramElements, stageAlign);
    plan.stageOffsets.push_back(start);
    plan.stageElements.push_back(plan.paramElements - start);
  }
}

/// Every op gets a stage: accumulations without one (autodiff gives each the
/// stage of its read) take their parameter's, other untagged ops (autodiff's
/// sums of several uses' gradients) the stage of the next tagged op, else of
/// the previous one. ZeRO-2/3 then need the stages in order: forward
/// ascending, backward descending.
LogicalResult ZeroLayoutPass::assignStages(func::FuncOp step,
                                           SymbolTable &symbols) {
  Builder b(step.getContext());
  Block &body = step.getBody().front();
  for (auto acc : body.getOps<AccumulateGradOp>())
    if (auto param = symbols.lookup<ParameterOp>(acc.getName());
        param && stageOf(acc) < 0)
      acc->setAttr(kStageAttr, b.getI64IntegerAttr(parameterStage(param)));
  int64_t next = -1;
  for (Operation &op : llvm::reverse(body.without_terminator())) {
    if (stageOf(&op) >= 0)
      next = stageOf(&op);
    else if (next >= 0)
      op.setAttr(kStageAttr, b.getI64IntegerAttr(next));
  }
  int64_t prev = 0;
  for (Operation &op : body.without_terminator()) {
    if (stageOf(&op) < 0)
      op.setAttr(kStageAttr, b.getI64IntegerAttr(prev));
    prev = stageOf(&op);
  }
  // Parameter reads are placed by their users (they are views), so only
  // computing ops are checked. What always works: ZeRO-1, which reduces
  // once per step and so takes the stages in any order.
  const char *zero1 = "; --zero-stage 1 takes the stages in any order";
  // An accumulation's location names its parameter, not a node.
  auto describe = [](Operation *op) -> std::string {
    if (auto acc = dyn_cast<AccumulateGradOp>(op))
      return (" (adding the gradient of @" + acc.getName() + ")").str();
    return onnxNodeOf(op);
  };
  Operation *lastForward = nullptr, *lastBackward = nullptr;
  for (Operation &op : body.without_terminator()) {
    if (isa<GetParameterOp, ConstantOp>(op))
      continue;
    int64_t s = stageOf(&op);
    if (isBackward(&op)) {
      if (lastBackward && s > stageOf(lastBackward))
        return op.emitOpError("in the backward of stage ")
               << s << describe(&op) << " runs after the backward of stage "
               << stageOf(lastBackward) << describe(lastBackward) << "; ZeRO-"
               << zeroStage.getValue()
               << " needs the backward to run the stages in reverse order"
               << zero1;
      lastBackward = &op;
    } else {
      if (lastBackward)
        return op.emitOpError("of the forward")
               << describe(&op) << " runs after the backward started"
               << describe(lastBackward) << "; ZeRO-" << zeroStage.getValue()
               << " needs the forward first" << zero1;
      if (lastForward && s < stageOf(lastForward))
        return op.emitOpError("in the forward of stage ")
               << s << describe(&op) << " runs after the forward of stage "
               << stageOf(lastForward) << describe(lastForward) << "; ZeRO-"
               << zeroStage.getValue()
               << " needs the forward to run the stages in order" << zero1;
      lastForward = &op;
    }
  }
  // A parameter belongs to the stage of its first read, so no stage reads
  // (or adds the gradient of) a parameter of a later stage.
  const char *firstUse = "; a parameter belongs to the stage of its first use";
  for (Operation &op : body.without_terminator()) {
    if (auto get = dyn_cast<GetParameterOp>(op)) {
      auto param = symbols.lookup<ParameterOp>(get.getName());
      if (!param || param.getFrozen())
        continue;
      for (Operation *user : get->getUsers())
        if (stageOf(user) < parameterStage(param))
          return user->emitOpError("in stage ")
                 << stageOf(user) << onnxNodeOf(user) << " reads @"
                 << get.getName() << " of the later stage "
                 << parameterStage(param) << firstUse;
    } else if (auto acc = dyn_cast<AccumulateGradOp>(op)) {
      auto param = symbols.lookup<ParameterOp>(acc.getName());
      if (param && stageOf(acc) < parameterStage(param))
        return acc.emitOpError("in stage ")
               << stageOf(acc) << " adds the gradient of @" << acc.getName()
               << " of the later stage " << parameterStage(param) << firstUse;
    }
  }
  return success();
}

/// Round-robin over the stages that have parameters: the i-th such stage
/// uses gradient slot i % numGrad and (ZeRO-3) weight slot i % numWeight. A
/// stage whose parameters later stages read (the tied embedding the head
/// reads, a block's weights every later layer reuses) keeps slots of its own
/// instead: a gradient slot, into which the backwards of those stages add
/// before its own does and which is reduced after its own backward, and
/// (ZeRO-3) a weight slot, which those stages read too, gathered once per
/// micro-batch and never overwritten.
void ZeroLayoutPass::assignSlots(MemoryPlan &plan, int64_t numGrad,
                                 int64_t numWeight,
                                 const std::set<int64_t> &gradTies,
                                 const std::set<int64_t> &weightTies) {
  int64_t numStages = plan.numStages();
  plan.stageGradSlot.assign(numStages, -1);
  plan.stageWeightSlot.assign(numStages, -1);
  plan.stageTieSlot.assign(numStages, -1);
  if (zeroStage == 1)
    return;
  auto assign = [&](int64_t s, int64_t slot, SmallVector<int64_t> &elements) {
    if (slot >= int64_t(elements.size()))
      elements.resize(slot + 1, 0);
    elements[slot] = std::max(elements[slot], plan.stageElements[s]);
    return slot;
  };
  int64_t used = 0, shared = 0;
  for (int64_t s = 0; s < numStages; ++s) {
    if (!plan.stageElements[s])
      continue;
    if (!gradTies.count(s))
      plan.stageGradSlot[s] =
          assign(s, used++ % numGrad, plan.gradSlotElements);
    if (zeroStage == 3 && !weightTies.count(s))
      plan.stageWeightSlot[s] =
          assign(s, shared++ % numWeight, plan.weightSlotElements);
  }
  plan.gradSlotElements.resize(std::min(used, numGrad), 0);
  for (int64_t owner : gradTies) {
    plan.stageGradSlot[owner] = plan.gradSlotElements.size();
    plan.gradSlotElements.push_back(plan.stageElements[owner]);
  }
  if (zeroStage != 3)
    return;
  plan.weightSlotElements.resize(std::min(shared, numWeight), 0);
  for (int64_t owner : weightTies) {
    plan.stageWeightSlot[owner] = plan.stageTieSlot[owner] =
        plan.weightSlotElements.size();
    plan.weightSlotElements.push_back(plan.stageElements[owner]);
  }
}

/// ZeRO-3: one model.get_parameter per (parameter, reading stage), marked
/// with the slot it reads; a stage reading another stage's parameter reads
/// that stage's tie slot.
void ZeroLayoutPass::splitParameterReads(func::FuncOp step,
                                         SymbolTable &symbols,
                                         MemoryPlan &plan) {
  OpBuilder b(step.getContext());
  SmallVector<GetParameterOp> gets(
      step.getBody().front().getOps<GetParameterOp>());
  for (GetParameterOp get : gets) {
    auto param = symbols.lookup<ParameterOp>(get.getName());
    if (param.getFrozen()) // read from the frozen array, always there
      continue;
    int64_t owner = parameterStage(param);
    std::map<int64_t, GetParameterOp> perStage;
    for (OpOperand &use : llvm::make_early_inc_range(get->getUses())) {
      int64_t s = stageOf(use.getOwner());
      auto [it, inserted] = perStage.try_emplace(s);
      if (inserted) {
        b.setInsertionPoint(use.getOwner());
        it->second = cast<GetParameterOp>(b.clone(*get));
        it->second->setAttr(kStageAttr, b.getI64IntegerAttr(s));
        int64_t slot;
        if (s == owner) {
          slot = plan.stageWeightSlot[owner];
        } else {
          if (plan.stageTieSlot[owner] < 0) {
            plan.stageTieSlot[owner] = plan.weightSlotElements.size();
            plan.weightSlotElements.push_back(plan.stageElements[owner]);
          }
          slot = plan.stageTieSlot[owner];
        }
        it->second->setAttr(kSlotAttr, b.getI64IntegerAttr(slot));
      } else if (use.getOwner()->isBeforeInBlock(it->second)) {
        it->second->moveBefore(use.getOwner());
      }
      use.set(it->second.getResult());
    }
    get->erase();
  }
}

void ZeroLayoutPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (failed(validateOptions(module)))
    return signalPassFailure();
  if (module->hasAttr(planPartAttrName(PlanPart::Layout))) {
    module.emitError("the module already has a memory plan");
    return signalPassFailure();
  }
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!step) {
    module.emitError(
        "no func.func @train_step to lay out; run fastllm-autodiff first");
    return signalPassFailure();
  }
  for (auto param : module.getOps<ParameterOp>())
    if (!param.getTensorType().getElementType().isF32()) {
      param.emitOpError("has element type ")
          << param.getTensorType().getElementType()
          << "; parameters must be f32 (fp32 master weights)";
      return signalPassFailure();
    }

  MemoryPlan plan;
  plan.dataParallel = dp;
  plan.zeroStage = zeroStage;
  plan.fullPrecisionGradients = fullPrecisionGradients;
  plan.alignment = alignment;
  layOutParameters(module, plan);
  SymbolTable symbols(module);
  // ZeRO-1 reduces once per step, whatever the ops' order; ZeRO-2/3 place
  // collectives by the stage and phase of each op.
  if (zeroStage >= 2 && failed(assignStages(step, symbols)))
    return signalPassFailure();
  // The stages whose parameters another stage adds gradients to (ZeRO-2/3)
  // or reads (ZeRO-3): their ties.
  std::set<int64_t> gradTies, weightTies;
  Block &body = step.getBody().front();
  if (zeroStage >= 2)
    for (auto acc : body.getOps<AccumulateGradOp>()) {
      int64_t owner =
          parameterStage(symbols.lookup<ParameterOp>(acc.getName()));
      if (stageOf(acc) != owner && plan.stageElements[owner])
        gradTies.insert(owner);
    }
  if (zeroStage == 3)
    for (auto get : body.getOps<GetParameterOp>()) {
      auto param = symbols.lookup<ParameterOp>(get.getName());
      int64_t owner = parameterStage(param);
      if (!param.getFrozen() && plan.stageElements[owner] &&
          llvm::any_of(get->getUsers(),
                       [&](Operation *user) { return stageOf(user) != owner; }))
        weightTies.insert(owner);
    }
  // Defaults (docs/DESIGN.md section 3): two gradient buffers for ZeRO-2/3, two
  // weight buffers for ZeRO-3, shared by the stages without ties; never more
  // slots than stages to serve.
  int64_t served =
      llvm::count_if(plan.stageElements, [](int64_t e) { return e > 0; });
  int64_t numGrad = numGradBuffers, numWeight = numWeightBuffers;
  assignSlots(plan,
              std::max<int64_t>(
                  1, std::min<int64_t>(numGrad, served - gradTies.size())),
              std::max<int64_t>(
                  1, std::min<int64_t>(numWeight, served - weightTies.size())),
              gradTies, weightTies);
  if (zeroStage == 3)
    splitParameterReads(step, symbols, plan);
  if (zeroStage >= 2) {
    Builder b(module.getContext());
    for (auto acc : step.getBody().front().getOps<AccumulateGradOp>()) {
      int64_t owner =
          parameterStage(symbols.lookup<ParameterOp>(acc.getName()));
      if (plan.stageGradSlot[owner] >= 0) // else: no elements to add
        acc->setAttr(kSlotAttr, b.getI64IntegerAttr(plan.stageGradSlot[owner]));
    }
  }
  plan.set(module, PlanPart::Layout);
}
