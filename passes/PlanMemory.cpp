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

#include "ir/Plan.h"
#include "passes/InputRoles.h"
#include "passes/Passes.h"
#include "passes/Zero.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/Support/MathExtras.h"

namespace mlir::fastllm {
#define GEN_PASS_DEF_PLANMEMORYPASS
#include "passes/Passes.h.inc"
} // namespace mlir::fastllm

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

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

struct PlanMemoryPass : fastllm::impl::PlanMemoryPassBase<PlanMemoryPass> {
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
  llvm::stable_sort(order,
                    [](Buffer *a, Buffer *b) { return a->bytes > b->bytes; });
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

namespace {
/// The arena's fixed regions, laid out one after the other from offset 0.
struct Arena {
  int64_t alignment;
  int64_t cursor = 0;
  int64_t align(int64_t v) const {
    return (int64_t)llvm::alignTo(v, alignment);
  }
  /// Reserves `bytes` (aligned) at the cursor; returns their offset.
  int64_t place(int64_t bytes) {
    int64_t offset = cursor;
    cursor += align(bytes);
    return offset;
  }
};
} // namespace

/// The regions of the weights, gradients, optimizer state and frozen
/// parameters, and the offsets of the slots the layout sized.
static void placeParameterRegions(MemoryPlan &plan, Arena &arena) {
  const int64_t dp = plan.dataParallel;
  plan.gradSlotOffsets.assign(plan.gradSlotElements.size(), -1);
  plan.weightSlotOffsets.assign(plan.weightSlotElements.size(), -1);
  // Weights: one buffer per stage (the full array) or ZeRO-3's slots.
  if (plan.zeroStage <= 2)
    plan.paramsOffset = arena.place(plan.paramElements * 4);
  else
    for (auto [offset, elements] :
         llvm::zip(plan.weightSlotOffsets, plan.weightSlotElements))
      offset = arena.place(elements * 4);
  // Gradients: one buffer per stage (ZeRO-1) or slots (reduced in place).
  if (plan.zeroStage == 1)
    plan.gradsOffset = arena.place(plan.paramElements * 4);
  else
    for (auto [offset, elements] :
         llvm::zip(plan.gradSlotOffsets, plan.gradSlotElements))
      offset = arena.place(elements * 4);
  for (int64_t *region : {&plan.masterOffset, &plan.adamMOffset,
                          &plan.adamVOffset, &plan.gradShardOffset})
    *region = arena.place(plan.paramElements / dp * 4);
  if (plan.frozenElements)
    plan.frozenOffset = arena.place(plan.frozenElements * 4);
}

/// Where `op`'s read of parameter `name` (or, with `grad`, its gradient
/// accumulation) points: into the full arrays, a slot, or the frozen array.
static std::optional<int64_t> parameterAddress(const MemoryPlan &plan,
                                               SymbolTable &symbols,
                                               Operation *op, StringRef name,
                                               int64_t slot, bool grad) {
  auto param = symbols.lookup<ParameterOp>(name);
  auto offset = param ? param->getAttrOfType<IntegerAttr>(kParamOffsetAttr)
                      : IntegerAttr();
  if (!offset) {
    op->emitOpError("reads a parameter without a planned offset; run "
                    "fastllm-zero-layout");
    return std::nullopt;
  }
  if (param.getTensorType().getNumElements() == 0)
    return 0; // an empty tensor: its pointer is never read
  if (param.getFrozen()) {
    if (grad) {
      op->emitOpError("accumulates the gradient of a frozen parameter");
      return std::nullopt;
    }
    return plan.frozenOffset + offset.getInt() * 4;
  }
  int64_t stage = parameterStage(param);
  int64_t inStage = (offset.getInt() - plan.stageOffsets[stage]) * 4;
  bool full = grad ? plan.zeroStage == 1 : plan.zeroStage <= 2;
  if (full)
    return (grad ? plan.gradsOffset : plan.paramsOffset) + offset.getInt() * 4;
  ArrayRef<int64_t> slots =
      grad ? plan.gradSlotOffsets : plan.weightSlotOffsets;
  if (slot < 0 || slot >= int64_t(slots.size())) {
    op->emitOpError("has no valid ")
        << (grad ? "gradient" : "weight") << " slot; run fastllm-zero-layout";
    return std::nullopt;
  }
  return slots[slot] + inStage;
}

/// Points each parameter read and gradient accumulation of the step at its
/// address.
static LogicalResult addressParameters(ModuleOp module, func::FuncOp step,
                                       const MemoryPlan &plan) {
  Builder b(module.getContext());
  SymbolTable symbols(module);
  for (Operation &op : step.getBody().front()) {
    std::optional<int64_t> address;
    if (auto get = dyn_cast<GetParameterOp>(op)) {
      if (!(address = parameterAddress(plan, symbols, &op, get.getName(),
                                       slotOf(&op), false)))
        return failure();
      op.setAttr(kResultOffsetsAttr, b.getDenseI64ArrayAttr({*address}));
    } else if (isa<AccumulateGradOp, MatmulAccumulateGradOp>(op)) {
      auto name = op.getAttrOfType<FlatSymbolRefAttr>("name").getValue();
      if (!(address =
                parameterAddress(plan, symbols, &op, name, slotOf(&op), true)))
        return failure();
      op.setAttr(kGradOffsetAttr, b.getI64IntegerAttr(*address));
    }
  }
  return success();
}

/// The token and target inputs: the step's two integer arguments, their
/// roles from the graph or the pass's input-tokens / input-targets.
static LogicalResult placeInputs(func::FuncOp step, MemoryPlan &plan,
                                 Arena &arena, StringRef tokensName,
                                 StringRef targetsName) {
  FailureOr<InputRoles> roles = assignInputRoles(step, tokensName, targetsName);
  if (failed(roles))
    return failure();
  plan.tokensArg = roles->tokens;
  plan.targetsArg = roles->targets;
  plan.tokensOffset =
      arena.place(bytesOf(step.getArgument(plan.tokensArg).getType()));
  plan.targetsOffset =
      arena.place(bytesOf(step.getArgument(plan.targetsArg).getType()));
  return success();
}

/// The activations, after the fixed regions: liveness of every buffer an op
/// defines (views extend their source's), placed greedily; each op's results
/// get their offsets.
static void placeActivations(func::FuncOp step, MemoryPlan &plan,
                             const Arena &arena) {
  plan.activationsOffset = arena.cursor;
  Block &body = step.getBody().front();
  DenseMap<Operation *, int64_t> index;
  for (auto [i, op] : llvm::enumerate(body))
    index[&op] = i;
  SmallVector<Buffer> buffers;
  DenseMap<Value, size_t> bufferOf;
  for (Operation &op : body) {
    if (isa<ConstantOp, GetParameterOp>(op))
      continue;
    if (auto view = dyn_cast<ViewLikeOpInterface>(op)) {
      auto it = bufferOf.find(view.getViewSource());
      if (it != bufferOf.end())
        bufferOf[op.getResult(0)] = it->second;
      continue;
    }
    for (Value r : op.getResults()) {
      if (!isa<RankedTensorType>(r.getType()))
        continue;
      bufferOf[r] = buffers.size();
      buffers.push_back(
          {r, arena.align(bytesOf(r.getType())), index[&op], index[&op]});
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
  plan.activationsBytes = placeBuffers(buffers, arena.alignment);
  plan.arenaBytes = arena.align(plan.activationsOffset + plan.activationsBytes);

  Builder b(step.getContext());
  for (Operation &op : body) {
    if (!llvm::any_of(op.getResultTypes(), llvm::IsaPred<RankedTensorType>) ||
        isa<ConstantOp, GetParameterOp, ViewLikeOpInterface>(op))
      continue;
    SmallVector<int64_t> offsets;
    for (Value r : op.getResults())
      offsets.push_back(plan.activationsOffset + buffers[bufferOf[r]].offset);
    op.setAttr(kResultOffsetsAttr, b.getDenseI64ArrayAttr(offsets));
  }
}

void PlanMemoryPass::runOnOperation() {
  ModuleOp module = getOperation();
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!step) {
    module.emitError(
        "no func.func @train_step to plan; run fastllm-autodiff first");
    return signalPassFailure();
  }
  std::optional<MemoryPlan> layout =
      MemoryPlan::get(module, PlanParts(PlanPart::Layout));
  if (!layout)
    return signalPassFailure();
  if (layout->arenaBytes) {
    module.emitError("the module's memory is already planned");
    return signalPassFailure();
  }
  MemoryPlan plan = std::move(*layout);
  Arena arena{plan.alignment};
  if (arena.alignment <= 0 || !llvm::isPowerOf2_64(arena.alignment)) {
    module.emitError("the plan's alignment must be a positive power of two, "
                     "got ")
        << arena.alignment;
    return signalPassFailure();
  }
  placeParameterRegions(plan, arena);
  if (failed(addressParameters(module, step, plan)) ||
      failed(placeInputs(step, plan, arena, inputTokens, inputTargets)))
    return signalPassFailure();
  placeActivations(step, plan, arena);
  plan.set(module, PlanPart::Arena);
}
