//===- Weights.cpp - the initial weights as safetensors -------------------===//
//
// writeWeights() hands the runtime's safetensors writer the initial values
// where they lie: an imported weight's resource blob is written from the
// blob; only a dense attribute (hand-written IR) is converted first.
//
//===----------------------------------------------------------------------===//

#include "codegen/CppEmitter.h"
#include "ir/ModelDialect.h"
#include "runtime/Safetensors.h"

#include "mlir/IR/DialectResourceBlobManager.h"

using namespace mlir;
using namespace mlir::fastllm;
using namespace mlir::fastllm::model;

LogicalResult mlir::fastllm::writeWeights(ModuleOp module, StringRef path) {
  std::vector<::fastllm::rt::TensorRef> tensors;
  std::vector<std::vector<float>> converted;
  for (auto p : module.getOps<ParameterOp>()) {
    ElementsAttr init = p.getInitialValueAttr();
    RankedTensorType t = p.getTensorType();
    const size_t bytes = t.getNumElements() * sizeof(float);
    const float *data = nullptr;
    if (!init)
      return p.emitOpError("has no initial value");
    if (auto res = dyn_cast<DenseResourceElementsAttr>(init)) {
      AsmResourceBlob *blob = res.getRawHandle().getBlob();
      if (!blob || blob->getData().size() != bytes)
        return p.emitOpError("initial value blob is missing or has the wrong "
                             "size");
      data = reinterpret_cast<const float *>(blob->getData().data());
    } else if (auto dense = dyn_cast<DenseElementsAttr>(init)) {
      std::vector<float> &values = converted.emplace_back();
      values.reserve(t.getNumElements());
      for (APFloat f : dense.getValues<APFloat>())
        values.push_back(f.convertToFloat());
      data = values.data();
    } else {
      return p.emitOpError("initial value kind is not supported");
    }
    tensors.push_back(
        {p.getSymName().str(),
         std::vector<int64_t>(t.getShape().begin(), t.getShape().end()), data});
  }
  ::fastllm::rt::Status status = ::fastllm::rt::writeSafetensors(
      path.str(), tensors, {{"format", "pt"}, {"producer", "fastllm-opt"}});
  if (!status.ok())
    return module.emitError(status.message());
  return success();
}
