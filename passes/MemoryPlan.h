//===- MemoryPlan.h - the static memory plan as attributes ------*- C++ -*-===//
//
// fastllm-plan-memory records its decisions as attributes so that every
// later step (report, codegen) reads one source of truth:
//   model.parameter      plan.offset  = element offset in the flat arrays
//   op in @train_step    plan.offsets = byte offset per result (-1: none)
//   model.accumulate_grad plan.grad_offset = byte offset of the gradient
//   module               plan.memory  = the regions below
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_PASSES_MEMORYPLAN_H
#define FASTLLM_PASSES_MEMORYPLAN_H

#include "mlir/IR/BuiltinOps.h"

#include <optional>

namespace mlir::fastllm {

constexpr llvm::StringLiteral kParamOffsetAttr = "plan.offset";
constexpr llvm::StringLiteral kResultOffsetsAttr = "plan.offsets";
constexpr llvm::StringLiteral kMemoryPlanAttr = "plan.memory";
constexpr llvm::StringLiteral kGradOffsetAttr = "plan.grad_offset";

/// The arena of one rank. Offsets and sizes are in bytes unless named
/// otherwise. fastllm-zero-layout fills in the parameter layout and the
/// slots, fastllm-verify-collectives the traffic, fastllm-plan-memory the
/// regions.
struct MemoryPlan {
  int64_t arenaBytes = 0;
  int64_t paramElements = 0;  ///< length of the flat stage-ordered layout
  int64_t dataParallel = 1, zeroStage = 1;
  /// Gradient buffers in fp32 (1) or in the compute dtype (0).
  int64_t fullPrecisionGradients = 1;
  /// Full weight and gradient arrays (paramElements each; -1: none, the
  /// stages use slots), then this rank's shards (paramElements /
  /// dataParallel each) of the master weights, AdamW moments and the reduced
  /// gradient.
  int64_t paramsOffset = -1, gradsOffset = -1;
  int64_t masterOffset = 0, adamMOffset = 0, adamVOffset = 0, gradShardOffset = 0;
  /// Frozen parameters: their own array, whole on every rank (-1: none).
  int64_t frozenOffset = -1, frozenElements = 0;
  /// Each stage's slice of the flat layout (elements), padded to dp * 32, and
  /// the slots it uses (-1: none). A tie slot holds the whole stage for the
  /// later stages that read one of its parameters (ZeRO-3).
  SmallVector<int64_t> stageOffsets, stageElements;
  SmallVector<int64_t> stageGradSlot, stageWeightSlot, stageTieSlot;
  /// Slots: elements and byte offsets. A gradient slot is reduced in place.
  SmallVector<int64_t> gradSlotElements, gradSlotOffsets;
  SmallVector<int64_t> weightSlotElements, weightSlotOffsets;
  /// Bytes one rank's collectives move (the full buffer's size per call),
  /// inside each micro-batch's step and once per optimizer step.
  int64_t reduceScatterBytesPerMicroBatch = 0, allGatherBytesPerMicroBatch = 0;
  int64_t reduceScatterBytesPerStep = 0, allGatherBytesPerStep = 0;
  int64_t tokensOffset = 0, targetsOffset = 0;
  int64_t tokensArg = 0, targetsArg = 0; ///< @train_step argument numbers
  int64_t activationsOffset = 0, activationsBytes = 0;
  /// What the activations would take without sharing: the planner's gain.
  int64_t activationsUnsharedBytes = 0;

  int64_t numStages() const { return stageOffsets.size(); }

  DictionaryAttr toAttr(MLIRContext *context) const;
  static std::optional<MemoryPlan> fromAttr(DictionaryAttr attr);
  /// The plan recorded on `module`, or nullopt with an error on it naming
  /// `pass`, the pass that records it.
  static std::optional<MemoryPlan> get(ModuleOp module,
                                       StringRef pass = "fastllm-plan-memory");
  void set(ModuleOp module) const;
};

/// Bytes one element of `type` takes in memory (i1 takes a byte).
int64_t elementBytes(Type type);

} // namespace mlir::fastllm

#endif // FASTLLM_PASSES_MEMORYPLAN_H
