//===- ModelSummary.h - a readable overview of a model ----------*- C++ -*-===//

#ifndef FASTLLM_IR_MODELSUMMARY_H
#define FASTLLM_IR_MODELSUMMARY_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::fastllm {

struct ModelStats {
  int64_t numParameters = 0; ///< model.parameter symbols
  int64_t numParameterElements = 0;
  int64_t parameterBytes = 0;
};

ModelStats computeModelStats(ModuleOp module);

/// Prints parameter count, inputs, outputs and an op histogram of @forward.
void printModelSummary(ModuleOp module, llvm::raw_ostream &os);

} // namespace mlir::fastllm

#endif // FASTLLM_IR_MODELSUMMARY_H
