//===- Pipelines.cpp ------------------------------------------------------===//

#include "passes/Pipelines.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

#include "llvm/Support/Format.h"

#include <cmath>

using namespace mlir;
using namespace mlir::fastllm;

LogicalResult mlir::fastllm::verifyZeroOptions(
    int64_t dp, int64_t zeroStage, std::optional<int64_t> numGradBuffers,
    std::optional<int64_t> numWeightBuffers, StringRef prefix,
    function_ref<void(const Twine &)> error) {
  if (dp < 1)
    return error(prefix + "dp must be at least 1, got " + Twine(dp)), failure();
  // The plan and MPI count ranks in 32-bit ints; far more than any job.
  constexpr int64_t kMaxDp = int64_t(1) << 20;
  if (dp > kMaxDp)
    return error(prefix + "dp must be at most " + Twine(kMaxDp) + ", got " +
                 Twine(dp)),
           failure();
  if (zeroStage < 1 || zeroStage > 3)
    return error(prefix + "zero-stage must be 1, 2 or 3, got " +
                 Twine(zeroStage)),
           failure();
  for (auto [flag, value, minStage] :
       {std::tuple{"num-grad-buffers", numGradBuffers, 2},
        std::tuple{"num-weight-buffers", numWeightBuffers, 3}}) {
    if (!value)
      continue;
    if (*value < 1)
      return error(prefix + flag + " must be at least 1, got " + Twine(*value)),
             failure();
    if (zeroStage < minStage)
      return error(prefix + flag + " applies to ZeRO-" + Twine(minStage) +
                   (minStage == 2 ? " and 3" : "") + "; " + prefix +
                   "zero-stage is " + Twine(zeroStage)),
             failure();
  }
  return success();
}

LogicalResult
mlir::fastllm::verifyLayersPerStage(double layersPerStage, StringRef prefix,
                                    function_ref<void(const Twine &)> error) {
  if (layersPerStage > 0 && std::isfinite(layersPerStage))
    return success();
  std::string value;
  llvm::raw_string_ostream(value) << llvm::format("%g", layersPerStage);
  error(prefix + "layers-per-stage must be a positive finite number, got " +
        value);
  return failure();
}

LogicalResult
mlir::fastllm::verifyTrainingOptions(const TrainingPipelineOptions &options,
                                     StringRef prefix,
                                     function_ref<void(const Twine &)> error) {
  if (failed(verifyZeroOptions(
          options.dp, options.zeroStage, givenValue(options.numGradBuffers),
          givenValue(options.numWeightBuffers), prefix, error)) ||
      failed(verifyLayersPerStage(options.layersPerStage, prefix, error)))
    return failure();
  if (options.precision != "fp32" && options.precision != "bf16")
    return error(prefix + "precision " + options.precision +
                 " is not a precision (supported: fp32, bf16)"),
           failure();
  if (options.precision == "bf16" && !options.fullPrecisionGradients)
    return error(prefix +
                 "full-precision-gradients=false (bf16 gradient buffers) is "
                 "not implemented yet; bf16 training keeps fp32 gradient "
                 "buffers"),
           failure();
  return success();
}

void mlir::fastllm::buildTrainingPipeline(
    OpPassManager &pm, const TrainingPipelineOptions &options) {
  // Forwards an option to a pass only when it was given, so that the pass
  // sees exactly what the user said.
  auto forward = [](auto &to, const auto &from) {
    if (from.hasValue())
      to = from.getValue();
  };
  // Which parameters train is settled first: fusion reads frozen ones.
  MarkFrozenPassOptions marks;
  forward(marks.freeze, options.freeze);
  forward(marks.train, options.train);
  pm.addPass(createMarkFrozenPass(marks));
  pm.addNestedPass<func::FuncOp>(createFusePass());
  PartitionStagesPassOptions partition;
  forward(partition.layersPerStage, options.layersPerStage);
  pm.addPass(createPartitionStagesPass(partition));
  if (options.precision == "bf16")
    pm.addPass(createMixedPrecisionPass());
  AutodiffPassOptions autodiff;
  forward(autodiff.freeze, options.freeze);
  forward(autodiff.train, options.train);
  pm.addPass(createAutodiffPass(autodiff));
  pm.addPass(createCSEPass());
  pm.addPass(createFoldTransposesPass());
  // The buffer counts apply to some ZeRO stages only, so fastllm-zero-layout
  // must see which options were given: they reach it as its option string
  // (an options struct would mark every option given).
  std::string zero;
  llvm::raw_string_ostream zeroText(zero);
  auto give = [&](StringRef name, const auto &option) {
    if (option.hasValue())
      zeroText << name << "=" << option.getValue() << " ";
  };
  give("dp", options.dp);
  give("zero-stage", options.zeroStage);
  give("num-grad-buffers", options.numGradBuffers);
  give("num-weight-buffers", options.numWeightBuffers);
  give("full-precision-gradients", options.fullPrecisionGradients);
  std::unique_ptr<Pass> zeroLayout = createZeroLayoutPass();
  if (failed(zeroLayout->initializeOptions(
          zero, [](const Twine &) { return failure(); })))
    llvm::report_fatal_error("fastllm-zero-layout rejected the options "
                             "verifyTrainingOptions accepted: " +
                             Twine(zero));
  pm.addPass(std::move(zeroLayout));
  pm.addPass(createZeroCollectivesPass());
  pm.addPass(createVerifyCollectivesPass());
  pm.addPass(createCountTrafficPass());
  pm.addPass(createFuseGradAccumulationPass());
  pm.addPass(createFuseElementwisePass());
  PlanMemoryPassOptions plan;
  forward(plan.inputTokens, options.inputTokens);
  forward(plan.inputTargets, options.inputTargets);
  pm.addPass(createPlanMemoryPass(plan));
  pm.addPass(createPrepareEmissionPass());
}

void mlir::fastllm::registerFastllmPipelines() {
  for (auto [name, description] :
       {std::pair{"fastllm-training-pipeline",
                  "Imported model to a planned training step, ready for "
                  "the emitter of any target"},
        std::pair{"fastllm-cpu-pipeline",
                  "The earlier name of fastllm-training-pipeline"}}) {
    registerPassPipeline(
        name, description,
        [](OpPassManager &pm, StringRef text,
           function_ref<LogicalResult(const Twine &)> errorHandler) {
          TrainingPipelineOptions options;
          if (failed(options.parseFromString(text)))
            return failure();
          bool ok = succeeded(verifyTrainingOptions(
              options, "", [&](const Twine &msg) { (void)errorHandler(msg); }));
          if (!ok)
            return failure();
          buildTrainingPipeline(pm, options);
          return success();
        },
        [](function_ref<void(const detail::PassOptions &)> optHandler) {
          optHandler(TrainingPipelineOptions());
        });
  }
}
