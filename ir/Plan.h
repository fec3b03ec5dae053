//===- Plan.h - the training program's plan as attributes -------*- C++ -*-===//
//
// The plan dialect (PlanDialect.td) and the compiler's view of the plan. The
// passes record their decisions as `plan.*` attributes so that every later
// step (the report, the emitter) reads one source of truth:
//   module               plan.memory      MemoryPlan below
//   model.parameter      plan.offset      element offset in the flat arrays
//                        plan.weight_decay  whether AdamW decays it
//   model.get_parameter  plan.slot        ZeRO-3: the weight slot it reads
//   gradient accumulation plan.slot       ZeRO-2/3: the slot it adds into
//                        plan.grad_offset byte offset of the gradient
//   op in @train_step    plan.offsets     byte offset per result (-1: none)
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_IR_PLAN_H
#define FASTLLM_IR_PLAN_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Dialect.h"

#include <optional>

#include "ir/PlanDialect.h.inc"

namespace mlir::fastllm {

constexpr llvm::StringLiteral kParamOffsetAttr = "plan.offset";
constexpr llvm::StringLiteral kResultOffsetsAttr = "plan.offsets";
constexpr llvm::StringLiteral kMemoryPlanAttr = "plan.memory";
constexpr llvm::StringLiteral kGradOffsetAttr = "plan.grad_offset";
constexpr llvm::StringLiteral kSlotAttr = "plan.slot";
constexpr llvm::StringLiteral kWeightDecayAttr = "plan.weight_decay";

/// The arena of one rank and what the passes decided about it. Its scalars
/// are the fields of runtime/PlanFields.def (the runtime's PlanInfo has the
/// same members, and the emitter copies them by name), each held as an
/// int64_t; the tables and the step's input roles are the compiler's.
/// fastllm-zero-layout fills in the parameter layout and the slots,
/// fastllm-verify-collectives the traffic, fastllm-plan-memory the regions
/// and the inputs, fastllm-prepare-emission the data's sizes.
struct MemoryPlan {
#define FASTLLM_PLAN_FIELD(type, name, key, none, doc) int64_t name = none;
#include "runtime/PlanFields.def"
  int64_t tokensArg = 0, targetsArg = 0; ///< @train_step argument numbers
  /// Each stage's slice of the flat layout (elements), padded to dp * 32, and
  /// the slots it uses (-1: none). A tie slot holds the whole stage for the
  /// later stages that read one of its parameters (ZeRO-3).
  SmallVector<int64_t> stageOffsets, stageElements;
  SmallVector<int64_t> stageGradSlot, stageWeightSlot, stageTieSlot;
  /// Slots: elements and byte offsets. A gradient slot is reduced in place.
  SmallVector<int64_t> gradSlotElements, gradSlotOffsets;
  SmallVector<int64_t> weightSlotElements, weightSlotOffsets;

  int64_t numStages() const { return stageOffsets.size(); }

  DictionaryAttr toAttr(MLIRContext *context) const;
  /// The plan `attr` holds, or failure with `error` saying what is missing,
  /// unknown or inconsistent.
  static FailureOr<MemoryPlan> fromAttr(DictionaryAttr attr,
                                        std::string *error = nullptr);
  /// The plan recorded on `module`, or nullopt with an error on it naming
  /// `pass`, the pass that records it.
  static std::optional<MemoryPlan> get(ModuleOp module,
                                       StringRef pass = "fastllm-plan-memory");
  void set(ModuleOp module) const;
};

/// Bytes one element of `type` takes in memory (i1 takes a byte).
int64_t elementBytes(Type type);

} // namespace mlir::fastllm

#endif // FASTLLM_IR_PLAN_H
