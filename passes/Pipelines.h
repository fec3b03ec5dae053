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
  Option<std::string> train{
      *this, "train",
      llvm::cl::desc("Regex of parameters to train though the importer froze "
                     "them"),
      llvm::cl::init("")};
  Option<double> layersPerStage{*this, "layers-per-stage",
                                llvm::cl::desc("Layers per stage"),
                                llvm::cl::init(1.0)};
  Option<int64_t> dp{*this, "dp", llvm::cl::desc("Data-parallel ranks"),
                     llvm::cl::init(1)};
  Option<int64_t> zeroStage{*this, "zero-stage",
                            llvm::cl::desc("ZeRO stage (1, 2 or 3)"),
                            llvm::cl::init(1)};
  Option<int64_t> numGradBuffers{
      *this, "num-grad-buffers",
      llvm::cl::desc("Gradient slots (ZeRO-2/3; -1: the default, 2)"),
      llvm::cl::init(-1)};
  Option<std::string> precision{
      *this, "precision",
      llvm::cl::desc("Compute precision: fp32, or bf16 (fp32 weights, "
                     "gradients and loss)"),
      llvm::cl::init("fp32")};
  Option<bool> fullPrecisionGradients{
      *this, "full-precision-gradients",
      llvm::cl::desc("Gradient buffers in fp32 (else the compute dtype)"),
      llvm::cl::init(true)};
  Option<int64_t> numWeightBuffers{
      *this, "num-weight-buffers",
      llvm::cl::desc("Weight slots (ZeRO-3; -1: the default, 2)"),
      llvm::cl::init(-1)};
};

/// Imported model -> planned training step, ready for the CPU emitter.
void buildCpuTrainingPipeline(OpPassManager &pm,
                              const TrainingPipelineOptions &options);

void registerFastllmPipelines();

} // namespace mlir::fastllm

#endif // FASTLLM_PASSES_PIPELINES_H
