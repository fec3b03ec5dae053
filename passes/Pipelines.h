//===- Pipelines.h - the named pipelines `compile` runs ---------*- C++ -*-===//
//
// `fastllm-opt compile` and the opt mode run the same pipeline, registered
// under a name (IREE's practice), so a lit test or a user can reproduce
// exactly what the driver did: --pass-pipeline='builtin.module(fastllm-cpu-pipeline)'.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_PASSES_PIPELINES_H
#define FASTLLM_PASSES_PIPELINES_H

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

namespace mlir::fastllm {

struct TrainingPipelineOptions
    : public PassPipelineOptions<TrainingPipelineOptions> {
  Option<std::string> freeze{*this, "freeze",
                             llvm::cl::desc("Regex of parameters to freeze"),
                             llvm::cl::init("")};
};

/// Imported model -> planned training step, ready for the CPU emitter.
void buildCpuTrainingPipeline(OpPassManager &pm,
                              const TrainingPipelineOptions &options);

void registerFastllmPipelines();

} // namespace mlir::fastllm

#endif // FASTLLM_PASSES_PIPELINES_H
