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
  for (int32_t k = 0; k < plan.numStages; ++k) {
    ShardSlice s = shardSlice(plan, k, 0);
    if (s.elements)
      pending[k] = shards.startReduceScatter(
          grads + plan.stages[k].offset, gradShard + s.shardOffset, s.elements);
  }
  for (int32_t k = 0; k < plan.numStages; ++k) {
    if (pending[k] < 0)
      continue;
    shards.wait(pending[k]);
    ShardSlice s = shardSlice(plan, k, 0);
    deviceScale(gradShard + s.shardOffset, gradShard + s.shardOffset,
                s.elements, scale);
  }
}

void Zero::gather(const float *shard, float *full) {
  if (dp == 1)
    return deviceCopy(full, shard, plan.paramElements);
  std::vector<int32_t> pending;
  for (int32_t k = 0; k < plan.numStages; ++k) {
    ShardSlice s = shardSlice(plan, k, 0);
    if (s.elements)
      pending.push_back(shards.startAllGather(
          shard + s.shardOffset, full + plan.stages[k].offset, s.elements));
  }
  for (int32_t r : pending)
    shards.wait(r);
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

int32_t Zero::startGather(int32_t stage, int32_t slot) {
  ShardSlice s = shardSlice(plan, stage, 0);
  float *out = region(plan.weightSlots[slot].offset);
  if (dp == 1) {
    deviceCopy(out, master + s.shardOffset, s.elements);
    return track({});
  }
  return track(
      {shards.startAllGather(master + s.shardOffset, out, s.elements)});
}

int32_t Zero::startReduce(int32_t stage, int32_t slot) {
  ShardSlice s = shardSlice(plan, stage, 0);
  float *slotData = region(plan.gradSlots[slot].offset);
  float *shard = gradShard + s.shardOffset;
  if (dp == 1) {
    deviceAddScaled(shard, slotData, s.elements, gradScale);
    return track({});
  }
  // In place: the slot is busy until the wait, which adds this rank's part
  // (left at the slot's start) into the shard.
  return track({shards.startReduceScatter(slotData, slotData, s.elements),
                slotData, shard, s.elements});
}

void Zero::finish(int32_t request) {
  std::optional<InFlight> &op = inFlight.at(request);
  if (op->request >= 0)
    shards.wait(op->request);
  if (op->add)
    deviceAddScaled(op->into, op->add, op->elements, gradScale);
  op.reset();
}
