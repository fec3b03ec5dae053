//===- EmitPlan.cpp - the plan table and the constants --------------------===//
//
// The part of the generated file outside the step: the parameter, stage and
// slot tables and makePlan() (runtime/ModelABI.h's PlanInfo, written member
// by member from runtime/PlanFields.def), and one array per model.constant.
//
//===----------------------------------------------------------------------===//

#include "codegen/StepEmitter.h"
#include "runtime/ModelABI.h"

#include "mlir/IR/DialectResourceBlobManager.h"

#include "llvm/Support/Format.h"

#include <cmath>

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

LogicalResult StepEmitter::emitConstants(func::FuncOp step) {
  llvm::raw_string_ostream cs(constants);
  for (auto c : step.getOps<ConstantOp>()) {
    auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
    if (!dense) {
      // compile's plan.mlir elides large constants (it is for reading):
      // they are `dense_resource<__elided__>` there, with no values.
      auto resource = dyn_cast<DenseResourceElementsAttr>(c.getValue());
      if (resource && resource.getRawHandle().getKey() == "__elided__")
        return c.emitOpError("holds a constant that compile's plan.mlir "
                             "leaves out (large constants are elided there); "
                             "`compile --emit source` writes the step's "
                             "source with it");
      return c.emitOpError("only dense constants are supported by the ")
             << desc.name << " target";
    }
    auto type = cType(dense.getElementType(), c);
    if (failed(type))
      return failure();
    std::string n = "c" + std::to_string(names.size());
    names[c.getResult()] = n;
    int64_t count = dense.isSplat() ? 1 : dense.getNumElements();
    if (dense.isSplat())
      splats.insert(c.getResult());
    size_t start = constants.size();
    // CUDA: the array lives on the device as gN; the step names it through
    // a pointer cN it looks up once.
    if (desc.constantsOnDevice) {
      cs << "__device__ const " << *type << " g" << n.substr(1) << "[" << count
         << "] = {";
      constantPointers += "  static const " + *type + " *" + n +
                          " = deviceAddress(g" + n.substr(1) + ");\n";
    } else {
      cs << "alignas(64) const " << *type << " " << n << "[" << count
         << "] = {";
    }
    auto print = [&](int64_t k) {
      if (k)
        cs << ", ";
      Type et = dense.getElementType();
      if (et.isBF16()) {
        // Its bits: a __device__ array needs a constant initializer, and
        // only the raw form of __nv_bfloat16 has a constexpr constructor.
        APFloat f = dense.getValues<APFloat>()[k];
        cs << "__nv_bfloat16_raw{"
           << llvm::format_hex(f.bitcastToAPInt().getZExtValue(), 6) << "}";
      } else if (isa<FloatType>(et)) {
        APFloat f = dense.getValues<APFloat>()[k];
        double d = f.convertToDouble();
        if (std::isnan(d))
          cs << "NAN";
        else if (std::isinf(d))
          cs << (d < 0 ? "-INFINITY" : "INFINITY");
        else
          cs << llvm::format("%.9e", d) << (et.isF32() ? "f" : "");
      } else if (et.isInteger(1)) {
        cs << (dense.getValues<bool>()[k] ? "1" : "0");
      } else {
        cs << dense.getValues<APInt>()[k].getSExtValue();
        if (et.isInteger(64))
          cs << "LL";
      }
    };
    for (int64_t k = 0; k < count; ++k)
      print(k);
    cs << "};\n";
    // A split source may define it in a part of its own (writeFile).
    constantDefs.push_back({"extern const " + *type + " " + n + "[" +
                                std::to_string(count) + "];\n",
                            constants.substr(start), count});
  }
  return success();
}

LogicalResult StepEmitter::emitPlan(const MemoryPlan &plan) {
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (plan.vocabSize < 1 || plan.batchSize < 1)
    return module.emitError("the plan has no data sizes; run "
                            "fastllm-prepare-emission");
  auto argName = [&](int64_t i) {
    auto n = step.getArgAttrOfType<StringAttr>(i, "model.name");
    return n ? n.getValue().str() : "arg" + std::to_string(i);
  };

  // The tables: rows of a few numbers each, in the order of the members of
  // runtime/ModelABI.h's ParamInfo, StageInfo and SlotInfo (named in a
  // comment above each table).
  os << "// {name, nameBytes, rank, shape, numel, offset, trainable, "
        "weightDecay}\n"
     << "const ParamInfo kParams[] = {\n";
  int numParams = 0;
  for (auto p : module.getOps<ParameterOp>()) {
    RankedTensorType t = p.getTensorType();
    auto offset = p->getAttrOfType<IntegerAttr>(kParamOffsetAttr);
    auto decay = p->getAttrOfType<BoolAttr>(kWeightDecayAttr);
    if (!offset || !decay)
      return p.emitOpError("has no planned offset or weight decay; run "
                           "fastllm-plan-memory and fastllm-prepare-emission");
    if (t.getRank() > 8)
      return p.emitOpError("has rank ")
             << t.getRank() << "; at most 8 is supported";
    paramIndex[p.getSymName()] = numParams;
    os << "    {" << cString(p.getSymName()) << ", " << p.getSymName().size()
       << ", " << t.getRank() << ", " << list(t.getShape()) << ", "
       << t.getNumElements() << ", " << offset.getInt() << ", "
       << (p.getFrozen() ? 0 : 1) << ", " << (decay.getValue() ? 1 : 0)
       << "},\n";
    ++numParams;
  }
  if (!numParams)
    os << "    {\"\", 0, 0, {0}, 0, 0, 0, 0},\n";
  os << "};\n\n";
  os << "// {offset, elements, gradSlot, weightSlot}\n"
     << "const StageInfo kStages[] = {\n";
  for (int64_t k = 0; k < plan.numStages(); ++k)
    os << "    {" << plan.stageOffsets[k] << ", " << plan.stageElements[k]
       << ", " << plan.stageGradSlot[k] << ", " << plan.stageWeightSlot[k]
       << "},\n";
  if (!plan.numStages())
    os << "    {0, 0, -1, -1},\n";
  os << "};\n\n";
  auto slots = [&](StringRef name, ArrayRef<int64_t> offsets,
                   ArrayRef<int64_t> elements) {
    os << "// {offset, elements}\n"
       << "const SlotInfo " << name << "[] = {\n";
    for (size_t i = 0; i < offsets.size(); ++i)
      os << "    {" << offsets[i] << ", " << elements[i] << "},\n";
    if (offsets.empty())
      os << "    {0, 0},\n";
    os << "};\n\n";
  };
  slots("kGradSlots", plan.gradSlotOffsets, plan.gradSlotElements);
  slots("kWeightSlots", plan.weightSlotOffsets, plan.weightSlotElements);

  // PlanInfo by member name: the plan's scalars from runtime/PlanFields.def,
  // then the rest.
  os << "PlanInfo makePlan() {\n"
     << "  PlanInfo p{};\n"
     << "  p.abiVersion = kAbiVersion;\n";
#define FASTLLM_PLAN_FIELD(type, name, key, none, part, doc)                   \
  os << "  p." #name " = " << plan.name << ";\n";
#include "runtime/PlanFields.def"
  os << "  p.target = \"" << desc.name << "\";\n"
     << "  p.tokensInput = " << cString(argName(plan.tokensArg)) << ";\n"
     << "  p.targetsInput = " << cString(argName(plan.targetsArg)) << ";\n"
     << "  p.numParams = " << numParams << ";\n"
     << "  p.params = kParams;\n"
     << "  p.numStages = " << plan.numStages() << ";\n"
     << "  p.stages = kStages;\n"
     << "  p.numGradSlots = " << plan.gradSlotOffsets.size() << ";\n"
     << "  p.gradSlots = kGradSlots;\n"
     << "  p.numWeightSlots = " << plan.weightSlotOffsets.size() << ";\n"
     << "  p.weightSlots = kWeightSlots;\n"
     << "  p.numTraceOps = kNumTraceOps;\n"
     << "  p.traceOps = kTraceOps;\n"
     << "  return p;\n"
     << "}\n";
  return success();
}
