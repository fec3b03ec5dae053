//===- Zero.cpp - moving ZeRO shards between ranks ------------------------===//

#include "runtime/Zero.h"

#include "runtime/Device.h"
#include "runtime/Plan.h"

#include <algorithm>
#include <cstring>

using namespace fastllm::rt;

Zero::Zero(const PlanInfo &plan, Communicator &comm, ShardComm &shards,
           char *arena)
    : plan(plan), comm(comm), shards(shards), dp(plan.dataParallel),
      rank(comm.rank()), arena(arena), grads(region(plan.gradsOffset)),
      master(region(plan.masterOffset)),
      gradShard(region(plan.gradShardOffset)) {
  table.context = this;
  table.allGather = [](void *self, int32_t stage, int32_t slot) {
    return static_cast<Zero *>(self)->startGather(stage, slot);
  };
  table.reduceScatter = [](void *self, int32_t stage, int32_t slot) {
    return static_cast<Zero *>(self)->startReduce(stage, slot);
  };
  table.wait = [](void *self, int32_t request) {
    static_cast<Zero *>(self)->finish(request);
  };
}

void Zero::shardParams(const float *full) {
  for (int32_t k = 0; k < plan.numStages; ++k) {
    ShardSlice s = shardSlice(plan, k, rank);
    std::memcpy(master + s.shardOffset, full + s.fullOffset,
                s.elements * sizeof(float));
  }
}

void Zero::reduceScatterGrads(float scale) {
  if (dp == 1)
    return deviceScale(gradShard, grads, plan.paramElements, scale);
  std::vector<int32_t> pending(plan.numStages, -1);
  std::vector<InFlight> spans(plan.numStages);
  for (int32_t k = 0; k < plan.numStages; ++k) {
    ShardSlice s = shardSlice(plan, k, 0);
    spans[k] = traced(TraceKind::ReduceScatter, k, s.elements);
    if (s.elements)
      pending[k] = shards.startReduceScatter(
          grads + plan.stages[k].offset, gradShard + s.shardOffset, s.elements);
  }
  for (int32_t k = 0; k < plan.numStages; ++k) {
    if (pending[k] < 0)
      continue;
    shards.wait(pending[k]);
    traceEnd(spans[k], /*fromStep=*/false);
    ShardSlice s = shardSlice(plan, k, 0);
    deviceScale(gradShard + s.shardOffset, gradShard + s.shardOffset,
                s.elements, scale);
  }
}

void Zero::gather(const float *shard, float *full) {
  if (dp == 1)
    return deviceCopy(full, shard, plan.paramElements);
  std::vector<std::pair<int32_t, InFlight>> pending;
  for (int32_t k = 0; k < plan.numStages; ++k) {
    ShardSlice s = shardSlice(plan, k, 0);
    InFlight span = traced(TraceKind::AllGather, k, s.elements);
    if (s.elements)
      pending.push_back(
          {shards.startAllGather(shard + s.shardOffset,
                                 full + plan.stages[k].offset, s.elements),
           span});
  }
  for (auto &[r, span] : pending) {
    shards.wait(r);
    traceEnd(span, /*fromStep=*/false);
  }
}

void Zero::gatherToHost(const float *shard, float *full) {
  synchronizeDevice();
  if (dp == 1) {
    std::memcpy(full, shard, plan.paramElements * sizeof(float));
    return;
  }
  std::vector<Request> pending;
  for (int32_t k = 0; k < plan.numStages; ++k) {
    ShardSlice s = shardSlice(plan, k, 0);
    if (s.elements)
      pending.push_back(comm.iallGather(
          shard + s.shardOffset, full + plan.stages[k].offset, s.elements));
  }
  for (Request &r : pending)
    r.wait();
}

int32_t Zero::track(InFlight op) {
  // Requests are waited in any order; the list empties when all are done.
  if (std::all_of(inFlight.begin(), inFlight.end(),
                  [](const std::optional<InFlight> &f) { return !f; }))
    inFlight.clear();
  inFlight.push_back(op);
  return int32_t(inFlight.size() - 1);
}

Zero::InFlight Zero::traced(TraceKind kind, int32_t stage,
                            int64_t elements) const {
  InFlight op;
  if (tracer) {
    op.start = tracer->now();
    op.kind = kind;
    op.stage = stage;
    // What the counters count: the full buffer; a local copy moves nothing.
    op.bytes = dp > 1 ? elements * dp * int64_t(sizeof(float)) : 0;
  }
  return op;
}

void Zero::traceEnd(const InFlight &op, bool fromStep) {
  if (!tracer || op.start < 0)
    return;
  synchronizeDevice(); // CUDA: the collective and what waited on it are done
  tracer->record(op.kind, op.start, op.stage, op.bytes,
                 op.kind == TraceKind::AllGather ? TraceMoves::Weights
                                                 : TraceMoves::Gradients,
                 fromStep);
}

int32_t Zero::startGather(int32_t stage, int32_t slot) {
  ShardSlice s = shardSlice(plan, stage, 0);
  float *out = region(plan.weightSlots[slot].offset);
  InFlight op = traced(TraceKind::AllGather, stage, s.elements);
  if (dp == 1)
    deviceCopy(out, master + s.shardOffset, s.elements);
  else
    op.request = shards.startAllGather(master + s.shardOffset, out, s.elements);
  return track(op);
}

int32_t Zero::startReduce(int32_t stage, int32_t slot) {
  ShardSlice s = shardSlice(plan, stage, 0);
  float *slotData = region(plan.gradSlots[slot].offset);
  float *shard = gradShard + s.shardOffset;
  InFlight op = traced(TraceKind::ReduceScatter, stage, s.elements);
  if (dp == 1) {
    deviceAddScaled(shard, slotData, s.elements, gradScale);
    return track(op);
  }
  // In place: the slot is busy until the wait, which adds this rank's part
  // (left at the slot's start) into the shard.
  op.request = shards.startReduceScatter(slotData, slotData, s.elements);
  op.add = slotData;
  op.into = shard;
  op.elements = s.elements;
  return track(op);
}

void Zero::finish(int32_t request) {
  std::optional<InFlight> &op = inFlight.at(request);
  if (op->request >= 0)
    shards.wait(op->request);
  if (op->add)
    deviceAddScaled(op->into, op->add, op->elements, gradScale);
  traceEnd(*op, /*fromStep=*/true);
  op.reset();
}
