//===- Translate.cpp - planned IR to C++ as MLIR translations -------------===//
//
// `fastllm-opt translate --fastllm-to-cpu FILE.mlir` (and --fastllm-to-cuda)
// print the step a planned module compiles to, without the rest of
// `compile`: test/Codegen starts from hand-written IR this way, and
// -verify-diagnostics checks the emitter's errors.
//
//===----------------------------------------------------------------------===//

#include "codegen/CppEmitter.h"
#include "ir/ModelDialect.h"
#include "ir/Plan.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Tools/mlir-translate/Translation.h"

using namespace mlir;
using namespace mlir::fastllm;

void mlir::fastllm::registerFastllmTranslations() {
  auto dialects = [](DialectRegistry &registry) {
    registry
        .insert<model::ModelDialect, plan::PlanDialect, func::FuncDialect>();
  };
  static TranslateFromMLIRRegistration cpu(
      "fastllm-to-cpu",
      "print the C++ training step of a planned module (the CPU target)",
      [](ModuleOp module, raw_ostream &os) {
        return emitSource(module, Target::Cpu, os);
      },
      dialects);
  static TranslateFromMLIRRegistration cuda(
      "fastllm-to-cuda",
      "print the CUDA C++ training step of a planned module (the CUDA target)",
      [](ModuleOp module, raw_ostream &os) {
        return emitSource(module, Target::Cuda, os);
      },
      dialects);
}
