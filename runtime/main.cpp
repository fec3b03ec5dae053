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
#include "runtime/OutputFile.h"
#include "runtime/Plan.h"
#include "runtime/Signals.h"
#include "runtime/Train.h"

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace fastllm::rt;

/// "" when OMP_NUM_THREADS is unset or what OpenMP reads (positive counts,
/// comma-separated for nested levels, each at most 4096), else why not: the
/// OpenMP runtime aborts on "abc" or "-3" at the first parallel region, and
/// 100000 threads took 3 GB before it did.
std::string checkOmpThreads() {
  const char *value = std::getenv("OMP_NUM_THREADS");
  if (!value)
    return "";
  std::string text = value;
  size_t at = 0;
  do {
    size_t comma = text.find(',', at);
    std::string item = text.substr(at, comma - at);
    if (item.empty() || item.size() > 4 ||
        item.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(item) < 1 || std::stoi(item) > 4096)
      return "OMP_NUM_THREADS='" + text +
             "' is not a thread count (1 to 4096, or a comma-separated list "
             "of them); unset it or set it to the cores to use";
    at = comma == std::string::npos ? comma : comma + 1;
  } while (at != std::string::npos);
  return "";
}

int main(int argc, char **argv) {
  reserveStandardStreams();
  ignoreFileSizeSignal();
  if (std::string why = checkOmpThreads(); !why.empty()) {
    std::fprintf(stderr, "train: error: %s\n", why.c_str());
    return 1;
  }
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
  // Before the first step a stop signal ends the process at once (nothing
  // to save yet); from the first step on it waits for the step.
  installStopHandlers();
  // A stop waits for its step and checkpoint, at most twice as long as any
  // collective may wait (they end the job themselves past theirs).
  setStopDeadline(2 * opts->collectiveTimeout);
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
