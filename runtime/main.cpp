//===- main.cpp - entry point of a compiled training binary ---------------===//
//
// Linked after the generated model (which defines fastllm_plan and
// fastllm_step) and before libfastllm_rt. The only place that prints an error
// and picks the exit code.
//
//===----------------------------------------------------------------------===//

#include "runtime/Flags.h"
#include "runtime/ModelABI.h"
#include "runtime/Train.h"

#include <cstdio>

using namespace fastllm::rt;

int main(int argc, char **argv) {
  const PlanInfo &plan = *fastllm_plan();
  Expected<Options> opts = parseFlags(argc, argv, plan);
  if (!opts) {
    std::fprintf(stderr, "train: error: %s\n", opts.status().message().c_str());
    return 1;
  }
  if (opts->help) {
    std::fputs(helpText(plan).c_str(), stdout);
    return 0;
  }
  if (Status s = train(plan, fastllm_step, *opts, stdout); !s.ok()) {
    std::fprintf(stderr, "train: error: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}
