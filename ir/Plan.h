//===- Plan.h - the training program's plan as attributes -------*- C++ -*-===//
//
// The plan dialect (PlanDialect.td) and the compiler's view of the plan. The
// passes record their decisions as `plan.*` attributes so that every later
// step (the report, the emitter) reads one source of truth:
//   module               plan.layout      #plan.layout: fastllm-zero-layout's
//                        plan.arena       #plan.arena: fastllm-plan-memory's
//                        plan.traffic     #plan.traffic:
//                        fastllm-count-traffic's plan.data        #plan.data:
//                        fastllm-prepare-emission's
//                                         (together: MemoryPlan below)
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

/// The parts of the module's plan, one typed attribute each, named after
/// what the pass that sets it decides (runtime/PlanFields.def gives each
/// field's part).
enum class PlanPart : unsigned { Layout = 1, Arena = 2, Traffic = 4, Data = 8 };
/// A set of parts, for MemoryPlan::get.
using PlanParts = unsigned;
constexpr PlanParts kAllPlanParts = 15;
constexpr PlanParts operator|(PlanPart a, PlanPart b) {
  return PlanParts(a) | PlanParts(b);
}
/// The module attribute that holds `part` ("plan.layout", ...).
StringRef planPartAttrName(PlanPart part);
/// The pass that sets `part`.
StringRef planPartPass(PlanPart part);
/// Checks that `fields` are exactly the fields of `part`, with their types.
LogicalResult verifyPlanPart(PlanPart part, DictionaryAttr fields,
                             function_ref<InFlightDiagnostic()> emitError);

} // namespace mlir::fastllm

#define GET_ATTRDEF_CLASSES
#include "ir/PlanAttrs.h.inc"

namespace mlir::fastllm {

constexpr llvm::StringLiteral kParamOffsetAttr = "plan.offset";
constexpr llvm::StringLiteral kResultOffsetsAttr = "plan.offsets";
constexpr llvm::StringLiteral kGradOffsetAttr = "plan.grad_offset";
constexpr llvm::StringLiteral kSlotAttr = "plan.slot";
constexpr llvm::StringLiteral kWeightDecayAttr = "plan.weight_decay";

/// The arena of one rank and what the passes decided about it. Its scalars
/// are the fields of runtime/PlanFields.def (the runtime's PlanInfo has the
/// same members, and the emitter copies them by name), each held as an
/// int64_t; the tables and the step's input roles are the compiler's.
/// Each part is recorded by the pass that decides it (PlanPart): the
/// parameter layout and the slots' sizes, the arena, the traffic, the data's
/// sizes.
struct MemoryPlan {
#define FASTLLM_PLAN_FIELD(type, name, key, none, part, doc)                   \
  int64_t name = none;
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

  /// The fields of `part`, as its attribute holds them.
  DictionaryAttr partFields(PlanPart part, MLIRContext *context) const;
  /// Reads the fields of `part` from `fields` (which verifyPlanPart
  /// accepted).
  void readPart(PlanPart part, DictionaryAttr fields);
  /// The plan recorded on `module`. Every part in `parts` must be there (an
  /// error on the module names the pass that sets a missing one) and the
  /// parts must agree with each other; the other parts keep their defaults.
  static std::optional<MemoryPlan> get(ModuleOp module,
                                       PlanParts parts = kAllPlanParts);
  /// Records `part` on `module`.
  void set(ModuleOp module, PlanPart part) const;
};

/// Bytes one element of `type` takes in memory (i1 takes a byte).
int64_t elementBytes(Type type);

} // namespace mlir::fastllm

#endif // FASTLLM_IR_PLAN_H
