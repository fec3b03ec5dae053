//===- PartitionStages.cpp - layers from structure, stages from layers ----===//

#include "passes/Passes.h"
#include "passes/Pipelines.h"
#include "passes/Zero.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseSet.h"

#include <cmath>

namespace mlir::fastllm {
#define GEN_PASS_DEF_PARTITIONSTAGESPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

namespace {

struct PartitionStagesPass
    : fastllm::impl::PartitionStagesPassBase<PartitionStagesPass> {
  using PartitionStagesPassBase::PartitionStagesPassBase;
  void runOnOperation() override;
};

/// A run of activation ops between two layer boundaries.
struct Segment {
  SmallVector<Operation *> ops;
  std::string signature; ///< op names in order: what a repeated block shares
};

/// The activation ops of `body` (those computing from the function's inputs)
/// cut at every point where one activation alone is live.
SmallVector<Segment> findSegments(Block &body) {
  DenseSet<Value> active;
  for (BlockArgument arg : body.getArguments())
    active.insert(arg);
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator()) {
    if (llvm::none_of(op.getOperands(),
                      [&](Value v) { return active.count(v); }))
      continue;
    for (Value r : op.getResults())
      active.insert(r);
    ops.push_back(&op);
  }
  // Position of each activation op, and the last position each activation
  // (not a function input) is read at; the return reads at the end.
  DenseMap<Operation *, int64_t> position;
  for (auto [i, op] : llvm::enumerate(ops))
    position[op] = i;
  int64_t end = ops.size();
  DenseMap<Value, int64_t> lastUse;
  for (Operation *op : ops)
    for (Value r : op->getResults())
      for (Operation *user : r.getUsers()) {
        auto it = position.find(user);
        int64_t at = it == position.end() ? end : it->second;
        lastUse[r] = std::max(lastUse.lookup(r), at);
      }
  // Sweep: `live` counts activations defined before the cut and read after.
  SmallVector<Segment> segments(1);
  int64_t live = 0;
  SmallVector<SmallVector<Value>> dying(end + 1);
  for (auto [i, op] : llvm::enumerate(ops)) {
    for (Value v : dying[i])
      (void)v, --live;
    segments.back().ops.push_back(op);
    segments.back().signature += op->getName().getStringRef().str() + ";";
    for (Value r : op->getResults())
      if (lastUse.count(r) && lastUse[r] > (int64_t)i) {
        ++live;
        dying[lastUse[r]].push_back(r);
      }
    // After this op, values whose last use is exactly i+1 are still live.
    bool boundary = live == 1 && op->getNumResults() == 1 &&
                    lastUse.lookup(op->getResult(0)) > (int64_t)i &&
                    (int64_t)i + 1 < end;
    if (boundary) {
      auto t = dyn_cast<RankedTensorType>(op->getResult(0).getType());
      boundary = t && isa<FloatType>(t.getElementType()) && t.getRank() >= 2;
    }
    if (boundary)
      segments.emplace_back();
  }
  if (segments.back().ops.empty())
    segments.pop_back();
  return segments;
}

} // namespace

void PartitionStagesPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (failed(verifyLayersPerStage(layersPerStage, "", [&](const Twine &msg) {
        module.emitError(msg);
      })))
    return signalPassFailure();
  // Fast-LLM's rule: a stage closes once the running layer count reaches the
  // last cut plus F, the cuts advancing by F. Below one layer a stage still
  // holds a whole layer (never an empty stage), so F < 1 means 1.
  const double perStage = std::max<double>(layersPerStage, 1.0);
  auto forward = module.lookupSymbol<func::FuncOp>("forward");
  if (!forward) {
    module.emitError("no func.func @forward to partition");
    return signalPassFailure();
  }
  Block &body = forward.getBody().front();
  SmallVector<Segment> segments = findSegments(body);

  // The blocks: the longest run of segments repeating with some period k
  // (at least twice); ties go to the smaller period. Without repetition
  // (one block), the middle segments are one layer.
  size_t n = segments.size();
  size_t bestStart = std::min<size_t>(1, n), bestPeriod = 0, bestCount = 0;
  // For period k, run[i] is how many consecutive segments from i equal the
  // one k further on; a run starting at s then repeats 1 + run[s] / k times.
  // Linear per period (a long graph once made this quadratic).
  SmallVector<size_t> run(n + 1, 0);
  for (size_t k = 1; k <= 8 && 2 * k <= n; ++k) {
    run[n] = 0;
    for (size_t i = n; i-- > 0;)
      run[i] = i + k < n && segments[i].signature == segments[i + k].signature
                   ? run[i + 1] + 1
                   : 0;
    for (size_t s = 0; s + 2 * k <= n; ++s) {
      size_t count = 1 + run[s] / k;
      if (count >= 2 && count * k > bestCount * bestPeriod) {
        bestStart = s;
        bestPeriod = k;
        bestCount = count;
      }
    }
  }
  // Layer of each segment: 0 for the embedding, then the blocks, then the head.
  SmallVector<int64_t> layerOf(n);
  int64_t numLayers;
  if (bestCount) {
    for (size_t i = 0; i < n; ++i)
      layerOf[i] = i < bestStart ? 0
                   : i < bestStart + bestCount * bestPeriod
                       ? 1 + (i - bestStart) / bestPeriod
                       : 1 + bestCount;
    numLayers =
        1 + bestCount + (bestStart + bestCount * bestPeriod < n ? 1 : 0);
    if (bestStart == 0) // no embedding segment before the blocks
      for (int64_t &l : layerOf)
        --l;
    if (bestStart == 0)
      --numLayers;
  } else {
    // No repeated block: embedding, one middle layer, head.
    for (size_t i = 0; i < n; ++i)
      layerOf[i] = i == 0 ? 0 : (i + 1 == n && n > 2 ? 2 : 1);
    numLayers = n <= 1 ? 1 : (n == 2 ? 2 : 3);
  }
  auto stageOfLayer = [&](int64_t layer) -> int64_t {
    return layer == 0 ? 0
                      : 1 + (int64_t)std::floor((layer - 1) / perStage + 1e-9);
  };

  Builder b(module.getContext());
  DenseMap<Operation *, int64_t> layerOfOp;
  for (auto [i, seg] : llvm::enumerate(segments))
    for (Operation *op : seg.ops)
      layerOfOp[op] = layerOf[i];
  // Static ops (from parameters and constants only) take the layer of their
  // first user, in reverse order so chains of static ops resolve.
  SmallVector<Operation *> all;
  for (Operation &op : body.without_terminator())
    all.push_back(&op);
  int64_t lastLayer = numLayers - 1;
  for (Operation *op : llvm::reverse(all)) {
    if (layerOfOp.count(op))
      continue;
    int64_t layer = lastLayer;
    bool found = false;
    for (Operation *user : op->getUsers()) {
      auto it = layerOfOp.find(user);
      if (it == layerOfOp.end())
        continue;
      layer = found ? std::min(layer, it->second) : it->second;
      found = true;
    }
    layerOfOp[op] = layer;
  }
  int64_t numStages = 0;
  for (Operation *op : all) {
    int64_t layer = layerOfOp[op], stage = stageOfLayer(layer);
    op->setAttr(kLayerAttr, b.getI64IntegerAttr(layer));
    op->setAttr(kStageAttr, b.getI64IntegerAttr(stage));
    numStages = std::max(numStages, stage + 1);
  }
  // A parameter belongs to the stage of its first read.
  SymbolTable symbols(module);
  DenseMap<StringRef, int64_t> paramStage;
  for (Operation *op : all)
    if (auto get = dyn_cast<GetParameterOp>(op)) {
      int64_t stage = stageOfLayer(layerOfOp[op]);
      auto [it, inserted] = paramStage.try_emplace(get.getName(), stage);
      if (!inserted)
        it->second = std::min(it->second, stage);
    }
  for (auto param : module.getOps<ParameterOp>()) {
    auto it = paramStage.find(param.getSymName());
    param->setAttr(kStageAttr, b.getI64IntegerAttr(
                                   it == paramStage.end() ? 0 : it->second));
  }
  module->setAttr("model.num_layers", b.getI64IntegerAttr(numLayers));
  module->setAttr("model.num_stages", b.getI64IntegerAttr(numStages));
}
