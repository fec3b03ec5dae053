//===- Train.h - the training loop ------------------------------*- C++ -*-===//
//
// Drives the generated step function: data into the arena, forward and
// backward per micro-batch, then ZeRO (docs/DESIGN.md section 3): every stage's
// gradients are reduce-scattered into this rank's shard and averaged (by
// the runtime once per step for ZeRO-1, by the step after each stage's
// backward for ZeRO-2/3), the global norm is summed over ranks, and clipping
// and AdamW update the rank's shard of the fp32 master weights, which are
// all-gathered into the full params the next step reads (ZeRO-1/2) or by
// the step itself, stage by stage (ZeRO-3). The step function is a parameter so
// that tests can train a fake model with known gradients.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_TRAIN_H
#define FASTLLM_RUNTIME_TRAIN_H

#include "runtime/Comm.h"
#include "runtime/Flags.h"
#include "runtime/ModelABI.h"
#include "runtime/Status.h"

#include <cstdio>

namespace fastllm::rt {

/// fastllm_step's signature: forward+backward of the micro-batch in the
/// arena, adding into its gradients (ZeRO-1) or reducing them through
/// `comm` (ZeRO-2/3), returning the micro-batch loss. `context` keys its
/// random ops: the run's seed, the step and the micro-batch's first global
/// sample.
using StepFunction = float (*)(char *arena, const Collectives *comm,
                               const StepContext *context);

/// How a run that returned success ended.
struct RunOutcome {
  /// 0 when every step ran; else the signal (runtime/Signals.h) that stopped
  /// the run early, after a complete step (and its checkpoint).
  int stopSignal = 0;
  int64_t lastStep = 0; ///< the last step completed
};

/// The job must run as many ranks as the model was compiled for (--dp).
Status checkWorldSize(const PlanInfo &plan, int worldSize);

/// Trains until step opts.steps as docs/DESIGN.md section 4 says, as rank
/// comm.rank() of comm.size(), starting from the newest complete checkpoint
/// when opts.resume. Everything the run reads (plan, data, weights,
/// checkpoint, output folders) is checked before the metrics file is written
/// or the first step runs. Rank 0 writes the metrics and its human progress
/// lines go to `log` unless it is null; warnings go to stderr.
///
/// Each step's metrics line carries the bytes its collectives moved (see
/// StepRecord); rank 0's log ends with them next to the plan's prediction.
///
/// Resume is bit-exact: a checkpoint holds each rank's shards of the master
/// weights and of AdamW's m and v, AdamW's step count, and the step; everything
/// else a step depends on is a function of the options and the step number (the
/// samplers hash (seed, step, sample), the schedule reads the step, the
/// gradients are zeroed every step). The metrics file keeps its lines up to the
/// checkpoint's step and the resumed run appends to it.
///
/// A step whose global gradient norm is not finite is skipped (nothing is
/// updated) and marked in the metrics; opts.maxSkippedSteps in a row end the
/// run with an error. A stop request (runtime/Signals.h) on any rank is
/// exchanged with the gradient norm, so every rank stops after the same
/// step, checkpoints it when opts.checkpointDir is set, and returns success
/// with `outcome->stopSignal` set.
Status train(const PlanInfo &plan, StepFunction step, const Options &opts,
             Communicator &comm, FILE *log, RunOutcome *outcome = nullptr);

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_TRAIN_H
