//===- Flags.h - the training binary's command line -------------*- C++ -*-===//
//
// The flags of `run/train` (docs/DESIGN.md section 4), read by CLI11 from the
// command line and from a run config file (--config). They are checked
// completely before anything is read or written, so a typo costs an error
// message, not a half-started run.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_FLAGS_H
#define FASTLLM_RUNTIME_FLAGS_H

#include "runtime/Data.h"
#include "runtime/ModelABI.h"
#include "runtime/Optimizer.h"
#include "runtime/Status.h"

#include <cstdint>
#include <string>

namespace fastllm::rt {

struct Options {
  std::string dataPath;
  TokenDtype dataDtype = TokenDtype::U16;
  bool dataDtypeGiven = false; ///< --data-dtype was on the command line
  int64_t steps = 0;
  double lr = 0;
  AdamWConfig adamw;
  double clipGradNorm = 0; ///< 0: no clipping
  LrScheduleKind lrSchedule = LrScheduleKind::Constant;
  int64_t warmupSteps = 0;
  int64_t gradAccum = 1;
  uint64_t seed = 0;
  SamplerKind sampler = SamplerKind::Random;
  std::string metricsPath;     ///< empty: no metrics file
  std::string weightsPath;     ///< defaultWeightsPath() unless given
  std::string dumpGradsPath;   ///< empty: no gradient dump
  std::string saveWeightsPath; ///< empty: final weights not saved
  bool allowNonfinite = false;
  /// A fresh run may replace existing --metrics, --dump-grads,
  /// --save-weights and --trace files.
  bool overwrite = false;
  std::string checkpointDir;   ///< empty: no checkpoints
  int64_t checkpointEvery = 0; ///< checkpoint after every N-th step; 0: never
  bool resume = false;         ///< start from checkpointDir's newest one
  int64_t keepLast = 0;        ///< complete checkpoints kept; 0: all
  double collectiveTimeout = 300; ///< seconds before a stuck job is aborted
  /// Consecutive steps with a non-finite gradient norm (each skipped) after
  /// which the run stops with an error.
  int64_t maxSkippedSteps = 5;
  std::string configPath; ///< --config FILE; empty: none
  /// A progress line every N steps (step 1, the last step and skipped steps
  /// are always printed; the metrics file has every step).
  int64_t logEvery = 10;
  /// The peak TFLOP/s MFU is measured against; 0: the device's default
  /// (peakTflops() in runtime/Train.h), which may be unknown.
  double peakTflops = 0;
  std::string valDataPath; ///< --val-data; empty: no validation
  int64_t evalEvery = 0;   ///< evaluate after every N-th step; 0: last only
  int64_t evalSteps = 10;  ///< global batches of validation per evaluation
  /// --trace FILE: a Chrome trace-event file of steps traceFirst to
  /// traceLast (1-based, inclusive; runtime/Trace.h); empty: no trace.
  std::string tracePath;
  int64_t traceFirst = 2, traceLast = 3;
  bool traceStepsGiven = false; ///< --trace-steps was given
  bool help = false;            ///< --help was given; nothing else was checked
};

/// Parses `argv[1..argc)` for the model described by `plan`, which names the
/// inputs that --input-tokens/--input-targets may only confirm.
Expected<Options> parseFlags(int argc, const char *const *argv,
                             const PlanInfo &plan);

/// The --help text: every flag with its default, the schedule formulas and a
/// summary of the model's plan.
std::string helpText(const PlanInfo &plan);

/// weights.safetensors in the folder of the running binary, where `compile`
/// writes the model's initial weights.
std::string defaultWeightsPath();

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_FLAGS_H
