//===- Train.h - the training loop ------------------------------*- C++ -*-===//
//
// Drives the generated step function: data into the arena, forward and
// backward per micro-batch, then averaging, clipping and AdamW on the arena's
// flat parameter arrays. The step function is a parameter so that tests can
// train a fake model with known gradients.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_TRAIN_H
#define FASTLLM_RUNTIME_TRAIN_H

#include "runtime/Flags.h"
#include "runtime/ModelABI.h"
#include "runtime/Status.h"

#include <cstdio>

namespace fastllm::rt {

/// fastllm_step's signature: forward+backward of the micro-batch in the
/// arena, adding into its gradients and returning the micro-batch loss.
using StepFunction = float (*)(char *arena);

/// Trains for opts.steps steps as DESIGN.md section 4 says. Everything the
/// run reads (plan, data, weights, output folders) is checked before the
/// metrics file is created or the first step runs. Human progress lines go
/// to `log` unless it is null.
Status train(const PlanInfo &plan, StepFunction step, const Options &opts,
             FILE *log);

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_TRAIN_H
