//===- PrepareEmission.cpp - the emitter's decisions, made visible --------===//
//
// Decides what the emitter used to decide while printing (the data's sizes,
// the vocabulary bound, which parameters AdamW decays) and records it as
// plan attributes, so that the emitter only prints and a test can read every
// decision in the IR.
//
//===----------------------------------------------------------------------===//

#include "ir/ModelDialect.h"
#include "ir/Plan.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::fastllm {
#define GEN_PASS_DEF_PREPAREEMISSIONPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {
struct PrepareEmissionPass
    : fastllm::impl::PrepareEmissionPassBase<PrepareEmissionPass> {
  void runOnOperation() override;
};

/// The largest token id + 1 the step can take: the class dimension of every
/// loss on the targets and the rows of every table the tokens index bound
/// it. Other losses (on constant labels) and other lookups do not. Failure
/// when nothing bounds it.
FailureOr<int64_t> vocabularyBound(func::FuncOp step, Value tokens,
                                   Value targets) {
  int64_t vocab = -1;
  auto bound = [&](int64_t v) { vocab = vocab < 0 ? v : std::min(vocab, v); };
  step.walk([&](Operation *op) {
    if (isa<CrossEntropyOp, NllLossOp>(op) &&
        bufferRoot(op->getOperand(1)) == targets)
      bound(cast<RankedTensorType>(op->getOperand(0).getType())
                .getShape()
                .back());
    if (auto gather = dyn_cast<GatherOp>(op))
      if (bufferRoot(gather.getIndices()) == tokens)
        bound(cast<RankedTensorType>(gather.getInput().getType())
                  .getDimSize(gather.getDim()));
  });
  if (vocab < 0) {
    InFlightDiagnostic d =
        step.emitError("cannot tell the vocabulary size: no loss on the "
                       "targets and no gather of the tokens");
    // (Naming the inputs would not help: the roles were read from the
    // graph, which gives neither a role.)
    d.attachNote() << "the token file's ids are checked against the "
                      "vocabulary: the model must look its token ids up in "
                      "a table (nn.Embedding, a gather) or take a "
                      "cross-entropy over the targets' classes";
    return failure();
  }
  return vocab;
}
} // namespace

void PrepareEmissionPass::runOnOperation() {
  ModuleOp module = getOperation();
  std::optional<MemoryPlan> plan =
      MemoryPlan::get(module, PlanPart::Layout | PlanPart::Arena);
  if (!plan)
    return signalPassFailure();
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!step) {
    module.emitError("no func.func @train_step to prepare");
    return signalPassFailure();
  }
  auto inputType = [&](int64_t arg) -> RankedTensorType {
    if (arg < 0 || arg >= step.getNumArguments())
      return {};
    return dyn_cast<RankedTensorType>(step.getArgument(arg).getType());
  };
  RankedTensorType tokens = inputType(plan->tokensArg);
  RankedTensorType targets = inputType(plan->targetsArg);
  if (!tokens || !targets || tokens.getRank() != 2 ||
      targets.getShape() != tokens.getShape()) {
    step.emitError("tokens and targets must both be [batch, seq]");
    return signalPassFailure();
  }
  if (!tokens.getElementType().isInteger(64) ||
      !targets.getElementType().isInteger(64)) {
    step.emitError("the tokens and targets inputs must be int64");
    return signalPassFailure();
  }
  FailureOr<int64_t> vocab =
      vocabularyBound(step, step.getArgument(plan->tokensArg),
                      step.getArgument(plan->targetsArg));
  if (failed(vocab))
    return signalPassFailure();
  plan->batchSize = tokens.getDimSize(0);
  plan->seqLen = tokens.getDimSize(1);
  plan->vocabSize = *vocab;
  plan->set(module, PlanPart::Data);

  Builder b(module.getContext());
  for (auto param : module.getOps<ParameterOp>())
    if (!param->hasAttr(kWeightDecayAttr))
      param->setAttr(kWeightDecayAttr,
                     b.getBoolAttr(param.getTensorType().getRank() >= 2));
}
