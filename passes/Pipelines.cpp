//===- Pipelines.cpp ------------------------------------------------------===//

#include "passes/Pipelines.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;
using namespace mlir::fastllm;

void mlir::fastllm::buildCpuTrainingPipeline(
    OpPassManager &pm, const TrainingPipelineOptions &options) {
  // Which parameters train is settled first: fusion reads frozen ones.
  MarkFrozenPassOptions marks;
  marks.freeze = options.freeze;
  marks.train = options.train;
  pm.addPass(createMarkFrozenPass(marks));
  pm.addNestedPass<func::FuncOp>(createFusePass());
  PartitionStagesPassOptions partition;
  partition.layersPerStage = options.layersPerStage;
  pm.addPass(createPartitionStagesPass(partition));
  if (options.precision == "bf16")
    pm.addPass(createMixedPrecisionPass());
  AutodiffPassOptions autodiff;
  autodiff.freeze = options.freeze;
  autodiff.train = options.train;
  pm.addPass(createAutodiffPass(autodiff));
  pm.addPass(createCSEPass());
  pm.addPass(createFoldTransposesPass());
  ZeroLayoutPassOptions zero;
  zero.dp = options.dp;
  zero.zeroStage = options.zeroStage;
  zero.numGradBuffers = options.numGradBuffers;
  zero.numWeightBuffers = options.numWeightBuffers;
  zero.fullPrecisionGradients = options.fullPrecisionGradients;
  pm.addPass(createZeroLayoutPass(zero));
  pm.addPass(createZeroCollectivesPass());
  pm.addPass(createVerifyCollectivesPass());
  pm.addPass(createFuseGradAccumulationPass());
  pm.addPass(createFuseElementwisePass());
  pm.addPass(createPlanMemoryPass());
}

void mlir::fastllm::registerFastllmPipelines() {
  PassPipelineRegistration<TrainingPipelineOptions>(
      "fastllm-cpu-pipeline",
      "Imported model to a planned training step for the CPU emitter",
      buildCpuTrainingPipeline);
}
