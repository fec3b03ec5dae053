//===- main.cpp - entry point of a compiled training binary ---------------===//
//
// Linked after the generated model (which defines fastllm_plan and
// fastllm_step) and before libfastllm_rt. The only place that prints an error
// and picks the exit code.
//
// Errors every rank meets alike (the plan, flags, the rank count) are printed
// once, by rank 0, and every rank exits 1. An error in training may be one
// rank's alone while its peers wait in a collective, so with several ranks
// it aborts the whole job, naming the rank.
//
// Exit status: 0 when every step ran; 1 on an error; 128 + N when signal N
// (SIGTERM, SIGINT, SIGUSR1) stopped the run after a complete step, on every
// rank alike (runtime/Signals.h, docs/TRAINING_RUNS.md).
//
//===----------------------------------------------------------------------===//

#include "runtime/Comm.h"
#include "runtime/Device.h"
#include "runtime/Flags.h"
#include "runtime/ModelABI.h"
#include "runtime/Plan.h"
#include "runtime/Signals.h"
#include "runtime/Train.h"

#include <cstdio>

using namespace fastllm::rt;

int main(int argc, char **argv) {
  Expected<std::unique_ptr<Communicator>> comm =
      Communicator::create(&argc, &argv);
  if (!comm) {
    std::fprintf(stderr, "train: error: %s\n", comm.status().message().c_str());
    return 1;
  }
  const bool leader = (*comm)->rank() == 0;
  const PlanInfo &plan = *fastllm_plan();
  // A plan the runtime cannot trust is not read further, not even for --help.
  Status s = validatePlan(plan);
  Expected<Options> opts =
      s.ok() ? parseFlags(argc, argv, plan) : Expected<Options>(s);
  if (opts && opts->help) {
    if (leader)
      std::fputs(helpText(plan).c_str(), stdout);
    return 0;
  }
  s = opts ? checkWorldSize(plan, (*comm)->size()) : opts.status();
  // The device last: --help and flag errors need none (a CUDA binary on a
  // machine without a GPU still explains itself).
  if (s.ok())
    s = initDevice((*comm)->localRank());
  if (!s.ok()) {
    if (leader)
      std::fprintf(stderr, "train: error: %s\n", s.message().c_str());
    return 1;
  }
  // Before any step: a stop requested during loading stops after step 1.
  installStopHandlers();
  RunOutcome outcome;
  if (Status s = train(plan, fastllm_step, *opts, **comm, stdout, &outcome);
      !s.ok()) {
    if ((*comm)->size() > 1)
      (*comm)->abort(s.message());
    std::fprintf(stderr, "train: error: %s\n", s.message().c_str());
    return 1;
  }
  std::fflush(stdout);
  return outcome.stopSignal ? 128 + outcome.stopSignal : 0;
}
