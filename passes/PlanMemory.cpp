//===- PlanMemory.cpp - one static arena, offsets from liveness -----------===//
//
// The training step is a single block, so liveness is an interval of op
// indices per buffer: from its definition to the last use of the value or of
// any reshape aliasing it. Buffers are placed greedily by decreasing size at
// the lowest offset that does not overlap a placed buffer whose interval
// intersects (the "greedy by size" heuristic): large activations are placed
// first and small temporaries fill the gaps.
//
//===----------------------------------------------------------------------===//

#include "passes/MemoryPlan.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/Support/MathExtras.h"

#include <map>
#include <numeric>

namespace mlir::fastllm {
#define GEN_PASS_DEF_PLANMEMORYPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

//===----------------------------------------------------------------------===//
// MemoryPlan
//===----------------------------------------------------------------------===//

int64_t mlir::fastllm::elementBytes(Type type) {
  return type.isInteger(1) ? 1 : (type.getIntOrFloatBitWidth() + 7) / 8;
}

namespace {
/// The plan's fields by name, in one place for reading and writing.
template <typename Plan, typename Fn> void forEachField(Plan &p, Fn fn) {
  fn("arena_bytes", p.arenaBytes);
  fn("param_elements", p.paramElements);
  fn("data_parallel", p.dataParallel);
  fn("zero_stage", p.zeroStage);
  fn("params_offset", p.paramsOffset);
  fn("grads_offset", p.gradsOffset);
  fn("master_offset", p.masterOffset);
  fn("adam_m_offset", p.adamMOffset);
  fn("adam_v_offset", p.adamVOffset);
  fn("grad_shard_offset", p.gradShardOffset);
  fn("tokens_offset", p.tokensOffset);
  fn("targets_offset", p.targetsOffset);
  fn("tokens_arg", p.tokensArg);
  fn("targets_arg", p.targetsArg);
  fn("activations_offset", p.activationsOffset);
  fn("activations_bytes", p.activationsBytes);
  fn("activations_unshared_bytes", p.activationsUnsharedBytes);
}
} // namespace

DictionaryAttr MemoryPlan::toAttr(MLIRContext *context) const {
  Builder b(context);
  SmallVector<NamedAttribute> attrs;
  forEachField(*this, [&](StringRef name, int64_t value) {
    attrs.push_back(b.getNamedAttr(name, b.getI64IntegerAttr(value)));
  });
  attrs.push_back(b.getNamedAttr("stage_offsets", b.getDenseI64ArrayAttr(stageOffsets)));
  attrs.push_back(b.getNamedAttr("stage_elements", b.getDenseI64ArrayAttr(stageElements)));
  return b.getDictionaryAttr(attrs);
}

std::optional<MemoryPlan> MemoryPlan::fromAttr(DictionaryAttr attr) {
  MemoryPlan plan;
  bool ok = true;
  forEachField(plan, [&](StringRef name, int64_t &value) {
    auto v = attr.getAs<IntegerAttr>(name);
    ok &= static_cast<bool>(v);
    if (v)
      value = v.getInt();
  });
  auto offsets = attr.getAs<DenseI64ArrayAttr>("stage_offsets");
  auto elements = attr.getAs<DenseI64ArrayAttr>("stage_elements");
  if (!ok || !offsets || !elements || offsets.size() != elements.size())
    return std::nullopt;
  plan.stageOffsets.assign(offsets.asArrayRef().begin(), offsets.asArrayRef().end());
  plan.stageElements.assign(elements.asArrayRef().begin(), elements.asArrayRef().end());
  return plan;
}

std::optional<MemoryPlan> MemoryPlan::get(ModuleOp module) {
  auto attr = module->getAttrOfType<DictionaryAttr>(kMemoryPlanAttr);
  std::optional<MemoryPlan> plan = attr ? fromAttr(attr) : std::nullopt;
  if (!plan)
    module.emitError("the module has no memory plan; run fastllm-plan-memory");
  return plan;
}

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

namespace {
struct Buffer {
  Value value;
  int64_t bytes;
  int64_t start, end; ///< op indices, inclusive
  int64_t offset = -1;
};

struct PlanMemoryPass
    : fastllm::impl::PlanMemoryPassBase<PlanMemoryPass> {
  using PlanMemoryPassBase::PlanMemoryPassBase;
  void runOnOperation() override;
};
} // namespace

static int64_t bytesOf(Type type) {
  auto t = cast<RankedTensorType>(type);
  return t.getNumElements() * elementBytes(t.getElementType());
}

/// Places buffers greedily by size; returns the peak (bytes).
static int64_t placeBuffers(MutableArrayRef<Buffer> buffers, int64_t align) {
  SmallVector<Buffer *> order;
  for (Buffer &b : buffers)
    order.push_back(&b);
  llvm::stable_sort(order, [](Buffer *a, Buffer *b) { return a->bytes > b->bytes; });
  SmallVector<Buffer *> placed;
  int64_t peak = 0;
  for (Buffer *buf : order) {
    // Intervals of placed buffers alive at the same time, by offset.
    SmallVector<std::pair<int64_t, int64_t>> busy;
    for (Buffer *p : placed)
      if (p->start <= buf->end && buf->start <= p->end)
        busy.push_back({p->offset, p->offset + p->bytes});
    llvm::sort(busy);
    int64_t offset = 0;
    for (auto [lo, hi] : busy) {
      if (offset + buf->bytes <= lo)
        break;
      offset = std::max(offset, (int64_t)llvm::alignTo(hi, align));
    }
    buf->offset = offset;
    peak = std::max(peak, offset + buf->bytes);
    placed.push_back(buf);
  }
  return peak;
}

void PlanMemoryPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (alignment <= 0 || !llvm::isPowerOf2_64(alignment)) {
    module.emitError("alignment must be a positive power of two, got ")
        << alignment.getValue();
    return signalPassFailure();
  }
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!step) {
    module.emitError("no func.func @train_step to plan; run fastllm-autodiff first");
    return signalPassFailure();
  }
  Builder b(module.getContext());
  auto align = [&](int64_t v) { return (int64_t)llvm::alignTo(v, alignment); };
  MemoryPlan plan;

  if (dp < 1) {
    module.emitError("dp must be at least 1, got ") << dp.getValue();
    return signalPassFailure();
  }
  if (zeroStage < 1 || zeroStage > 3) {
    module.emitError("zero-stage must be 1, 2 or 3, got ") << zeroStage.getValue();
    return signalPassFailure();
  }
  plan.dataParallel = dp;
  plan.zeroStage = zeroStage;

  // Parameters: one flat fp32 array ordered by stage (model.stage, 0 when
  // the model was not partitioned), each tensor aligned, each stage padded
  // to a multiple of dp * 32 elements so it splits into equal shards.
  int64_t elemAlign = alignment / 4;
  std::map<int64_t, SmallVector<ParameterOp>> byStage;
  for (auto param : module.getOps<ParameterOp>()) {
    RankedTensorType type = param.getTensorType();
    if (!type.getElementType().isF32()) {
      param.emitOpError("has element type ")
          << type.getElementType() << "; parameters must be f32 (fp32 master weights)";
      return signalPassFailure();
    }
    auto stage = param->getAttrOfType<IntegerAttr>("model.stage");
    byStage[stage ? stage.getInt() : 0].push_back(param);
  }
  int64_t stageAlign = std::lcm<int64_t>(dp * 32, elemAlign);
  for (auto &[stage, params] : byStage) {
    int64_t start = plan.paramElements;
    for (ParameterOp param : params) {
      param->setAttr(kParamOffsetAttr, b.getI64IntegerAttr(plan.paramElements));
      plan.paramElements +=
          llvm::alignTo(param.getTensorType().getNumElements(), elemAlign);
    }
    plan.paramElements = llvm::alignTo(plan.paramElements, stageAlign);
    plan.stageOffsets.push_back(start);
    plan.stageElements.push_back(plan.paramElements - start);
  }
  int64_t paramBytes = align(plan.paramElements * 4);
  int64_t shardBytes = align(plan.paramElements / dp * 4);
  plan.paramsOffset = 0;
  plan.gradsOffset = paramBytes;
  int64_t cursor = 2 * paramBytes;
  for (int64_t *region : {&plan.masterOffset, &plan.adamMOffset,
                          &plan.adamVOffset, &plan.gradShardOffset}) {
    *region = cursor;
    cursor += shardBytes;
  }

  // Inputs: the first two integer arguments are the tokens and the targets.
  SmallVector<int64_t> intArgs;
  for (BlockArgument arg : step.getArguments()) {
    auto t = dyn_cast<RankedTensorType>(arg.getType());
    if (t && isa<IntegerType>(t.getElementType()))
      intArgs.push_back(arg.getArgNumber());
  }
  if (intArgs.size() != 2 || step.getNumArguments() != 2) {
    step.emitError("the training step must take exactly two integer inputs "
                   "(tokens and targets), got ")
        << step.getFunctionType().getInputs();
    return signalPassFailure();
  }
  plan.tokensArg = intArgs[0];
  plan.targetsArg = intArgs[1];
  plan.tokensOffset = cursor;
  cursor += align(bytesOf(step.getArgument(plan.tokensArg).getType()));
  plan.targetsOffset = cursor;
  cursor += align(bytesOf(step.getArgument(plan.targetsArg).getType()));
  plan.activationsOffset = cursor;

  // Liveness of every buffer an op defines; reshapes extend their source's.
  Block &body = step.getBody().front();
  DenseMap<Operation *, int64_t> index;
  for (auto [i, op] : llvm::enumerate(body))
    index[&op] = i;
  SmallVector<Buffer> buffers;
  DenseMap<Value, size_t> bufferOf;
  for (Operation &op : body) {
    if (isa<ConstantOp, GetParameterOp>(op))
      continue;
    if (auto reshape = dyn_cast<ReshapeOp>(op)) {
      auto it = bufferOf.find(reshape.getInput());
      if (it != bufferOf.end())
        bufferOf[reshape.getResult()] = it->second;
      continue;
    }
    for (Value r : op.getResults()) {
      bufferOf[r] = buffers.size();
      buffers.push_back({r, align(bytesOf(r.getType())), index[&op], index[&op]});
    }
  }
  for (Operation &op : body)
    for (Value operand : op.getOperands()) {
      auto it = bufferOf.find(operand);
      if (it != bufferOf.end())
        buffers[it->second].end = std::max(buffers[it->second].end, index[&op]);
    }
  for (const Buffer &buf : buffers)
    plan.activationsUnsharedBytes += buf.bytes;
  plan.activationsBytes = placeBuffers(buffers, alignment);
  plan.arenaBytes = align(plan.activationsOffset + plan.activationsBytes);

  for (Operation &op : body) {
    if (op.getNumResults() == 0 || isa<ConstantOp, GetParameterOp, ReshapeOp>(op))
      continue;
    SmallVector<int64_t> offsets;
    for (Value r : op.getResults())
      offsets.push_back(plan.activationsOffset + buffers[bufferOf[r]].offset);
    op.setAttr(kResultOffsetsAttr, b.getDenseI64ArrayAttr(offsets));
  }
  module->setAttr(kMemoryPlanAttr, plan.toAttr(module.getContext()));
}
