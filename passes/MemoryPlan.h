//===- MemoryPlan.h - the static memory plan as attributes ------*- C++ -*-===//
//
// fastllm-plan-memory records its decisions as attributes so that every
// later step (report, codegen) reads one source of truth:
//   model.parameter      plan.offset  = element offset in the flat arrays
//   op in @train_step    plan.offsets = byte offset per result (-1: none)
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

/// The arena of one rank. Offsets and sizes are in bytes unless named
/// otherwise.
struct MemoryPlan {
  int64_t arenaBytes = 0;
  int64_t paramElements = 0;  ///< length of the full params/grads arrays
  int64_t dataParallel = 1, zeroStage = 1;
  /// Full weight and gradient arrays, then this rank's shards (paramElements
  /// / dataParallel each) of the master weights, AdamW moments and the
  /// reduced gradient.
  int64_t paramsOffset = 0, gradsOffset = 0;
  int64_t masterOffset = 0, adamMOffset = 0, adamVOffset = 0, gradShardOffset = 0;
  /// Each stage's slice of the flat arrays (elements), padded to dp * 32.
  SmallVector<int64_t> stageOffsets, stageElements;
  int64_t tokensOffset = 0, targetsOffset = 0;
  int64_t tokensArg = 0, targetsArg = 0; ///< @train_step argument numbers
  int64_t activationsOffset = 0, activationsBytes = 0;
  /// What the activations would take without sharing: the planner's gain.
  int64_t activationsUnsharedBytes = 0;

  DictionaryAttr toAttr(MLIRContext *context) const;
  static std::optional<MemoryPlan> fromAttr(DictionaryAttr attr);
  /// The plan recorded on `module`, or nullopt with an error on it.
  static std::optional<MemoryPlan> get(ModuleOp module);
};

/// Bytes one element of `type` takes in memory (i1 takes a byte).
int64_t elementBytes(Type type);

} // namespace mlir::fastllm

#endif // FASTLLM_PASSES_MEMORYPLAN_H
