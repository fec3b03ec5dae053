//===- Pipelines.h - the named pipeline `compile` runs ----------*- C++ -*-===//
//
// `fastllm-opt compile` and the opt mode run the same pipeline, registered
// under a name (IREE's practice), so a lit test or a user can reproduce
// exactly what the driver did:
//   --pass-pipeline='builtin.module(fastllm-training-pipeline{dp=2
//   zero-stage=3})'
// It serves every target: the emitter's target description is not a pass
// option. `fastllm-cpu-pipeline`, its earlier name, is kept as an alias.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_PASSES_PIPELINES_H
#define FASTLLM_PASSES_PIPELINES_H

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

#include <optional>

namespace mlir::fastllm {

/// The pipeline's options: one member per line of TrainingOptions.def.
/// An option not given keeps its default and is not forwarded to the pass
/// that owns it (hasValue() says whether it was given).
struct TrainingPipelineOptions
    : public PassPipelineOptions<TrainingPipelineOptions> {
#define FASTLLM_TRAINING_OPTION(type, member, flag, initial, help)             \
  Option<type> member{*this, flag, llvm::cl::desc(help),                       \
                      llvm::cl::init(initial)};
#include "passes/TrainingOptions.def"
};

/// Checks the options, reporting each fault through `error` with the flag
/// spelt as `prefix` + its name ("--dp" for the driver, "dp" for a
/// pipeline string). The one place these rules live: the driver checks
/// before importing, the registered pipeline before running, and the passes
/// that own the options through the same rule functions below.
LogicalResult verifyTrainingOptions(const TrainingPipelineOptions &options,
                                    StringRef prefix,
                                    function_ref<void(const Twine &)> error);

/// An option's value when it was given, nullopt when it keeps its default.
template <typename OptionT>
std::optional<int64_t> givenValue(const OptionT &option) {
  if (!option.hasValue())
    return std::nullopt;
  return option.getValue();
}

/// The rules of fastllm-zero-layout's options (`numGradBuffers` and
/// `numWeightBuffers` only when given).
LogicalResult verifyZeroOptions(int64_t dp, int64_t zeroStage,
                                std::optional<int64_t> numGradBuffers,
                                std::optional<int64_t> numWeightBuffers,
                                StringRef prefix,
                                function_ref<void(const Twine &)> error);
/// The rule of fastllm-partition-stages's option.
LogicalResult verifyLayersPerStage(double layersPerStage, StringRef prefix,
                                   function_ref<void(const Twine &)> error);

/// Imported model -> planned training step, ready for the emitter. The
/// options must have been verified.
void buildTrainingPipeline(OpPassManager &pm,
                           const TrainingPipelineOptions &options);

void registerFastllmPipelines();

} // namespace mlir::fastllm

#endif // FASTLLM_PASSES_PIPELINES_H
