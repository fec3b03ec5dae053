//===- Passes.h - fastllm-opt passes ----------------------------*- C++ -*-===//

#ifndef FASTLLM_PASSES_PASSES_H
#define FASTLLM_PASSES_PASSES_H

#include "ir/ModelDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::fastllm {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

} // namespace mlir::fastllm

#endif // FASTLLM_PASSES_PASSES_H
