//===- ShardComm.cpp - ZeRO's collectives over MPI ------------------------===//

#include "runtime/ShardComm.h"

#include <vector>

using namespace fastllm::rt;

namespace {
class MpiShardComm final : public ShardComm {
public:
  explicit MpiShardComm(Communicator &comm) : comm(comm) {}

  int32_t startAllGather(const float *shard, float *full, int64_t n) override {
    return track(comm.iallGather(shard, full, n));
  }
  int32_t startReduceScatter(const float *in, float *out, int64_t n) override {
    return track(comm.ireduceScatterSum(in, out, n));
  }
  void wait(int32_t request) override { pending.at(request).wait(); }

private:
  int32_t track(Request r) {
    // Requests are waited in any order; the list empties when all are done.
    bool allDone = true;
    for (Request &p : pending)
      allDone = allDone && p.waited();
    if (allDone)
      pending.clear();
    pending.push_back(std::move(r));
    return int32_t(pending.size() - 1);
  }

  Communicator &comm;
  std::vector<Request> pending;
};
} // namespace

std::unique_ptr<ShardComm> fastllm::rt::createMpiShardComm(Communicator &comm) {
  return std::make_unique<MpiShardComm>(comm);
}
