//===- Plan.cpp - checks and figures of a model's plan --------------------===//

#include "runtime/Plan.h"

#include "runtime/Device.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>
#include <vector>

using namespace fastllm::rt;

namespace {

Status invalid(const std::string &what) {
  return Status::error("invalid model plan: " + what);
}

std::string str(int64_t x) { return std::to_string(x); }

/// A byte range of the arena that one buffer occupies.
struct Extent {
  const char *name;
  int64_t offset, bytes;
};

} // namespace

namespace {

/// The ABI, the target and the sizes every other check relies on.
Status validateHeader(const PlanInfo &plan) {
  if (plan.abiVersion != kAbiVersion)
    return errorf("the model was compiled for runtime ABI %d but this runtime "
                  "is ABI %d; recompile it with this fastllm-opt",
                  plan.abiVersion, kAbiVersion);
  if (!plan.target || std::strcmp(plan.target, deviceTarget()) != 0)
    return errorf("this runtime trains target '%s' models; the model was "
                  "compiled for '%s'",
                  deviceTarget(), plan.target ? plan.target : "");
  if (plan.zeroStage < 1 || plan.zeroStage > 3)
    return invalid("zero stage " + str(plan.zeroStage) + " is not 1, 2 or 3");
  if (plan.dataParallel < 1)
    return invalid("data parallelism " + str(plan.dataParallel) +
                   " is not positive");
  if (!plan.tokensInput || !plan.targetsInput)
    return invalid("an input name is missing");
  if (plan.batchSize < 1 || plan.seqLen < 1 || plan.vocabSize < 1 ||
      plan.numParams < 0 || plan.paramElements < 0 || plan.arenaBytes < 1 ||
      plan.numStages < 0 || (plan.numParams > 0 && !plan.params) ||
      (plan.numStages > 0 && !plan.stages))
    return invalid("non-positive sizes or a missing table");
  // Every size below is bounded by the arena before it is multiplied.
  if (plan.paramElements > plan.arenaBytes / int64_t(sizeof(float)))
    return invalid(str(plan.paramElements) +
                   " parameter elements do not fit the arena of " +
                   str(plan.arenaBytes) + " bytes");

  return Status();
}

/// The ZeRO stage's arrays and slots, and the stages tiling the parameters.
Status validateStages(const PlanInfo &plan) {
  const bool fullParams = plan.zeroStage <= 2, fullGrads = plan.zeroStage == 1;
  // The full arrays exist where the ZeRO stage keeps one buffer per stage;
  // otherwise the stages use slots.
  if ((plan.paramsOffset >= 0) != fullParams ||
      (plan.gradsOffset >= 0) != fullGrads)
    return invalid("ZeRO-" + str(plan.zeroStage) + " must " +
                   (fullParams ? "" : "not ") + "have full weights and must " +
                   (fullGrads ? "" : "not ") + "have full gradients");
  if (plan.numGradSlots < 0 || plan.numWeightSlots < 0 ||
      (plan.numGradSlots > 0 && !plan.gradSlots) ||
      (plan.numWeightSlots > 0 && !plan.weightSlots) ||
      (plan.zeroStage == 1 && plan.numGradSlots != 0) ||
      (plan.zeroStage <= 2 && plan.numWeightSlots != 0) ||
      (plan.zeroStage >= 2 && plan.numStages > 0 && plan.numGradSlots == 0) ||
      (plan.zeroStage == 3 && plan.numStages > 0 && plan.numWeightSlots == 0))
    return invalid("the slot tables do not fit ZeRO-" + str(plan.zeroStage));
  // The stages tile the flat arrays in order, each splitting into dp equal
  // shards (docs/DESIGN.md section 3).
  const int64_t dp = plan.dataParallel;
  const int64_t quantum = dp * 32;
  int64_t next = 0;
  for (int32_t k = 0; k < plan.numStages; ++k) {
    const StageInfo &s = plan.stages[k];
    std::string what = "stage " + str(k) + " [" + str(s.offset) + ", +" +
                       str(s.elements) + ")";
    if (s.offset != next)
      return invalid(what + " does not start where " +
                     (k ? "stage " + str(k - 1) + " ends (" + str(next) + ")"
                        : std::string("the parameters do (0)")));
    if (s.elements < 0 || s.elements > plan.paramElements - next)
      return invalid(what + " does not lie inside the " +
                     str(plan.paramElements) + " parameter elements");
    if (s.elements % quantum != 0)
      return invalid(what + " is not a multiple of dp * 32 = " + str(quantum) +
                     " elements");
    if (s.elements / dp > INT_MAX)
      return invalid(what + " has shards of " + str(s.elements / dp) +
                     " elements, more than MPI's count limit");
    // A stage with parameters uses one slot of each kind its ZeRO stage
    // shares, large enough for it.
    struct {
      const char *kind;
      bool used;
      int32_t slot, count;
      const SlotInfo *table;
    } uses[] = {{"gradient", plan.zeroStage >= 2, s.gradSlot, plan.numGradSlots,
                 plan.gradSlots},
                {"weight", plan.zeroStage == 3, s.weightSlot,
                 plan.numWeightSlots, plan.weightSlots}};
    for (const auto &u : uses)
      if (u.used && s.elements > 0 &&
          (u.slot < 0 || u.slot >= u.count ||
           u.table[u.slot].elements < s.elements))
        return invalid(what + " uses " + u.kind + " slot " + str(u.slot) +
                       ", which does not exist or is too small");
    next += s.elements;
  }
  if (next != plan.paramElements)
    return invalid("the stages cover " + str(next) + " of the " +
                   str(plan.paramElements) + " parameter elements");

  return Status();
}

/// The arena's regions and slots: inside it, aligned, apart.
Status validateRegions(const PlanInfo &plan) {
  const bool fullParams = plan.zeroStage <= 2, fullGrads = plan.zeroStage == 1;
  const int64_t dp = plan.dataParallel;
  // Regions: inside the arena, aligned, and apart from one another.
  int64_t fullBytes = plan.paramElements * int64_t(sizeof(float));
  int64_t shardBytes = fullBytes / dp;
  int64_t tokenBytes = 0;
  if (__builtin_mul_overflow(plan.batchSize, plan.seqLen, &tokenBytes) ||
      __builtin_mul_overflow(tokenBytes, int64_t(sizeof(int64_t)), &tokenBytes))
    tokenBytes = INT64_MAX; // fails the arena check below
  std::vector<Extent> extents = {
      {"params", fullParams ? plan.paramsOffset : 0,
       fullParams ? fullBytes : 0},
      {"grads", fullGrads ? plan.gradsOffset : 0, fullGrads ? fullBytes : 0},
      {"master", plan.masterOffset, shardBytes},
      {"adam m", plan.adamMOffset, shardBytes},
      {"adam v", plan.adamVOffset, shardBytes},
      {"grad shard", plan.gradShardOffset, shardBytes},
      {"tokens", plan.tokensOffset, tokenBytes},
      {"targets", plan.targetsOffset, tokenBytes},
      {"activations", plan.activationsOffset, plan.activationsBytes},
      {"frozen", plan.frozenElements ? plan.frozenOffset : 0,
       plan.frozenElements * int64_t(sizeof(float))}};
  if (plan.frozenElements < 0 ||
      plan.frozenElements > plan.arenaBytes / int64_t(sizeof(float)) ||
      (plan.frozenElements > 0 && plan.frozenOffset < 0))
    return invalid("the frozen parameters' array (" + str(plan.frozenElements) +
                   " elements at " + str(plan.frozenOffset) +
                   ") is inconsistent");
  // Slots, bounded by the arena before their sizes are multiplied.
  std::vector<std::string> slotNames;
  slotNames.reserve(plan.numGradSlots + plan.numWeightSlots);
  auto addSlot = [&](const std::string &name, int64_t offset,
                     int64_t elements) -> Status {
    if (elements < 0 || elements > plan.arenaBytes / int64_t(sizeof(float)) ||
        elements % dp != 0)
      return invalid(name + " has " + str(elements) +
                     " elements, not a multiple of dp inside the arena");
    slotNames.push_back(name);
    extents.push_back(
        {slotNames.back().c_str(), offset, elements * int64_t(sizeof(float))});
    return Status();
  };
  for (int32_t i = 0; i < plan.numGradSlots; ++i) {
    const SlotInfo &g = plan.gradSlots[i];
    if (Status st = addSlot("gradient slot " + str(i), g.offset, g.elements);
        !st.ok())
      return st;
  }
  for (int32_t i = 0; i < plan.numWeightSlots; ++i)
    if (Status st = addSlot("weight slot " + str(i), plan.weightSlots[i].offset,
                            plan.weightSlots[i].elements);
        !st.ok())
      return st;
  for (const Extent &e : extents) {
    int64_t align = std::string_view(e.name) == "tokens" ||
                            std::string_view(e.name) == "targets"
                        ? 8
                        : 4;
    if (e.offset < 0 || e.bytes < 0 || e.offset % align != 0 ||
        e.bytes > plan.arenaBytes || e.offset > plan.arenaBytes - e.bytes)
      return invalid(std::string(e.name) + " region [" + str(e.offset) + ", +" +
                     str(e.bytes) + ") is misaligned or outside the " +
                     "arena of " + str(plan.arenaBytes) + " bytes");
  }
  for (const Extent &a : extents)
    for (const Extent &b : extents)
      if (&a < &b && a.bytes > 0 && b.bytes > 0 &&
          a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes)
        return invalid(std::string(a.name) + " region [" + str(a.offset) +
                       ", +" + str(a.bytes) + ") overlaps " + b.name +
                       " region [" + str(b.offset) + ", +" + str(b.bytes) +
                       ")");

  return Status();
}

/// The parameter table: consistent, unique, each inside one stage, apart.
Status validateParams(const PlanInfo &plan) {
  std::set<std::string_view> names;
  std::vector<std::pair<int64_t, int32_t>> byOffset; // (key, index)
  for (int32_t i = 0; i < plan.numParams; ++i) {
    const ParamInfo &p = plan.params[i];
    std::string what =
        "parameter #" + str(i) + (p.name ? " '" + paramName(p) + "'" : "");
    bool ok = p.name && p.nameBytes >= 0 && p.rank >= 0 && p.rank <= kMaxRank &&
              p.numel >= 0;
    int64_t numel = 1;
    for (int32_t d = 0; ok && d < p.rank; ++d)
      ok =
          p.shape[d] >= 0 && !__builtin_mul_overflow(numel, p.shape[d], &numel);
    // Trainable parameters live in the stages, frozen ones in their array
    // when the plan has one.
    const bool frozenArray = inFrozenArray(plan, p);
    const int64_t limit =
        frozenArray ? plan.frozenElements : plan.paramElements;
    if (!ok || numel != p.numel || p.offset < 0 || p.offset > limit - p.numel)
      return invalid(what + " has an inconsistent shape or lies outside the " +
                     str(limit) + (frozenArray ? " frozen" : " parameter") +
                     " elements");
    if (!names.insert(std::string_view(p.name, size_t(p.nameBytes))).second)
      return invalid(what + " has the name of an earlier parameter");
    if (p.numel == 0)
      continue;
    if (frozenArray) {
      byOffset.push_back({p.offset + plan.paramElements, i});
      continue;
    }
    // The stage holding its first element must hold its last.
    const StageInfo *end = plan.stages + plan.numStages;
    const StageInfo *s = std::upper_bound(
        plan.stages, end, p.offset,
        [](int64_t x, const StageInfo &st) { return x < st.offset; });
    --s; // stages tile [0, paramElements), so one starts at or before it
    if (p.offset + p.numel > s->offset + s->elements)
      return invalid(what + " [" + str(p.offset) + ", +" + str(p.numel) +
                     ") crosses the end of stage " + str(s - plan.stages) +
                     " at " + str(s->offset + s->elements));
    byOffset.push_back({p.offset, i});
  }
  std::sort(byOffset.begin(), byOffset.end());
  for (size_t k = 1; k < byOffset.size(); ++k) {
    // Keys place the frozen array after the stages' elements.
    const ParamInfo &a = plan.params[byOffset[k - 1].second];
    const ParamInfo &b = plan.params[byOffset[k].second];
    if (byOffset[k - 1].first + a.numel > byOffset[k].first)
      return invalid("parameters '" + std::string(a.name) + "' and '" + b.name +
                     "' overlap");
  }
  return Status();
}

} // namespace

Status fastllm::rt::validatePlan(const PlanInfo &plan) {
  for (Status (*check)(const PlanInfo &) :
       {validateHeader, validateStages, validateRegions, validateParams})
    if (Status st = check(plan); !st.ok())
      return st;
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

ShardSlice fastllm::rt::shardSlice(const PlanInfo &plan, int32_t stage,
                                   int64_t rank) {
  const StageInfo &s = plan.stages[stage];
  ShardSlice slice;
  slice.elements = s.elements / plan.dataParallel;
  slice.fullOffset = s.offset + rank * slice.elements;
  slice.shardOffset = s.offset / plan.dataParallel;
  return slice;
}
