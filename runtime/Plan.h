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

/// Checks the ABI version, the target and that every region and parameter
/// lies inside the arena, so a mismatched binary fails with a message rather
/// than scribbling over memory.
Status validatePlan(const PlanInfo &plan);

/// Parameter elements (without the flat arrays' padding), for reports.
struct ParamCounts {
  int64_t total = 0, trainable = 0;
};
ParamCounts countParams(const PlanInfo &plan);

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_PLAN_H
