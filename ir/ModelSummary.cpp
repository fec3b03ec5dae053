//===- ModelSummary.cpp ---------------------------------------------------===//

#include "ir/ModelSummary.h"
#include "ir/ModelDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/Format.h"

using namespace mlir;
using namespace mlir::fastllm;

ModelStats mlir::fastllm::computeModelStats(ModuleOp module) {
  ModelStats stats;
  for (auto param : module.getOps<model::ParameterOp>()) {
    RankedTensorType type = param.getTensorType();
    ++stats.numParameters;
    stats.numParameterElements += type.getNumElements();
    stats.parameterBytes +=
        type.getNumElements() * type.getElementTypeBitWidth() / 8;
  }
  return stats;
}

static void printType(Type type, llvm::raw_ostream &os) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  if (!tensor) {
    os << type;
    return;
  }
  os << tensor.getElementType() << "[";
  llvm::interleaveComma(tensor.getShape(), os);
  os << "]";
}

void mlir::fastllm::printModelSummary(ModuleOp module, llvm::raw_ostream &os) {
  ModelStats stats = computeModelStats(module);
  os << "model summary\n";
  os << "  parameters: " << stats.numParameterElements << " elements in "
     << stats.numParameters << " tensors ("
     << llvm::format("%.2f", stats.parameterBytes / 1048576.0) << " MiB)\n";
  for (auto func : module.getOps<func::FuncOp>()) {
    os << "  function @" << func.getSymName() << "\n";
    for (auto [i, arg] : llvm::enumerate(func.getArguments())) {
      auto name = func.getArgAttrOfType<StringAttr>(i, "model.name");
      os << "    input  " << (name ? name.getValue() : "?") << ": ";
      printType(arg.getType(), os);
      os << "\n";
    }
    for (auto [i, type] : llvm::enumerate(func.getResultTypes())) {
      auto name = func.getResultAttrOfType<StringAttr>(i, "model.name");
      os << "    output " << (name ? name.getValue() : "?") << ": ";
      printType(type, os);
      os << "\n";
    }
    llvm::MapVector<StringRef, int64_t> histogram;
    int64_t total = 0;
    func.walk([&](Operation *op) {
      if (op == func.getOperation())
        return;
      ++histogram[op->getName().getStringRef()];
      ++total;
    });
    os << "    ops: " << total << "\n";
    SmallVector<std::pair<StringRef, int64_t>> sorted(histogram.begin(),
                                                      histogram.end());
    llvm::stable_sort(sorted,
                      [](auto &a, auto &b) { return a.second > b.second; });
    for (auto &[name, count] : sorted)
      os << llvm::format("      %-24s %6lld\n", name.str().c_str(),
                         (long long)count);
  }
  os << "  largest parameters:\n";
  SmallVector<model::ParameterOp> params(module.getOps<model::ParameterOp>());
  llvm::stable_sort(params, [](model::ParameterOp a, model::ParameterOp b) {
    return a.getTensorType().getNumElements() >
           b.getTensorType().getNumElements();
  });
  for (model::ParameterOp p : ArrayRef(params).take_front(8)) {
    os << "    " << p.getSymName() << ": ";
    printType(p.getType(), os);
    os << "\n";
  }
  // The importer's parameter-identity decisions (frontend/FoldedWeights.cpp).
  bool header = false;
  for (auto p : module.getOps<model::ParameterOp>())
    if (auto from = p->getAttrOfType<StringAttr>("model.copied_from")) {
      if (!header)
        os << "  parameters of their own, starting from a shared initializer "
              "(the exporter's Identity copies; --keep-shared-initializers "
              "keeps them one):\n";
      header = true;
      os << "    " << p.getSymName() << " <- " << from.getValue() << "\n";
    }
  header = false;
  for (auto p : module.getOps<model::ParameterOp>())
    if (auto views = p->getAttrOfType<ArrayAttr>("model.folded_views")) {
      if (!header)
        os << "  folded copies read as views of a parameter (ties kept; "
              "--keep-shared-initializers keeps them apart):\n";
      header = true;
      for (Attribute v : views)
        os << "    " << cast<StringAttr>(v).getValue() << "\n";
    }
  header = false;
  for (auto p : module.getOps<model::ParameterOp>())
    if (auto calls = p->getAttrOfType<ArrayAttr>("model.call_copies")) {
      if (!header)
        os << "  folded copies read by other calls of the same module, kept "
              "one weight (a shared block):\n";
      header = true;
      for (Attribute c : calls)
        os << "    " << cast<StringAttr>(c).getValue() << " = "
           << p.getSymName() << "\n";
    }
  header = false;
  for (auto p : module.getOps<model::ParameterOp>())
    if (auto from = p->getAttrOfType<StringAttr>("model.folded_from")) {
      if (!header)
        os << "  folded weights named after their module, stored in PyTorch's "
              "layout (the transpose of what the graph reads):\n";
      header = true;
      os << "    " << p.getSymName() << " <- transpose(" << from.getValue()
         << ")\n";
    }
  header = false;
  for (auto p : module.getOps<model::ParameterOp>())
    if (p.getSymName().starts_with("onnx::")) {
      if (!header)
        os << "  weights under the exporter's generated names (constant "
              "folding lost their PyTorch names; export with "
              "tools/fastllm_export.py to keep them):\n";
      header = true;
      os << "    " << p.getSymName() << "\n";
    }
  header = false;
  for (auto p : module.getOps<model::ParameterOp>())
    if (auto why = p->getAttrOfType<StringAttr>("model.constant_reason")) {
      if (!header)
        os << "  initializers kept constant, not trained (--train REGEX "
              "trains them):\n";
      header = true;
      os << "    " << p.getSymName() << ": " << why.getValue() << "\n";
    }
  header = false;
  for (auto p : module.getOps<model::ParameterOp>())
    if (auto why = p->getAttrOfType<StringAttr>("model.undecided")) {
      if (!header)
        os << "  initializers that may not be weights: compile stops until "
              "--train or --freeze decides each:\n";
      header = true;
      os << "    " << p.getSymName() << ": " << why.getValue() << "\n";
    }
}
