//===- Zero.h - moving ZeRO shards between ranks ----------------*- C++ -*-===//
//
// The moves between the full-size buffers the step uses and this rank's
// shards (docs/DESIGN.md section 3): stage k's shard of rank r is full[offset_k
// + r * e_k / dp, + e_k / dp) <-> shard[offset_k / dp, + e_k / dp). With dp = 1
// the shard is the whole stage and the moves are local copies that
// communicate (and count) nothing. Collectives go through the target's
// ShardComm and elementwise work through runtime/Device.h, so on a GPU all
// of it stays on the device, in order with the step.
//
// ZeRO-1 reduces the full gradients once per step (reduceScatterGrads) and
// ZeRO-1/2 gather the updated weights into the full params once per step
// (gather). ZeRO-2/3 steps call back through collectives(): they gather a
// stage's weights into a slot (ZeRO-3) and reduce a gradient slot into the
// shard, accumulating the mean over ranks and micro-batches.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_ZERO_H
#define FASTLLM_RUNTIME_ZERO_H

#include "runtime/Comm.h"
#include "runtime/ModelABI.h"
#include "runtime/ShardComm.h"
#include "runtime/Trace.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace fastllm::rt {

class Zero {
public:
  Zero(const PlanInfo &plan, Communicator &comm, ShardComm &shards,
       char *arena);
  Zero(const Zero &) = delete;
  Zero &operator=(const Zero &) = delete;

  /// The table the generated step calls (ZeRO-2/3).
  const Collectives *collectives() const { return &table; }
  /// The scale the step's reduce-scatters apply: 1 / (dp * micro-batches).
  void setGradScale(float scale) { gradScale = scale; }
  /// Records every collective from its start to the return of its wait in
  /// `tracer` (null: none), until set again.
  void setTracer(Tracer *t) { tracer = t; }

  /// master = this rank's shard of `full` (the initial weights, host code
  /// before the first step).
  void shardParams(const float *full);
  /// ZeRO-1: gradShard = this rank's shard of the sum over ranks of grads,
  /// times `scale`. Every stage's reduce-scatter is in flight at once.
  void reduceScatterGrads(float scale);
  /// full = every rank's shard, in arena memory (the params after an
  /// update).
  void gather(const float *shard, float *full);
  /// The same into host memory (the reduced gradients for a dump, ZeRO-3's
  /// weights to save), over MPI once the device is done.
  void gatherToHost(const float *shard, float *full);

private:
  float *region(int64_t offset) const {
    return offset < 0 ? nullptr : reinterpret_cast<float *>(arena + offset);
  }

  /// A collective the step started (-1: a local copy, already done) and,
  /// for a reduce-scatter, where its wait adds the result.
  struct InFlight {
    int32_t request = -1;
    const float *add = nullptr;
    float *into = nullptr;
    int64_t elements = 0;
    /// Tracing: when it started (-1: not traced), what and where.
    int64_t start = -1;
    TraceKind kind = TraceKind::AllGather;
    int32_t stage = -1;
    int64_t bytes = 0;
  };
  /// A traced collective of `stage` (`elements` per rank) starting now, or
  /// an untraced one.
  InFlight traced(TraceKind kind, int32_t stage, int64_t elements) const;
  /// Records the collective that just completed (nothing when untraced).
  void traceEnd(const InFlight &op, bool fromStep);
  int32_t track(InFlight op);
  int32_t startGather(int32_t stage, int32_t slot);
  int32_t startReduce(int32_t stage, int32_t slot);
  void finish(int32_t request);

  const PlanInfo &plan;
  Communicator &comm;
  ShardComm &shards;
  const int64_t dp, rank;
  char *arena;
  float *grads, *master, *gradShard;
  Collectives table;
  float gradScale = 1.0f;
  Tracer *tracer = nullptr;
  std::vector<std::optional<InFlight>> inFlight;
};

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_ZERO_H
