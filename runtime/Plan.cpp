//===- Plan.cpp - checks and figures of a model's plan --------------------===//

#include "runtime/Plan.h"

#include <cstring>
#include <initializer_list>
#include <string>

using namespace fastllm::rt;

Status fastllm::rt::validatePlan(const PlanInfo &plan) {
  if (plan.abiVersion != kAbiVersion)
    return errorf("the model was compiled for runtime ABI %d but this runtime "
                  "is ABI %d; recompile it with this fastllm-opt",
                  plan.abiVersion, kAbiVersion);
  if (!plan.target || std::strcmp(plan.target, "cpu") != 0)
    return errorf("this runtime trains target 'cpu' models; the model was "
                  "compiled for '%s'",
                  plan.target ? plan.target : "");
  auto invalid = [](const std::string &what) {
    return Status::error("invalid model plan: " + what);
  };
  if (plan.batchSize < 1 || plan.seqLen < 1 || plan.vocabSize < 1 ||
      plan.numParams < 0 || plan.paramElements < 0 || plan.arenaBytes < 1 ||
      (plan.numParams > 0 && !plan.params))
    return invalid("non-positive sizes");
  auto region = [&](const char *what, int64_t offset, int64_t bytes,
                    int64_t align) {
    if (offset < 0 || bytes < 0 || offset % align != 0 ||
        offset > plan.arenaBytes - bytes)
      return invalid(std::string(what) + " region [" + std::to_string(offset) +
                     ", +" + std::to_string(bytes) + ") is misaligned or " +
                     "outside the arena of " + std::to_string(plan.arenaBytes) +
                     " bytes");
    return Status();
  };
  int64_t flatBytes = plan.paramElements * int64_t(sizeof(float));
  int64_t tokenBytes = plan.batchSize * plan.seqLen * int64_t(sizeof(int64_t));
  for (Status s : {region("params", plan.paramsOffset, flatBytes, 4),
                   region("grads", plan.gradsOffset, flatBytes, 4),
                   region("adam m", plan.adamMOffset, flatBytes, 4),
                   region("adam v", plan.adamVOffset, flatBytes, 4),
                   region("tokens", plan.tokensOffset, tokenBytes, 8),
                   region("targets", plan.targetsOffset, tokenBytes, 8)})
    if (!s.ok())
      return s;
  for (int32_t i = 0; i < plan.numParams; ++i) {
    const ParamInfo &p = plan.params[i];
    bool ok = p.name && p.rank >= 0 && p.rank <= kMaxRank && p.numel >= 0;
    int64_t numel = 1;
    for (int32_t d = 0; ok && d < p.rank; ++d)
      numel *= p.shape[d];
    if (!ok || numel != p.numel || p.offset < 0 ||
        p.offset > plan.paramElements - p.numel)
      return invalid("parameter #" + std::to_string(i) +
                     (p.name ? " '" + std::string(p.name) + "'" : "") +
                     " has an inconsistent shape or lies outside the " +
                     std::to_string(plan.paramElements) +
                     " parameter elements");
  }
  return Status();
}

ParamCounts fastllm::rt::countParams(const PlanInfo &plan) {
  ParamCounts counts;
  for (int32_t i = 0; i < plan.numParams; ++i) {
    counts.total += plan.params[i].numel;
    if (plan.params[i].trainable)
      counts.trainable += plan.params[i].numel;
  }
  return counts;
}
