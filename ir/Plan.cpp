//===- Plan.cpp - the plan dialect and the compiler's plan ----------------===//

#include "ir/Plan.h"
#include "ir/ModelDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::fastllm;

#include "ir/PlanDialect.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "ir/PlanAttrs.cpp.inc"

void plan::PlanDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "ir/PlanAttrs.cpp.inc"
      >();
}

int64_t mlir::fastllm::elementBytes(Type type) {
  return type.isInteger(1) ? 1 : (type.getIntOrFloatBitWidth() + 7) / 8;
}

//===----------------------------------------------------------------------===//
// MemoryPlan <-> the plan.* attributes of the module
//===----------------------------------------------------------------------===//

namespace {
/// The scalars of `part` by key: runtime/PlanFields.def's, then the
/// compiler's.
template <typename Plan, typename Fn>
void forEachField(Plan &p, PlanPart part, Fn fn) {
#define FASTLLM_PLAN_FIELD(type, name, key, none, fieldPart, doc)              \
  if (part == PlanPart::fieldPart)                                             \
    fn(#key, p.name);
#include "runtime/PlanFields.def"
  if (part == PlanPart::Arena) {
    fn("tokens_arg", p.tokensArg);
    fn("targets_arg", p.targetsArg);
  }
}
/// The tables of `part` by key.
template <typename Plan, typename Fn>
void forEachArray(Plan &p, PlanPart part, Fn fn) {
  if (part == PlanPart::Layout) {
    fn("stage_offsets", p.stageOffsets);
    fn("stage_elements", p.stageElements);
    fn("stage_grad_slot", p.stageGradSlot);
    fn("stage_weight_slot", p.stageWeightSlot);
    fn("stage_tie_slot", p.stageTieSlot);
    fn("grad_slot_elements", p.gradSlotElements);
    fn("weight_slot_elements", p.weightSlotElements);
  }
  if (part == PlanPart::Arena) {
    fn("grad_slot_offsets", p.gradSlotOffsets);
    fn("weight_slot_offsets", p.weightSlotOffsets);
  }
}
constexpr PlanPart kParts[] = {PlanPart::Layout, PlanPart::Arena,
                               PlanPart::Traffic, PlanPart::Data};
} // namespace

StringRef mlir::fastllm::planPartAttrName(PlanPart part) {
  switch (part) {
  case PlanPart::Layout:
    return "plan.layout";
  case PlanPart::Arena:
    return "plan.arena";
  case PlanPart::Traffic:
    return "plan.traffic";
  case PlanPart::Data:
    return "plan.data";
  }
  llvm_unreachable("a plan part");
}

StringRef mlir::fastllm::planPartPass(PlanPart part) {
  switch (part) {
  case PlanPart::Layout:
    return "fastllm-zero-layout";
  case PlanPart::Arena:
    return "fastllm-plan-memory";
  case PlanPart::Traffic:
    return "fastllm-count-traffic";
  case PlanPart::Data:
    return "fastllm-prepare-emission";
  }
  llvm_unreachable("a plan part");
}

LogicalResult
mlir::fastllm::verifyPlanPart(PlanPart part, DictionaryAttr fields,
                              function_ref<InFlightDiagnostic()> emitError) {
  std::string why;
  llvm::StringSet<> known;
  auto fail = [&](const Twine &what) {
    if (why.empty())
      why = what.str();
  };
  MemoryPlan shape;
  forEachField(shape, part, [&](StringRef name, int64_t &) {
    known.insert(name);
    auto v = fields.getAs<IntegerAttr>(name);
    if (!v || !v.getType().isSignlessInteger(64))
      fail("no i64 '" + name + "'");
  });
  forEachArray(shape, part, [&](StringRef name, SmallVector<int64_t> &) {
    known.insert(name);
    if (!fields.getAs<DenseI64ArrayAttr>(name))
      fail("no i64 array '" + name + "'");
  });
  for (NamedAttribute a : fields)
    if (!known.contains(a.getName().getValue()))
      fail("unknown field '" + a.getName().getValue() + "'");
  if (why.empty() && part == PlanPart::Layout) {
    int64_t stages = fields.getAs<DenseI64ArrayAttr>("stage_offsets").size();
    for (StringRef perStage : {"stage_elements", "stage_grad_slot",
                               "stage_weight_slot", "stage_tie_slot"})
      if (fields.getAs<DenseI64ArrayAttr>(perStage).size() != stages)
        fail("the stage_* arrays differ in length");
  }
  if (why.empty())
    return success();
  return emitError() << "'" << planPartAttrName(part) << "' is not a plan "
                     << planPartAttrName(part).drop_front(5) << ": " << why;
}

#define DEFINE_PLAN_PART_VERIFY(Attr)                                          \
  LogicalResult plan::Attr::verify(                                            \
      function_ref<InFlightDiagnostic()> emitError, DictionaryAttr fields) {   \
    return verifyPlanPart(kPart, fields, emitError);                           \
  }
DEFINE_PLAN_PART_VERIFY(LayoutAttr)
DEFINE_PLAN_PART_VERIFY(ArenaAttr)
DEFINE_PLAN_PART_VERIFY(TrafficAttr)
DEFINE_PLAN_PART_VERIFY(DataAttr)
#undef DEFINE_PLAN_PART_VERIFY

DictionaryAttr MemoryPlan::partFields(PlanPart part,
                                      MLIRContext *context) const {
  Builder b(context);
  SmallVector<NamedAttribute> attrs;
  forEachField(*this, part, [&](StringRef name, int64_t value) {
    attrs.push_back(b.getNamedAttr(name, b.getI64IntegerAttr(value)));
  });
  forEachArray(*this, part, [&](StringRef name, ArrayRef<int64_t> values) {
    attrs.push_back(b.getNamedAttr(name, b.getDenseI64ArrayAttr(values)));
  });
  return b.getDictionaryAttr(attrs);
}

void MemoryPlan::readPart(PlanPart part, DictionaryAttr fields) {
  forEachField(*this, part, [&](StringRef name, int64_t &value) {
    value = fields.getAs<IntegerAttr>(name).getInt();
  });
  forEachArray(*this, part, [&](StringRef name, SmallVector<int64_t> &values) {
    ArrayRef<int64_t> v = fields.getAs<DenseI64ArrayAttr>(name).asArrayRef();
    values.assign(v.begin(), v.end());
  });
}

/// fn(tag) with tag a null pointer to the attribute class that holds `part`.
template <typename Fn> static auto withPartAttr(PlanPart part, Fn fn) {
  switch (part) {
  case PlanPart::Layout:
    return fn(static_cast<plan::LayoutAttr *>(nullptr));
  case PlanPart::Arena:
    return fn(static_cast<plan::ArenaAttr *>(nullptr));
  case PlanPart::Traffic:
    return fn(static_cast<plan::TrafficAttr *>(nullptr));
  case PlanPart::Data:
    return fn(static_cast<plan::DataAttr *>(nullptr));
  }
  llvm_unreachable("a plan part");
}

/// The fields of the typed attribute of `part` on `module`, if it is there.
static DictionaryAttr partAttrFields(ModuleOp module, PlanPart part) {
  Attribute attr = module->getAttr(planPartAttrName(part));
  return withPartAttr(part, [&](auto *tag) -> DictionaryAttr {
    using Attr = std::remove_pointer_t<decltype(tag)>;
    auto typed = dyn_cast_or_null<Attr>(attr);
    return typed ? typed.getFields() : DictionaryAttr();
  });
}

std::optional<MemoryPlan> MemoryPlan::get(ModuleOp module, PlanParts parts) {
  MemoryPlan plan;
  for (PlanPart part : kParts) {
    if (!(parts & PlanParts(part)))
      continue;
    DictionaryAttr fields = partAttrFields(module, part);
    if (!fields) {
      module.emitError("the module has no ")
          << planPartAttrName(part) << "; run " << planPartPass(part);
      return std::nullopt;
    }
    plan.readPart(part, fields);
  }
  // The slot tables are split between the layout (sizes) and the arena
  // (offsets).
  if ((parts & PlanParts(PlanPart::Layout)) &&
      (parts & PlanParts(PlanPart::Arena)) &&
      (plan.gradSlotOffsets.size() != plan.gradSlotElements.size() ||
       plan.weightSlotOffsets.size() != plan.weightSlotElements.size())) {
    module.emitError("the plan's arena places ")
        << plan.gradSlotOffsets.size() << " gradient and "
        << plan.weightSlotOffsets.size() << " weight slots, its layout sizes "
        << plan.gradSlotElements.size() << " and "
        << plan.weightSlotElements.size();
    return std::nullopt;
  }
  return plan;
}

void MemoryPlan::set(ModuleOp module, PlanPart part) const {
  MLIRContext *context = module.getContext();
  DictionaryAttr fields = partFields(part, context);
  module->setAttr(planPartAttrName(part),
                  withPartAttr(part, [&](auto *tag) -> Attribute {
                    using Attr = std::remove_pointer_t<decltype(tag)>;
                    return Attr::get(context, fields);
                  }));
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
  for (PlanPart part : kParts) {
    if (name != planPartAttrName(part))
      continue;
    if (!isa<ModuleOp>(op))
      return op->emitOpError("'") << name << "' belongs on the module";
    if (!partAttrFields(cast<ModuleOp>(op), part))
      return op->emitOpError("'")
             << name << "' must be a #" << name << " attribute";
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
