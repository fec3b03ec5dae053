//===- Autodiff.cpp - reverse-mode autodiff over the model dialect --------===//
//
// The training step is built in one block: the forward ops (cloned from
// @forward), then the backward ops in reverse order, each op contributing
// through GradientOpInterface. Gradients flowing into one value from several
// uses are added; each read of a trainable parameter ends in a
// model.accumulate_grad, so tied parameters sum their uses' gradients.
// Only ops on a path from a trainable parameter to the loss get a backward.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/Zero.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/Regex.h"

namespace mlir::fastllm {
#define GEN_PASS_DEF_AUTODIFFPASS
#define GEN_PASS_DEF_MARKFROZENPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {
struct AutodiffPass : fastllm::impl::AutodiffPassBase<AutodiffPass> {
  using AutodiffPassBase::AutodiffPassBase;
  void runOnOperation() override;

private:
  LogicalResult markFrozen(ModuleOp module);
  LogicalResult differentiate(func::FuncOp step);
};
} // namespace

/// Applies --train, then --freeze (which wins where both match), to the
/// parameters' `frozen` marks.
static LogicalResult applyFreezeRegexes(ModuleOp module, StringRef freeze,
                                        StringRef train) {
  for (auto [pattern, flag, value] : {std::tuple{train, "--train", false},
                                      std::tuple{freeze, "--freeze", true}}) {
    if (pattern.empty())
      continue;
    llvm::Regex regex(pattern);
    std::string error;
    if (!regex.isValid(error))
      return module.emitError("invalid ")
             << flag << " regex '" << pattern << "': " << error;
    for (auto param : module.getOps<ParameterOp>())
      if (regex.match(param.getSymName())) {
        param.setFrozen(value);
        param->removeAttr("model.undecided"); // the user decided
        if (!value)
          param->removeAttr("model.constant_reason");
      }
  }
  // What the importer could not prove a weight (a folded row found in two
  // places, a table read only through sin and cos) would train, or not,
  // unlike PyTorch without a word: refused until decided.
  for (auto param : module.getOps<ParameterOp>()) {
    auto why = param->getAttrOfType<StringAttr>("model.undecided");
    if (!why || param.getFrozen())
      continue;
    std::string pattern = "'^" + llvm::Regex::escape(param.getSymName()) + "$'";
    return param.emitError("'")
           << param.getSymName() << "' may not be a weight of the model: "
           << why.getValue()
           << ". Trained or not, a wrong guess would differ from PyTorch "
              "without a word. Export with tools/fastllm_export.py "
              "(training mode, no folding, the model's parameters listed in "
              "the file), or decide: --freeze "
           << pattern << " keeps it constant, --train " << pattern
           << " trains it";
  }
  return success();
}

LogicalResult AutodiffPass::markFrozen(ModuleOp module) {
  return applyFreezeRegexes(module, freeze, train);
}

namespace {
struct MarkFrozenPass : fastllm::impl::MarkFrozenPassBase<MarkFrozenPass> {
  using MarkFrozenPassBase::MarkFrozenPassBase;
  void runOnOperation() override {
    if (failed(applyFreezeRegexes(getOperation(), freeze, train)))
      signalPassFailure();
  }
};
} // namespace

static bool isFloatTensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && isa<FloatType>(t.getElementType());
}

LogicalResult AutodiffPass::differentiate(func::FuncOp step) {
  Block &body = step.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  Value loss = ret.getOperand(0);
  SymbolTable symbols(getOperation());

  // Forward: which values depend on a trainable parameter.
  llvm::DenseSet<Value> active;
  for (Operation &op : body.without_terminator()) {
    if (auto get = dyn_cast<GetParameterOp>(op)) {
      if (!symbols.lookup<ParameterOp>(get.getName()).getFrozen())
        active.insert(get.getResult());
      continue;
    }
    if (!llvm::any_of(op.getOperands(),
                      [&](Value v) { return active.count(v); }))
      continue;
    for (Value r : op.getResults())
      if (isFloatTensor(r))
        active.insert(r);
  }

  // Backward, in reverse program order, inserted before the return.
  SmallVector<Operation *> forward;
  for (Operation &op : body.without_terminator())
    forward.push_back(&op);
  OpBuilder b(ret);
  DenseMap<Value, Value> grads;
  auto addGrad = [&](Value v, Value g, Location loc) {
    auto [it, inserted] = grads.try_emplace(v, g);
    if (!inserted)
      it->second = b.create<AddOp>(loc, it->second, g);
  };
  if (!active.count(loss))
    return step.emitError(
        "the loss does not depend on any trainable parameter");
  auto lossType = cast<RankedTensorType>(loss.getType());
  addGrad(loss,
          b.create<ConstantOp>(
              step.getLoc(),
              DenseElementsAttr::get(
                  lossType, b.getFloatAttr(lossType.getElementType(), 1.0))),
          step.getLoc());

  for (Operation *op : llvm::reverse(forward)) {
    SmallVector<Value> resultGrads;
    bool any = false;
    for (Value r : op->getResults()) {
      resultGrads.push_back(grads.lookup(r));
      any |= static_cast<bool>(resultGrads.back());
    }
    if (!any)
      continue;
    if (auto get = dyn_cast<GetParameterOp>(op)) {
      // Runs in the stage of the read, which may come after the stage the
      // parameter belongs to (a tied head, a weight shared across layers).
      auto acc = b.create<AccumulateGradOp>(op->getLoc(), get.getNameAttr(),
                                            resultGrads[0]);
      copyStage(op, acc);
      continue;
    }
    auto differentiable = dyn_cast<GradientOpInterface>(op);
    if (!differentiable)
      return op->emitOpError("is on the path from a trainable parameter to "
                             "the loss but has no gradient rule");
    b.setInsertionPoint(ret);
    Operation *before = ret->getPrevNode();
    SmallVector<Value> operandGrads;
    if (failed(differentiable.buildGradients(b, resultGrads, operandGrads)))
      return failure();
    // The backward of an op runs in its stage (stage partitioning ran first).
    for (Operation *bwd = before ? before->getNextNode() : &body.front();
         bwd && bwd != ret; bwd = bwd->getNextNode())
      copyStage(op, bwd);
    for (auto [operand, g] : llvm::zip(op->getOperands(), operandGrads))
      if (g && active.count(operand))
        addGrad(operand, g, op->getLoc());
  }

  // Mark the backward ops: the ZeRO schedule places collectives by phase.
  llvm::SmallPtrSet<Operation *, 32> isForward(forward.begin(), forward.end());
  for (Operation &op : body.without_terminator())
    if (!isForward.contains(&op))
      op.setAttr(kBackwardAttr, b.getUnitAttr());

  // Backward rules build every operand's gradient; drop what nothing reads.
  SmallVector<Operation *> all;
  for (Operation &op : body.without_terminator())
    all.push_back(&op);
  for (Operation *op : llvm::reverse(all))
    if (op->use_empty() && isPure(op))
      op->erase();
  return success();
}

void AutodiffPass::runOnOperation() {
  ModuleOp module = getOperation();
  auto forward = module.lookupSymbol<func::FuncOp>("forward");
  if (!forward) {
    module.emitError("no func.func @forward to differentiate");
    return signalPassFailure();
  }
  if (module.lookupSymbol("train_step")) {
    module.emitError("the module already has a @train_step");
    return signalPassFailure();
  }
  FunctionType type = forward.getFunctionType();
  auto lossType = type.getNumResults() == 1
                      ? dyn_cast<RankedTensorType>(type.getResult(0))
                      : RankedTensorType();
  if (!lossType || lossType.getRank() != 0 ||
      !isa<FloatType>(lossType.getElementType())) {
    forward.emitError("@forward must return one scalar float loss, got ")
        << type.getResults();
    return signalPassFailure();
  }
  if (failed(markFrozen(module)))
    return signalPassFailure();

  OpBuilder b(module.getContext());
  b.setInsertionPointAfter(forward);
  auto step = cast<func::FuncOp>(b.clone(*forward));
  step.setSymName("train_step");
  if (failed(differentiate(step)))
    return signalPassFailure();
}
