//===- NcclComm.cu - ZeRO's collectives over NCCL, with a watchdog --------===//
//
// One NCCL communicator per job, bootstrapped through MPI (rank 0's unique
// id broadcast), created non-blocking. Collectives run on a communication
// stream of their own: each starts after the compute stream's work so far
// (an event) and records a completion event; a wait orders the compute stream
// after that event without blocking the host, so the step's kernels and the
// collectives overlap as the compiler scheduled them.
//
// A watchdog thread polls every collective in flight. A collective's clock
// starts when it starts on the GPU (an event before it on the communication
// stream), so compute queued ahead of it is not counted. When one outlives
// the timeout, a non-blocking call does not settle within it, or NCCL
// reports an asynchronous error (a peer died), the first thread to see it
// prints `train: error: rank R: step S: <collective> ...` and ends the
// process with exit code 1 (without ncclCommAbort, see fail());
// mpirun then ends the job. Teardown aborts too: finalising would wait for
// peers, and a rank leaving on an error would hang there; a clean run ends
// training with a barrier after its last collective (runtime/Train.cpp), so
// no peer still needs this rank's buffers or sends by then.
//
//===----------------------------------------------------------------------===//

#include "runtime/Device.h"
#include "runtime/cuda/Kernels.cuh"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

using namespace fastllm::rt;

namespace {

using Clock = std::chrono::steady_clock;

/// Waits for a non-blocking NCCL call to leave ncclInProgress, at most
/// `timeout` seconds (then ncclInProgress is returned).
ncclResult_t settle(ncclComm_t comm, ncclResult_t result, double timeout) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout));
  while (result == ncclInProgress && Clock::now() < deadline) {
    ncclCommGetAsyncError(comm, &result);
    // NCCL progresses on its own threads: poll without taking a core.
    if (result == ncclInProgress)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (result == ncclInProgress)
    ncclCommGetAsyncError(comm, &result);
  return result;
}

/// Why a call that did not settle failed.
const char *settleError(ncclResult_t r) {
  return r == ncclInProgress ? "did not start within the collective timeout "
                               "(a peer rank may have died)"
                             : ncclGetErrorString(r);
}

class NcclShardComm final : public ShardComm {
public:
  static Expected<std::unique_ptr<ShardComm>> create(Communicator &mpi,
                                                     double timeoutSeconds);
  ~NcclShardComm() override;

  int32_t startAllGather(const float *shard, float *full, int64_t n) override;
  int32_t startReduceScatter(const float *in, float *out, int64_t n) override;
  void wait(int32_t request) override;

private:
  NcclShardComm(Communicator &mpi, double timeout)
      : mpi(mpi), timeout(timeout) {}

  /// What the watchdog watches. Its clock runs from the moment `begun`
  /// completes (the collective reached the GPU).
  struct InFlight {
    cudaEvent_t begun, done;
    std::optional<Clock::time_point> started;
    const char *what;
    int64_t step;
  };

  /// The compute stream's work so far, then `launch` on the communication
  /// stream, then (once the call has settled) `after`; returns the request.
  template <typename Launch, typename After>
  int32_t start(const char *what, Launch launch, After after);
  void watch();
  [[noreturn]] void fail(const char *what, int64_t step, const char *why);

  Communicator &mpi;
  const double timeout;
  int device = 0; ///< the rank's GPU, which the watchdog thread uses too
  std::atomic<bool> failing{false};
  ncclComm_t comm = nullptr;
  cudaStream_t commStream = nullptr;
  std::mutex lock;
  std::map<int32_t, InFlight> inFlight;
  int32_t nextRequest = 0;
  std::atomic<bool> stopping{false};
  std::condition_variable wake;
  std::thread watchdog;
};

Expected<std::unique_ptr<ShardComm>>
NcclShardComm::create(Communicator &mpi, double timeoutSeconds) {
  std::unique_ptr<NcclShardComm> self(new NcclShardComm(mpi, timeoutSeconds));
  cudaError_t err = cudaGetDevice(&self->device);
  if (err != cudaSuccess)
    return errorf("no current GPU: %s", cudaGetErrorString(err));
  ncclUniqueId id;
  if (mpi.rank() == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      return errorf("NCCL: cannot create the job's unique id: %s",
                    ncclGetErrorString(r));
  }
  mpi.broadcast(&id, sizeof(id), 0);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r =
      ncclCommInitRankConfig(&self->comm, mpi.size(), id, mpi.rank(), &config);
  if ((r = settle(self->comm, r, timeoutSeconds)) != ncclSuccess) {
    if (self->comm)
      ncclCommAbort(self->comm);
    self->comm = nullptr;
    return errorf("NCCL: cannot join the communicator as rank %d of %d: %s",
                  mpi.rank(), mpi.size(), settleError(r));
  }
  err = cudaStreamCreateWithFlags(&self->commStream, cudaStreamNonBlocking);
  if (err != cudaSuccess)
    return errorf("cannot create the communication stream: %s",
                  cudaGetErrorString(err));
  self->watchdog = std::thread([s = self.get()] { s->watch(); });
  return std::unique_ptr<ShardComm>(std::move(self));
}

NcclShardComm::~NcclShardComm() {
  stopping = true;
  wake.notify_all();
  if (watchdog.joinable())
    watchdog.join();
  if (comm) // see the file comment: never waits for peers
    ncclCommAbort(comm);
  for (auto &[id, op] : inFlight) {
    cudaEventDestroy(op.begun);
    cudaEventDestroy(op.done);
  }
  if (commStream)
    cudaStreamDestroy(commStream);
}

template <typename Launch, typename After>
int32_t NcclShardComm::start(const char *what, Launch launch, After after) {
  cudaEvent_t ready, begun, done;
  FASTLLM_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  FASTLLM_CUDA_CHECK(cudaEventCreateWithFlags(&begun, cudaEventDisableTiming));
  FASTLLM_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  FASTLLM_CUDA_CHECK(cudaEventRecord(ready, cuda::stream()));
  FASTLLM_CUDA_CHECK(cudaStreamWaitEvent(commStream, ready, 0));
  FASTLLM_CUDA_CHECK(cudaEventDestroy(ready)); // freed once it completes
  FASTLLM_CUDA_CHECK(cudaEventRecord(begun, commStream));
  // Nothing else may be enqueued on NCCL's stream before the call settles.
  ncclResult_t r = settle(comm, launch(), timeout);
  if (r != ncclSuccess)
    fail(what, mpi.step(), settleError(r));
  after();
  FASTLLM_CUDA_CHECK(cudaEventRecord(done, commStream));
  std::lock_guard<std::mutex> guard(lock);
  int32_t id = nextRequest++;
  inFlight[id] = {begun, done, std::nullopt, what, mpi.step()};
  return id;
}

int32_t NcclShardComm::startAllGather(const float *shard, float *full,
                                      int64_t n) {
  mpi.mutableBytes().allGather += mpi.size() * n * int64_t(sizeof(float));
  return start(
      "all-gather",
      [&] {
        return ncclAllGather(shard, full, size_t(n), ncclFloat, comm,
                             commStream);
      },
      [] {});
}

int32_t NcclShardComm::startReduceScatter(const float *in, float *out,
                                          int64_t n) {
  mpi.mutableBytes().reduceScatter += mpi.size() * n * int64_t(sizeof(float));
  // NCCL's in place leaves rank r's part at r * n; ShardComm's contract is
  // the buffer's start, so that part is moved there once the call settled.
  float *part = in == out ? out + int64_t(mpi.rank()) * n : out;
  return start(
      "reduce-scatter",
      [&] {
        return ncclReduceScatter(in, part, size_t(n), ncclFloat, ncclSum, comm,
                                 commStream);
      },
      [&] {
        if (part != out)
          FASTLLM_CUDA_CHECK(
              cudaMemcpyAsync(out, part, size_t(n) * sizeof(float),
                              cudaMemcpyDeviceToDevice, commStream));
      });
}

void NcclShardComm::wait(int32_t request) {
  std::lock_guard<std::mutex> guard(lock);
  auto it = inFlight.find(request);
  if (it != inFlight.end()) // else it finished and the watchdog retired it
    FASTLLM_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(), it->second.done, 0));
}

void NcclShardComm::watch() {
  // A new thread's current device is GPU 0: using events there would create
  // a context on it from every rank.
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess)
    fail("the watchdog", mpi.step(), cudaGetErrorString(err));
  std::unique_lock<std::mutex> guard(lock);
  while (!stopping) {
    wake.wait_for(guard, std::chrono::milliseconds(100));
    // Finished collectives first, so that an error names the one in flight.
    for (auto it = inFlight.begin(); it != inFlight.end();) {
      if (cudaEventQuery(it->second.done) != cudaSuccess) {
        ++it;
        continue;
      }
      cudaEventDestroy(it->second.begun);
      cudaEventDestroy(it->second.done);
      it = inFlight.erase(it);
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      const InFlight *op =
          inFlight.empty() ? nullptr : &inFlight.begin()->second;
      fail(op ? op->what : "a collective", op ? op->step : mpi.step(),
           ncclGetErrorString(async));
    }
    for (auto it = inFlight.begin(); it != inFlight.end();) {
      InFlight &op = it->second;
      cudaError_t state = cudaEventQuery(op.done);
      if (state == cudaSuccess) {
        cudaEventDestroy(op.begun);
        cudaEventDestroy(op.done);
        it = inFlight.erase(it);
        continue;
      }
      if (state != cudaErrorNotReady) // the GPU failed, not a peer
        fail(op.what, op.step, cudaGetErrorString(state));
      if (!op.started) {
        cudaError_t begun = cudaEventQuery(op.begun);
        if (begun != cudaSuccess && begun != cudaErrorNotReady)
          fail(op.what, op.step, cudaGetErrorString(begun));
        if (begun == cudaSuccess)
          op.started = Clock::now();
        ++it;
        continue;
      }
      double waited =
          std::chrono::duration<double>(Clock::now() - *op.started).count();
      if (waited > timeout) {
        char why[96];
        std::snprintf(why, sizeof(why),
                      "timed out after %g s (a peer rank may have died)",
                      timeout);
        fail(op.what, op.step, why);
      }
      ++it;
    }
  }
}

void NcclShardComm::fail(const char *what, int64_t step, const char *why) {
  if (failing.exchange(true)) // the other thread is reporting and aborting
    for (;;)
      std::this_thread::sleep_for(std::chrono::seconds(1));
  std::fprintf(stderr, "train: error: rank %d: step %lld: %s %s\n", mpi.rank(),
               (long long)step, what, why);
  std::fflush(stderr);
  // No ncclCommAbort: the other thread may be inside an NCCL call on the
  // communicator (freeing it under that call is a use after free), and an
  // abort can itself hang on a broken peer, leaving nothing to end the
  // process. Exiting releases the GPU and the communicator's resources.
  std::_Exit(1); // mpirun ends the other ranks
}

} // namespace

Expected<std::unique_ptr<ShardComm>>
fastllm::rt::createShardComm(Communicator &comm, double timeoutSeconds) {
  if (comm.size() == 1) // one rank moves shards with local copies only
    return createMpiShardComm(comm);
  return NcclShardComm::create(comm, timeoutSeconds);
}
