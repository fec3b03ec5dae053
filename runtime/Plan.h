//===- Plan.h - checks and figures of a model's plan ------------*- C++ -*-===//
//
// The PlanInfo comes from generated code, possibly built by another version
// of the compiler: the runtime checks what it relies on before touching the
// arena.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_PLAN_H
#define FASTLLM_RUNTIME_PLAN_H

#include "runtime/ModelABI.h"
#include "runtime/Status.h"

#include <cstdint>

namespace fastllm::rt {

/// Checks everything the runtime relies on, so that a mismatched or corrupt
/// binary fails with a message rather than scribbling over memory:
///  - the ABI version, the target, positive sizes and non-null names;
///  - dataParallel >= 1 and zeroStage 1, 2 or 3, with the full arrays and
///    slot tables that ZeRO stage uses;
///  - the stages tile [0, paramElements) in order, each a multiple of
///    dataParallel * 32 elements with shards MPI can count, each using
///    slots large enough for it;
///  - every region (params or weight slots, grads or gradient slots, the
///    four shards, tokens, targets, activations)
///    lies inside the arena, aligned, and the runtime's regions do not
///    overlap one another or the activations;
///  - every parameter has a consistent shape, a unique name, lies inside one
///    stage and overlaps no other parameter.
Status validatePlan(const PlanInfo &plan);

/// Parameter elements (without the flat arrays' padding), for reports.
struct ParamCounts {
  int64_t total = 0, trainable = 0;
};
ParamCounts countParams(const PlanInfo &plan);

/// Rank `rank`'s shard of stage `stage` of a valid plan: full-array elements
/// [fullOffset, fullOffset + elements) are stored at shard-array elements
/// [shardOffset, shardOffset + elements).
struct ShardSlice {
  int64_t fullOffset = 0, shardOffset = 0, elements = 0;
};
ShardSlice shardSlice(const PlanInfo &plan, int32_t stage, int64_t rank);

/// Whether a parameter lives in the frozen array: a frozen parameter does
/// when the plan has one (the compiler's plans); a plan without one may keep
/// frozen parameters in the stages, where they take shard space but are
/// never updated.
inline bool inFrozenArray(const PlanInfo &plan, const ParamInfo &p) {
  return !p.trainable && plan.frozenElements > 0;
}

/// Elements of each shard array: paramElements / dataParallel.
inline int64_t shardElements(const PlanInfo &plan) {
  return plan.paramElements / plan.dataParallel;
}

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_PLAN_H
