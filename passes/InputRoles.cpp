//===- InputRoles.cpp - which step input holds the tokens, which the targets =//
//
// The training step takes two integer [batch, seq] inputs and the runtime
// must know which is which: it writes the batch's token ids into one and the
// next-token targets into the other. An export may declare them in either
// order, so the roles come from the graph: the token ids index an embedding
// table (model.gather), the targets are a loss's labels (model.cross_entropy,
// model.nll_loss). --input-tokens / --input-targets name them where the graph
// cannot tell, and are checked against it where it can. A graph that says
// nothing about either input keeps their declared order.
//
//===----------------------------------------------------------------------===//

#include "passes/InputRoles.h"

#include "ir/ModelDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {
/// What the graph says about one integer input.
struct Evidence {
  bool indexesTable = false; ///< a gather's indices: token ids
  bool labelsLoss = false;   ///< a loss's labels: targets
  bool looksLikeTokens() const { return indexesTable && !labelsLoss; }
  bool looksLikeTargets() const { return labelsLoss && !indexesTable; }
};
} // namespace

/// The name an input was exported under, or `arg<N>`.
static std::string inputName(func::FuncOp step, unsigned arg) {
  if (auto name = step.getArgAttrOfType<StringAttr>(arg, "model.name"))
    return name.getValue().str();
  return "arg" + std::to_string(arg);
}

static Evidence evidenceFor(func::FuncOp step, Value input) {
  Evidence e;
  step.walk([&](Operation *op) {
    if (isa<CrossEntropyOp, NllLossOp>(op) &&
        bufferRoot(op->getOperand(1)) == input)
      e.labelsLoss = true;
    if (auto gather = dyn_cast<GatherOp>(op))
      if (bufferRoot(gather.getIndices()) == input)
        e.indexesTable = true;
  });
  return e;
}

/// What the graph does with an input, for messages.
static StringRef describe(const Evidence &e) {
  if (e.indexesTable && e.labelsLoss)
    return "indexes an embedding table and labels a loss";
  if (e.indexesTable)
    return "indexes an embedding table";
  if (e.labelsLoss)
    return "labels a loss";
  return "neither indexes a table nor labels a loss";
}

FailureOr<InputRoles> mlir::fastllm::assignInputRoles(func::FuncOp step,
                                                      StringRef tokensName,
                                                      StringRef targetsName) {
  SmallVector<unsigned, 2> ints;
  for (BlockArgument arg : step.getArguments()) {
    auto t = dyn_cast<RankedTensorType>(arg.getType());
    if (t && isa<IntegerType>(t.getElementType()))
      ints.push_back(arg.getArgNumber());
  }
  if (ints.size() != 2 || step.getNumArguments() != 2) {
    InFlightDiagnostic d =
        step.emitError("the training step must take exactly two integer "
                       "inputs (tokens and targets), got ")
        << step.getFunctionType().getInputs();
    // PyTorch's exporter drops an input the graph does not read: a forward
    // that takes targets but returns logits (or computes the loss without
    // them) comes out with the token ids alone.
    if (ints.size() == 1 && step.getNumArguments() == 1)
      d.attachNote() << "the exporter drops an input the graph does not "
                        "read: the model's forward must compute the loss "
                        "from the targets it takes and return it (forward"
                        "(idx, targets) -> loss)";
    return d;
  }
  Evidence evidence[2] = {evidenceFor(step, step.getArgument(ints[0])),
                          evidenceFor(step, step.getArgument(ints[1]))};
  std::string names[2] = {inputName(step, ints[0]), inputName(step, ints[1])};

  // A name given on the command line: which of the two it is.
  auto lookup = [&](StringRef flag, StringRef name) -> FailureOr<int> {
    for (int i : {0, 1})
      if (names[i] == name)
        return i;
    return step.emitError() << "--" << flag << " '" << name
                            << "' is not an input of the model; its inputs "
                               "are '"
                            << names[0] << "' and '" << names[1] << "'";
  };
  int tokens = -1;
  if (!tokensName.empty()) {
    FailureOr<int> i = lookup("input-tokens", tokensName);
    if (failed(i))
      return failure();
    tokens = *i;
  }
  if (!targetsName.empty()) {
    FailureOr<int> i = lookup("input-targets", targetsName);
    if (failed(i))
      return failure();
    if (tokens == *i)
      return step.emitError()
             << "--input-tokens and --input-targets both name '" << names[*i]
             << "'";
    tokens = 1 - *i;
  }

  // How well "input t holds the tokens" fits the graph: +1 for each input
  // used as its role says, -1 for each used as the other role only.
  auto fit = [&](int t) {
    int score = 0;
    score += evidence[t].looksLikeTokens() - evidence[t].looksLikeTargets();
    score +=
        evidence[1 - t].looksLikeTargets() - evidence[1 - t].looksLikeTokens();
    return score;
  };
  if (tokens >= 0) {
    // Given: the graph must not fit the other way round better.
    if (fit(tokens) < fit(1 - tokens)) {
      InFlightDiagnostic d = step.emitError()
                             << "the inputs named as tokens ('" << names[tokens]
                             << "', which " << describe(evidence[tokens])
                             << ") and targets ('" << names[1 - tokens]
                             << "', which " << describe(evidence[1 - tokens])
                             << ") contradict the graph";
      d.attachNote() << "swap --input-tokens and --input-targets, or leave "
                        "them out: the graph tells the roles";
      return failure();
    }
  } else if (fit(0) != fit(1)) {
    tokens = fit(0) > fit(1) ? 0 : 1;
  } else if (evidence[0].indexesTable || evidence[0].labelsLoss ||
             evidence[1].indexesTable || evidence[1].labelsLoss) {
    // Both gathered, or both labelling a loss: the graph cannot tell.
    InFlightDiagnostic d = step.emitError()
                           << "cannot tell which input holds the token ids and "
                              "which the targets: '"
                           << names[0] << "' " << describe(evidence[0]) << ", '"
                           << names[1] << "' " << describe(evidence[1]);
    d.attachNote() << "name them: --input-tokens NAME --input-targets NAME";
    return failure();
  } else {
    // The graph says nothing about either: the declared order (the
    // vocabulary bound, fastllm-prepare-emission, then fails for a model
    // that neither gathers the tokens nor labels a loss with the targets).
    tokens = 0;
  }
  return InputRoles{ints[tokens], ints[1 - tokens]};
}
