//===- NcclTest.cpp - the emulated NCCL over MPI, under mpirun ------------===//
//
// Run under `mpirun -np N NcclTest MODE` (N >= 2; nccl_test.py runs every
// mode with 2 and 3 ranks, in both stream modes, FASTLLM_CUDA_EMU_STREAMS=
// inorder and threads):
//
//   all           every check below, in one job:
//                 - all-gather and reduce-scatter, out of place and in place,
//                   several counts and datatypes, against values computed
//                   here; on a non-blocking communicator (the one NcclComm.cu
//                   makes), a blocking one, one whose NCCL ranks reverse the
//                   world's, and a 1-rank one; stream order (threads mode)
//                 - unsupported datatypes, reductions, counts, ranks,
//                   configs and ids rejected, by every rank alike
//                 - ranks given different ids, or the same rank, fail to join
//                 - a collective that a peer never joins: an abort from
//                   another thread (while a third polls
//                   ncclCommGetAsyncError) releases the caller or the stream
//                   promptly, and when the peers join it late, the caller's
//                   buffer stays untouched
//   thread-level  MPI at MPI_THREAD_FUNNELED: joining is ncclInvalidUsage
//   loop T        collectives in a loop with NcclComm.cu's watchdog scheme
//                 (timeout T s), for a driver to kill or stop a rank: a rank
//                 that times out or sees an error prints `rank R: <what>`,
//                 aborts the communicator and exits 1
//   peer-exit     rank 1 dies (SIGKILL) after joining; the others must see
//                 ncclRemoteError (run with mpirun --enable-recovery, which
//                 keeps the job alive)
//
// and alone (no mpirun; a 1-rank communicator): overlap-gather,
// overlap-scatter: a send buffer overlapping the receive buffer other than
// in place must be fatal.
//
// A failed check prints the rank and line and aborts the job.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/emu/Stream.h"

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using fastllm::emu::enqueue;
using fastllm::emu::threadedStreams;

int worldRank = 0, worldSize = 1;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "rank %d: NcclTest.cpp:%d: check failed: %s\n",     \
                   worldRank, __LINE__, #cond);                                \
      std::fflush(stderr);                                                     \
      MPI_Abort(MPI_COMM_WORLD, 2);                                            \
    }                                                                          \
  } while (0)

#define CHECK_RESULT(call, expected)                                           \
  do {                                                                         \
    ncclResult_t got_ = (call);                                                \
    if (got_ != (expected)) {                                                  \
      std::fprintf(stderr,                                                     \
                   "rank %d: NcclTest.cpp:%d: %s returned %d (%s), "           \
                   "expected %s\n",                                            \
                   worldRank, __LINE__, #call, int(got_),                      \
                   ncclGetErrorString(got_), #expected);                       \
      std::fflush(stderr);                                                     \
      MPI_Abort(MPI_COMM_WORLD, 2);                                            \
    }                                                                          \
  } while (0)

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

/// The stream every collective here runs on: the legacy default stream, the
/// one stream every implementation of Stream.h knows without cudart.
const cudaStream_t kStream = nullptr;

/// A future that becomes ready once `s` has run everything enqueued so far.
std::shared_future<void> marker(cudaStream_t s) {
  auto done = std::make_shared<std::promise<void>>();
  std::shared_future<void> f = done->get_future().share();
  enqueue(s, [done] { done->set_value(); });
  return f;
}

void synchronize(cudaStream_t s) { marker(s).wait(); }

/// Polls a call that returned ncclInProgress for at most `timeout` seconds,
/// as NcclComm.cu does.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r, double timeout = 30) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout));
  while (r == ncclInProgress && Clock::now() < deadline)
    CHECK_RESULT(ncclCommGetAsyncError(comm, &r), ncclSuccess);
  return r;
}

/// Rank 0's id, on every rank.
ncclUniqueId sharedId() {
  ncclUniqueId id;
  if (worldRank == 0)
    CHECK_RESULT(ncclGetUniqueId(&id), ncclSuccess);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  return id;
}

/// A communicator of every rank (`rank` in it), settled.
ncclComm_t join(int rank, bool blocking, ncclUniqueId id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, worldSize, id, rank, &config);
  CHECK(comm != nullptr);
  CHECK_RESULT(settle(comm, r), ncclSuccess);
  return comm;
}

/// Runs a collective call to its end: settles it, then waits for its stream.
void finish(ncclComm_t comm, ncclResult_t r) {
  CHECK_RESULT(settle(comm, r), ncclSuccess);
  synchronize(kStream);
  ncclResult_t async;
  CHECK_RESULT(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  CHECK_RESULT(async, ncclSuccess);
}

/// Rank r's i-th element to gather: exact in float.
float gatherValue(int r, size_t i) { return float(1000 * r + int(i % 4096)); }

/// Rank r's j-th element to reduce: small integers, so every sum is exact.
float reduceValue(int r, size_t j) {
  return float((r + 1) * (int(j % 997) - 300));
}

const float kPoison = -12345.0f;

/// All-gather and reduce-scatter on `comm` (NCCL rank `rank` of worldSize),
/// out of place and in place, for `count` elements per rank.
void checkCollectives(ncclComm_t comm, int rank, int nranks, size_t count) {
  const size_t n = size_t(nranks);
  // All-gather, out of place.
  std::vector<float> shard(count), full(n * count, kPoison);
  for (size_t i = 0; i < count; ++i)
    shard[i] = gatherValue(rank, i);
  finish(comm, ncclAllGather(shard.data(), full.data(), count, ncclFloat, comm,
                             kStream));
  for (size_t r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i)
      CHECK(full[r * count + i] == gatherValue(int(r), i));
  // In place: this rank's shard is already at its place in the buffer.
  std::vector<float> inPlace(n * count, kPoison);
  for (size_t i = 0; i < count; ++i)
    inPlace[size_t(rank) * count + i] = gatherValue(rank, i);
  finish(comm, ncclAllGather(inPlace.data() + size_t(rank) * count,
                             inPlace.data(), count, ncclFloat, comm, kStream));
  CHECK(inPlace == full);

  // Reduce-scatter, out of place.
  std::vector<float> in(n * count), part(count, kPoison);
  for (size_t j = 0; j < n * count; ++j)
    in[j] = reduceValue(rank, j);
  std::vector<float> expected(count);
  for (size_t i = 0; i < count; ++i) {
    float sum = 0;
    for (size_t r = 0; r < n; ++r)
      sum += reduceValue(int(r), size_t(rank) * count + i);
    expected[i] = sum;
  }
  std::vector<float> before = in;
  finish(comm, ncclReduceScatter(in.data(), part.data(), count, ncclFloat,
                                 ncclSum, comm, kStream));
  CHECK(part == expected);
  CHECK(in == before); // the input is read only
  // In place: the result lands at this rank's block of the input.
  finish(comm, ncclReduceScatter(in.data(), in.data() + size_t(rank) * count,
                                 count, ncclFloat, ncclSum, comm, kStream));
  CHECK(std::equal(expected.begin(), expected.end(),
                   in.begin() + ptrdiff_t(size_t(rank) * count)));
}

/// An all-gather of bytes (any datatype moves as bytes).
void checkBytes(ncclComm_t comm, int rank, int nranks) {
  const size_t count = 37;
  std::vector<int8_t> shard(count), full(size_t(nranks) * count, 0);
  for (size_t i = 0; i < count; ++i)
    shard[i] = int8_t(rank * 7 - int(i));
  finish(comm, ncclAllGather(shard.data(), full.data(), count, ncclInt8, comm,
                             kStream));
  for (int r = 0; r < nranks; ++r)
    for (size_t i = 0; i < count; ++i)
      CHECK(full[size_t(r) * count + i] == int8_t(r * 7 - int(i)));
  std::vector<double> d(3, rank + 0.5), all(size_t(nranks) * 3);
  finish(comm,
         ncclAllGather(d.data(), all.data(), 3, ncclDouble, comm, kStream));
  for (int r = 0; r < nranks; ++r)
    CHECK(all[size_t(r) * 3 + 2] == r + 0.5);
}

/// Several collectives issued before any is waited (threads mode: they queue
/// on the stream), the first after slow work on the stream that writes its
/// input: stream order.
void checkStreamOrder(ncclComm_t comm, int rank, int nranks) {
  const size_t count = 1000, n = size_t(nranks);
  std::vector<float> shard(count, kPoison), full(n * count, kPoison);
  std::vector<float> in(n * count), part(count, kPoison);
  for (size_t j = 0; j < n * count; ++j)
    in[j] = reduceValue(rank, j);
  float *s = shard.data();
  enqueue(kStream, [s, rank, size = shard.size()] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (size_t i = 0; i < size; ++i)
      s[i] = gatherValue(rank, i);
  });
  CHECK_RESULT(settle(comm, ncclAllGather(shard.data(), full.data(), count,
                                          ncclFloat, comm, kStream)),
               ncclSuccess);
  CHECK_RESULT(
      settle(comm, ncclReduceScatter(in.data(), part.data(), count, ncclFloat,
                                     ncclSum, comm, kStream)),
      ncclSuccess);
  synchronize(kStream);
  for (size_t r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i)
      CHECK(full[r * count + i] == gatherValue(int(r), i));
  for (size_t i = 0; i < count; ++i) {
    float sum = 0;
    for (size_t r = 0; r < n; ++r)
      sum += reduceValue(int(r), size_t(rank) * count + i);
    CHECK(part[i] == sum);
  }
}

/// Inorder, non-blocking: a call before the previous one settled is
/// ncclInvalidUsage. The peers arrive late, so the first call is in progress.
void checkUnsettled(ncclComm_t comm, int rank, int nranks) {
  const size_t count = 10;
  std::vector<float> shard(count, float(rank)), full(size_t(nranks) * count);
  if (rank != 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ncclResult_t r =
      ncclAllGather(shard.data(), full.data(), count, ncclFloat, comm, kStream);
  if (rank == 0) {
    CHECK_RESULT(r, ncclInProgress);
    CHECK_RESULT(ncclAllGather(shard.data(), full.data(), count, ncclFloat,
                               comm, kStream),
                 ncclInvalidUsage);
  }
  finish(comm, r);
  for (int q = 0; q < nranks; ++q)
    CHECK(full[size_t(q) * count] == float(q));
}

void testCollectives() {
  const size_t counts[] = {1, 3, 1000, 100003};
  {
    ncclComm_t comm = join(worldRank, false, sharedId()); // NcclComm.cu's
    for (size_t count : counts)
      checkCollectives(comm, worldRank, worldSize, count);
    checkBytes(comm, worldRank, worldSize);
    checkStreamOrder(comm, worldRank, worldSize);
    if (!threadedStreams())
      checkUnsettled(comm, worldRank, worldSize);
    // A count of 0 moves nothing, and needs no peer.
    CHECK_RESULT(ncclAllGather(nullptr, nullptr, 0, ncclFloat, comm, kStream),
                 ncclSuccess);
    CHECK_RESULT(ncclCommDestroy(comm), ncclSuccess);
  }
  {
    ncclComm_t comm = join(worldRank, true, sharedId());
    checkCollectives(comm, worldRank, worldSize, 1000);
    checkStreamOrder(comm, worldRank, worldSize);
    CHECK_RESULT(ncclCommDestroy(comm), ncclSuccess);
  }
  {
    // NCCL ranks in reverse world order.
    int rank = worldSize - 1 - worldRank;
    ncclComm_t comm = join(rank, false, sharedId());
    checkCollectives(comm, rank, worldSize, 3);
    checkCollectives(comm, rank, worldSize, 1000);
    checkBytes(comm, rank, worldSize);
    CHECK_RESULT(ncclCommDestroy(comm), ncclSuccess);
  }
  {
    // A communicator of this process alone, with an id of its own.
    ncclUniqueId id;
    CHECK_RESULT(ncclGetUniqueId(&id), ncclSuccess);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    CHECK_RESULT(settle(comm, ncclCommInitRankConfig(&comm, 1, id, 0, &config)),
                 ncclSuccess);
    checkCollectives(comm, 0, 1, 1000);
    CHECK_RESULT(ncclCommDestroy(comm), ncclSuccess);
  }
  if (worldRank == 0)
    std::printf("collectives: ok\n");
}

void testRejected() {
  ncclUniqueId id = sharedId();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  // Each of these fails before any communication.
  CHECK_RESULT(ncclGetUniqueId(nullptr), ncclInvalidArgument);
  CHECK_RESULT(
      ncclCommInitRankConfig(nullptr, worldSize, id, worldRank, &config),
      ncclInvalidArgument);
  CHECK_RESULT(ncclCommInitRankConfig(&comm, 0, id, 0, &config),
               ncclInvalidArgument);
  CHECK_RESULT(ncclCommInitRankConfig(&comm, worldSize, id, -1, &config),
               ncclInvalidArgument);
  CHECK_RESULT(ncclCommInitRankConfig(&comm, worldSize, id, worldSize, &config),
               ncclInvalidArgument);
  CHECK(comm == nullptr);
  {
    ncclConfig_t bad = config;
    bad.magic = 0;
    CHECK_RESULT(ncclCommInitRankConfig(&comm, worldSize, id, worldRank, &bad),
                 ncclInvalidArgument);
    bad = config;
    bad.size = sizeof(ncclConfig_t) - 8;
    CHECK_RESULT(ncclCommInitRankConfig(&comm, worldSize, id, worldRank, &bad),
                 ncclInvalidArgument);
    bad = config;
    bad.version = 22005;
    CHECK_RESULT(ncclCommInitRankConfig(&comm, worldSize, id, worldRank, &bad),
                 ncclInvalidArgument);
    std::memset(&bad, 0, sizeof(bad)); // not from the initializer
    CHECK_RESULT(ncclCommInitRankConfig(&comm, worldSize, id, worldRank, &bad),
                 ncclInvalidArgument);
    bad = config;
    bad.blocking = 2;
    CHECK_RESULT(ncclCommInitRankConfig(&comm, worldSize, id, worldRank, &bad),
                 ncclInvalidArgument);
  }
  ncclUniqueId zero;
  std::memset(&zero, 0, sizeof(zero));
  CHECK_RESULT(
      ncclCommInitRankConfig(&comm, worldSize, zero, worldRank, &config),
      ncclInvalidArgument);
  CHECK(std::strlen(ncclGetLastError(nullptr)) > 0);
  // Every process of MPI_COMM_WORLD, or this one alone.
  CHECK_RESULT(
      ncclCommInitRankConfig(&comm, worldSize + 1, id, worldRank, &config),
      ncclInvalidUsage);
  CHECK(comm == nullptr);

  comm = join(worldRank, false, id);
  float a[8] = {}, b[64] = {};
  CHECK_RESULT(ncclReduceScatter(b, a, 2, ncclDouble, ncclSum, comm, kStream),
               ncclInvalidArgument);
  CHECK_RESULT(ncclReduceScatter(b, a, 2, ncclInt32, ncclSum, comm, kStream),
               ncclInvalidArgument);
  CHECK_RESULT(ncclReduceScatter(b, a, 2, ncclFloat, ncclMax, comm, kStream),
               ncclInvalidArgument);
  CHECK_RESULT(ncclReduceScatter(b, a, 2, ncclFloat, ncclAvg, comm, kStream),
               ncclInvalidArgument);
  CHECK_RESULT(ncclReduceScatter(b, a, 2, ncclFloat, ncclRedOp_t(ncclNumOps),
                                 comm, kStream),
               ncclInvalidArgument);
  CHECK_RESULT(ncclReduceScatter(b, a, 2, ncclDataType_t(ncclNumTypes), ncclSum,
                                 comm, kStream),
               ncclInvalidArgument);
  CHECK_RESULT(
      ncclAllGather(a, b, 2, ncclDataType_t(ncclNumTypes), comm, kStream),
      ncclInvalidArgument);
  CHECK_RESULT(ncclAllGather(a, b, 2, ncclDataType_t(-1), comm, kStream),
               ncclInvalidArgument);
  CHECK_RESULT(ncclAllGather(nullptr, b, 2, ncclFloat, comm, kStream),
               ncclInvalidArgument);
  CHECK_RESULT(
      ncclReduceScatter(b, nullptr, 2, ncclFloat, ncclSum, comm, kStream),
      ncclInvalidArgument);
  CHECK_RESULT(
      ncclAllGather(a, b, size_t(INT_MAX) + 1, ncclFloat, comm, kStream),
      ncclInvalidArgument);
  CHECK_RESULT(ncclAllGather(a, b, SIZE_MAX / 2, ncclFloat, comm, kStream),
               ncclInvalidArgument);
  CHECK_RESULT(ncclAllGather(a, b, 2, ncclFloat, nullptr, kStream),
               ncclInvalidArgument);
  ncclResult_t async;
  CHECK_RESULT(ncclCommGetAsyncError(nullptr, &async), ncclInvalidArgument);
  CHECK_RESULT(ncclCommGetAsyncError(comm, nullptr), ncclInvalidArgument);
  CHECK_RESULT(ncclCommAbort(nullptr), ncclInvalidArgument);
  CHECK_RESULT(ncclCommDestroy(nullptr), ncclInvalidArgument);
  // None of them broke the communicator.
  checkCollectives(comm, worldRank, worldSize, 5);
  CHECK_RESULT(ncclCommDestroy(comm), ncclSuccess);

  for (int r = 0; r < int(ncclNumResults); ++r)
    CHECK(std::strlen(ncclGetErrorString(ncclResult_t(r))) > 0);
  CHECK(std::strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0);
  if (worldRank == 0)
    std::printf("rejected: ok\n");
}

void testMismatch() {
  // Every rank makes an id of its own: each must fail to join.
  for (int blocking = 0; blocking < 2; ++blocking) {
    ncclUniqueId own;
    CHECK_RESULT(ncclGetUniqueId(&own), ncclSuccess);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = blocking;
    ncclComm_t comm = nullptr;
    ncclResult_t r =
        ncclCommInitRankConfig(&comm, worldSize, own, worldRank, &config);
    if (blocking) {
      CHECK_RESULT(r, ncclInvalidUsage);
      CHECK(comm == nullptr);
    } else {
      CHECK(comm != nullptr);
      CHECK_RESULT(settle(comm, r), ncclInvalidUsage);
      CHECK(std::strstr(ncclGetLastError(comm), "different unique ids"));
      // A failed communicator takes no collective.
      float x = 0, y[8];
      CHECK_RESULT(ncclAllGather(&x, y, 1, ncclFloat, comm, kStream),
                   ncclInvalidUsage);
      CHECK_RESULT(ncclCommAbort(comm), ncclSuccess);
    }
  }
  // The same id, but every rank claims rank 0.
  {
    ncclUniqueId id = sharedId();
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, worldSize, id, 0, &config);
    CHECK_RESULT(settle(comm, r), ncclInvalidUsage);
    CHECK(std::strstr(ncclGetLastError(comm), "both joined as rank 0"));
    CHECK_RESULT(ncclCommDestroy(comm), ncclSuccess);
  }
  if (worldRank == 0)
    std::printf("mismatch: ok\n");
}

/// Rank 0 starts an all-gather that the others join only later; a watchdog
/// thread aborts it while a third thread polls ncclCommGetAsyncError. The
/// abort must release rank 0 promptly, and the late peers' completion of the
/// abandoned collective must not write to rank 0's buffer.
void testAbort(bool blocking) {
  ncclComm_t comm = join(worldRank, blocking, sharedId());
  const size_t count = 4096;
  std::vector<float> shard(count, float(worldRank + 1));
  std::vector<float> full(size_t(worldSize) * count, kPoison);
  MPI_Barrier(MPI_COMM_WORLD);
  if (worldRank == 0) {
    const Clock::time_point start = Clock::now();
    std::atomic<bool> aborted{false};
    Clock::time_point abortedAt{};
    double abortTook = 0;
    std::thread watchdog([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      abortedAt = Clock::now();
      CHECK_RESULT(ncclCommAbort(comm), ncclSuccess);
      abortTook = seconds(Clock::now() - abortedAt);
      aborted = true;
    });
    // Polls throughout, as NcclComm.cu's watchdog does, across the abort.
    std::atomic<bool> stop{false};
    std::thread poller([&] {
      while (!stop) {
        ncclResult_t async;
        CHECK_RESULT(ncclCommGetAsyncError(comm, &async), ncclSuccess);
        // (ncclInvalidUsage once aborted)
        CHECK(async == ncclSuccess || async == ncclInProgress ||
              async == ncclInvalidUsage);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    ncclResult_t r = ncclAllGather(shard.data(), full.data(), count, ncclFloat,
                                   comm, kStream);
    double released;
    if (threadedStreams()) {
      CHECK_RESULT(r, ncclSuccess); // the stream waits, not the caller
      std::shared_future<void> done = marker(kStream);
      CHECK(done.wait_for(std::chrono::milliseconds(300)) ==
            std::future_status::timeout);
      done.wait();
      released = seconds(Clock::now() - abortedAt);
    } else if (!blocking) {
      CHECK_RESULT(r, ncclInProgress);
      r = settle(comm, r, 0.3);
      CHECK_RESULT(r, ncclInProgress); // nobody came
      while (r == ncclInProgress)
        CHECK_RESULT(ncclCommGetAsyncError(comm, &r), ncclSuccess);
      CHECK_RESULT(r, ncclInvalidUsage); // what an aborted comm reports
      released = seconds(Clock::now() - abortedAt);
    } else {
      CHECK_RESULT(r, ncclInvalidUsage); // the call itself waited
      released = seconds(Clock::now() - abortedAt);
    }
    watchdog.join();
    stop = true;
    poller.join();
    CHECK(aborted);
    CHECK(released >= 0 && released < 0.2);
    CHECK(abortTook < 0.1);
    std::printf("abort (%s, %s streams): the abort took %.4f s, released the "
                "%s %.4f s after it (%.2f s after the call)\n",
                blocking ? "blocking" : "non-blocking",
                threadedStreams() ? "threads" : "inorder", abortTook,
                threadedStreams() ? "stream" : "caller", released,
                seconds(Clock::now() - start));
    // After an abort: no collective, and the error stays.
    CHECK_RESULT(ncclAllGather(shard.data(), full.data(), count, ncclFloat,
                               comm, kStream),
                 ncclInvalidUsage);
    ncclResult_t async;
    CHECK_RESULT(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    CHECK_RESULT(async, ncclInvalidUsage);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (worldRank != 0) { // the late peers complete the abandoned collective
    finish(comm, ncclAllGather(shard.data(), full.data(), count, ncclFloat,
                               comm, kStream));
    for (int r = 0; r < worldSize; ++r)
      CHECK(full[size_t(r) * count] == float(r + 1));
    CHECK_RESULT(ncclCommDestroy(comm), ncclSuccess);
  }
  MPI_Barrier(MPI_COMM_WORLD); // rank 0's MPI completes its part in here
  if (worldRank == 0)
    for (float v : full)
      CHECK(v == kPoison);
}

void testThreadLevel() {
  ncclUniqueId id = sharedId();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclComm_t comm = nullptr;
  CHECK_RESULT(ncclCommInitRankConfig(&comm, worldSize, id, worldRank, &config),
               ncclInvalidUsage);
  CHECK(std::strstr(ncclGetLastError(nullptr), "MPI_THREAD_MULTIPLE"));
  CHECK(comm == nullptr);
  if (worldRank == 0)
    std::printf("thread level: ok\n");
}

/// NcclComm.cu's scheme: a watchdog thread polling the communicator, each
/// collective settled within the timeout and its stream completing within
/// it. Ends the process with exit code 1 on the first failure.
[[noreturn]] void loop(double timeout) {
  ncclComm_t comm = join(worldRank, false, sharedId());
  std::atomic<bool> failing{false};
  auto fail = [&](const char *what, const char *why) {
    if (failing.exchange(true))
      for (;;)
        std::this_thread::sleep_for(std::chrono::seconds(1));
    std::fprintf(stderr, "rank %d: %s %s\n", worldRank, what, why);
    std::fflush(stderr);
    const Clock::time_point before = Clock::now();
    ncclCommAbort(comm);
    std::fprintf(stderr, "rank %d: the abort took %.4f s\n", worldRank,
                 seconds(Clock::now() - before));
    std::fflush(stderr);
    std::_Exit(1);
  };
  std::thread watchdog([&] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ncclResult_t async;
      ncclCommGetAsyncError(comm, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        fail("the communicator", ncclGetErrorString(async));
    }
  });
  watchdog.detach();
  const size_t count = 1 << 14;
  std::vector<float> shard(count, 1), full(size_t(worldSize) * count);
  std::printf("rank %d: pid %d\n", worldRank, int(getpid()));
  std::fflush(stdout);
  char why[64];
  std::snprintf(why, sizeof(why), "timed out after %g s", timeout);
  for (long i = 0;; ++i) {
    ncclResult_t r;
    const char *what = i % 2 ? "reduce-scatter" : "all-gather";
    if (i % 2)
      r = ncclReduceScatter(full.data(), shard.data(), count, ncclFloat,
                            ncclSum, comm, kStream);
    else
      r = ncclAllGather(shard.data(), full.data(), count, ncclFloat, comm,
                        kStream);
    r = settle(comm, r, timeout);
    if (r == ncclInProgress)
      fail(what, why);
    if (r != ncclSuccess)
      fail(what, ncclGetErrorString(r));
    if (marker(kStream).wait_for(std::chrono::duration<double>(timeout)) !=
        std::future_status::ready)
      fail(what, why);
    std::fill(shard.begin(), shard.end(), 1.0f);
    if (i % 1000 == 0 && worldRank == 0) {
      std::printf("loop: %ld collectives\n", i);
      std::fflush(stdout);
    }
  }
}

/// Rank 1 dies after joining; the others must see ncclRemoteError.
void peerExit() {
  ncclComm_t comm = join(worldRank, false, sharedId());
  MPI_Barrier(MPI_COMM_WORLD);
  if (worldRank == 1)
    raise(SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::vector<float> shard(16, 1), full(size_t(worldSize) * 16);
  const Clock::time_point start = Clock::now();
  ncclResult_t r =
      ncclAllGather(shard.data(), full.data(), 16, ncclFloat, comm, kStream);
  r = settle(comm, r, 10);
  if (threadedStreams() && r == ncclSuccess) { // the stream is waiting
    while (seconds(Clock::now() - start) < 10) {
      CHECK_RESULT(ncclCommGetAsyncError(comm, &r), ncclSuccess);
      if (r != ncclSuccess)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    synchronize(kStream); // the failed collective released its stream
  }
  std::printf("rank %d: %s after %.2f s: %s\n", worldRank,
              r == ncclRemoteError ? "PASS" : "FAIL",
              seconds(Clock::now() - start), ncclGetErrorString(r));
  std::fflush(stdout);
  ncclCommAbort(comm);
  std::_Exit(r == ncclRemoteError ? 0 : 1); // finalising would wait for rank 1
}

/// Alone: a send buffer that overlaps the receive buffer out of place.
void overlapping(bool gather) {
  ncclUniqueId id;
  CHECK_RESULT(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  CHECK_RESULT(ncclCommInitRankConfig(&comm, 1, id, 0, nullptr), ncclSuccess);
  float buffer[16] = {};
  // In place is fine on one rank: the send buffer is the receive buffer.
  CHECK_RESULT(ncclAllGather(buffer, buffer, 8, ncclFloat, comm, kStream),
               ncclSuccess);
  CHECK_RESULT(
      ncclReduceScatter(buffer, buffer, 8, ncclFloat, ncclSum, comm, kStream),
      ncclSuccess);
  std::fprintf(stderr, "expecting a fatal error:\n");
  if (gather)
    ncclAllGather(buffer + 1, buffer, 8, ncclFloat, comm, kStream);
  else
    ncclReduceScatter(buffer, buffer + 1, 8, ncclFloat, ncclSum, comm, kStream);
  std::fprintf(stderr, "the overlap was not reported\n");
  std::exit(3);
}

} // namespace

int main(int argc, char **argv) {
  std::string mode = argc > 1 ? argv[1] : "all";
  if (mode == "overlap-gather" || mode == "overlap-scatter") {
    overlapping(mode == "overlap-gather");
    return 3;
  }
  const int wanted =
      mode == "thread-level" ? MPI_THREAD_FUNNELED : MPI_THREAD_MULTIPLE;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, wanted, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &worldRank);
  MPI_Comm_size(MPI_COMM_WORLD, &worldSize);
  CHECK(provided >= wanted);
  CHECK(worldSize >= 2);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (mode == "all") {
    testCollectives();
    testRejected();
    testMismatch();
    testAbort(false);
    testAbort(true);
  } else if (mode == "thread-level") {
    testThreadLevel();
  } else if (mode == "loop") {
    loop(argc > 2 ? std::atof(argv[2]) : 5);
  } else if (mode == "peer-exit") {
    peerExit();
  } else {
    if (worldRank == 0)
      std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (worldRank == 0)
    std::printf("NcclTest %s: PASS (%d ranks, %s streams)\n", mode.c_str(),
                worldSize, threadedStreams() ? "threads" : "inorder");
  MPI_Finalize();
  return 0;
}
