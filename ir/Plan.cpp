//===- Plan.cpp - the plan dialect and the compiler's plan ----------------===//

#include "ir/Plan.h"
#include "ir/ModelDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::fastllm;

#include "ir/PlanDialect.cpp.inc"

void plan::PlanDialect::initialize() {}

int64_t mlir::fastllm::elementBytes(Type type) {
  return type.isInteger(1) ? 1 : (type.getIntOrFloatBitWidth() + 7) / 8;
}

//===----------------------------------------------------------------------===//
// MemoryPlan <-> plan.memory
//===----------------------------------------------------------------------===//

namespace {
/// The plan's scalars by key: runtime/PlanFields.def, then the compiler's.
template <typename Plan, typename Fn> void forEachField(Plan &p, Fn fn) {
#define FASTLLM_PLAN_FIELD(type, name, key, none, doc) fn(#key, p.name);
#include "runtime/PlanFields.def"
  fn("tokens_arg", p.tokensArg);
  fn("targets_arg", p.targetsArg);
}
template <typename Plan, typename Fn> void forEachArray(Plan &p, Fn fn) {
  fn("stage_offsets", p.stageOffsets);
  fn("stage_elements", p.stageElements);
  fn("stage_grad_slot", p.stageGradSlot);
  fn("stage_weight_slot", p.stageWeightSlot);
  fn("stage_tie_slot", p.stageTieSlot);
  fn("grad_slot_elements", p.gradSlotElements);
  fn("grad_slot_offsets", p.gradSlotOffsets);
  fn("weight_slot_elements", p.weightSlotElements);
  fn("weight_slot_offsets", p.weightSlotOffsets);
}
} // namespace

DictionaryAttr MemoryPlan::toAttr(MLIRContext *context) const {
  Builder b(context);
  SmallVector<NamedAttribute> attrs;
  forEachField(*this, [&](StringRef name, int64_t value) {
    attrs.push_back(b.getNamedAttr(name, b.getI64IntegerAttr(value)));
  });
  forEachArray(*this, [&](StringRef name, ArrayRef<int64_t> values) {
    attrs.push_back(b.getNamedAttr(name, b.getDenseI64ArrayAttr(values)));
  });
  return b.getDictionaryAttr(attrs);
}

FailureOr<MemoryPlan> MemoryPlan::fromAttr(DictionaryAttr attr,
                                           std::string *error) {
  MemoryPlan plan;
  std::string why;
  llvm::StringSet<> known;
  auto fail = [&](const Twine &what) {
    if (why.empty())
      why = what.str();
  };
  forEachField(plan, [&](StringRef name, int64_t &value) {
    known.insert(name);
    auto v = attr.getAs<IntegerAttr>(name);
    if (!v)
      return fail("no integer '" + name + "'");
    value = v.getInt();
  });
  forEachArray(plan, [&](StringRef name, SmallVector<int64_t> &values) {
    known.insert(name);
    auto v = attr.getAs<DenseI64ArrayAttr>(name);
    if (!v)
      return fail("no i64 array '" + name + "'");
    values.assign(v.asArrayRef().begin(), v.asArrayRef().end());
  });
  for (NamedAttribute a : attr)
    if (!known.contains(a.getName().getValue()))
      fail("unknown field '" + a.getName().getValue() + "'");
  int64_t stages = plan.stageOffsets.size();
  for (auto *perStage : {&plan.stageElements, &plan.stageGradSlot,
                         &plan.stageWeightSlot, &plan.stageTieSlot})
    if (int64_t(perStage->size()) != stages)
      fail("the stage_* arrays differ in length");
  if (plan.gradSlotOffsets.size() != plan.gradSlotElements.size() ||
      plan.weightSlotOffsets.size() != plan.weightSlotElements.size())
    fail("a slot table's offsets and elements differ in length");
  if (!why.empty()) {
    if (error)
      *error = why;
    return failure();
  }
  return plan;
}

std::optional<MemoryPlan> MemoryPlan::get(ModuleOp module, StringRef pass) {
  auto attr = module->getAttrOfType<DictionaryAttr>(kMemoryPlanAttr);
  FailureOr<MemoryPlan> plan = failure();
  if (attr)
    plan = fromAttr(attr);
  if (failed(plan)) {
    module.emitError("the module has no (complete) memory plan; run ") << pass;
    return std::nullopt;
  }
  return *plan;
}

void MemoryPlan::set(ModuleOp module) const {
  module->setAttr(kMemoryPlanAttr, toAttr(module.getContext()));
}

//===----------------------------------------------------------------------===//
// Verification of plan.* attributes
//===----------------------------------------------------------------------===//

LogicalResult plan::PlanDialect::verifyOperationAttribute(Operation *op,
                                                          NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  Attribute value = attr.getValue();
  auto integer = [&](int64_t min) -> LogicalResult {
    auto i = dyn_cast<IntegerAttr>(value);
    if (!i || !i.getType().isSignlessInteger(64))
      return op->emitOpError("'") << name << "' must be an i64, got " << value;
    if (i.getInt() < min)
      return op->emitOpError("'")
             << name << "' must be at least " << min << ", got " << i.getInt();
    return success();
  };
  auto onParameter = [&]() -> LogicalResult {
    if (!isa<model::ParameterOp>(op))
      return op->emitOpError("'") << name << "' belongs on a model.parameter";
    return success();
  };
  if (name == kMemoryPlanAttr) {
    if (!isa<ModuleOp>(op))
      return op->emitOpError("'") << name << "' belongs on the module";
    auto dict = dyn_cast<DictionaryAttr>(value);
    if (!dict)
      return op->emitOpError("'") << name << "' must be a dictionary";
    std::string error;
    if (failed(MemoryPlan::fromAttr(dict, &error)))
      return op->emitOpError("'") << name << "' is not a plan: " << error;
    return success();
  }
  if (name == kParamOffsetAttr)
    return failure(failed(onParameter()) || failed(integer(0)));
  if (name == kWeightDecayAttr) {
    if (failed(onParameter()))
      return failure();
    if (!isa<BoolAttr>(value))
      return op->emitOpError("'") << name << "' must be true or false";
    return success();
  }
  if (name == kSlotAttr)
    return integer(-1);
  if (name == kGradOffsetAttr)
    return integer(0);
  if (name == kResultOffsetsAttr) {
    auto offsets = dyn_cast<DenseI64ArrayAttr>(value);
    if (!offsets || offsets.size() != int64_t(op->getNumResults()))
      return op->emitOpError("'")
             << name << "' must be an array<i64> with one offset per result ("
             << op->getNumResults() << ")";
    for (int64_t o : offsets.asArrayRef())
      if (o < -1)
        return op->emitOpError("'") << name << "' holds offset " << o;
    return success();
  }
  return op->emitOpError("has an unknown plan attribute '") << name << "'";
}
