//===- ShardComm.h - the collectives that move ZeRO shards ------*- C++ -*-===//
//
// ZeRO moves stage shards between ranks with two collectives on arena memory:
// all-gather (every rank's shard into a full buffer) and reduce-scatter (a
// full buffer summed over ranks, this rank's part kept). Where they run
// depends on the target: MPI on host memory for the CPU, NCCL on the GPU for
// CUDA (runtime/Device.h's createShardComm picks). Both count the bytes
// they move in the Communicator's counters (the full buffer per call), so the
// metrics compare with the plan the same way.
//
// A wait makes the result visible to whatever the runtime or the step does
// next on the device: on the CPU it returns when the data is there; on the
// GPU it orders the compute stream after the collective without blocking
// the host.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_SHARDCOMM_H
#define FASTLLM_RUNTIME_SHARDCOMM_H

#include "runtime/Comm.h"

#include <cstdint>
#include <memory>

namespace fastllm::rt {

class ShardComm {
public:
  virtual ~ShardComm() = default;
  /// Starts gathering every rank's `n` elements at `shard` into `full`
  /// (size() * n elements, in rank order); returns the request to wait.
  virtual int32_t startAllGather(const float *shard, float *full,
                                 int64_t n) = 0;
  /// Starts reducing `in` (size() * n elements) over ranks into this rank's
  /// `n` elements at `out`. In place when in == out: the result lands at the
  /// buffer's start.
  virtual int32_t startReduceScatter(const float *in, float *out,
                                     int64_t n) = 0;
  virtual void wait(int32_t request) = 0;
};

/// MPI on host memory (the CPU target).
std::unique_ptr<ShardComm> createMpiShardComm(Communicator &comm);

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_SHARDCOMM_H
