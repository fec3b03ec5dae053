//===- Nccl.cpp - NCCL over MPI for the CUDA emulation
//---------------------===//
//
// The part of NCCL that runtime/cuda/NcclComm.cu uses, declared by the CUDA
// toolkit's own nccl.h, for the emulated CUDA build: one process per rank
// under mpirun, every collective carried by a non-blocking MPI collective.
//
// Ids and communicators. ncclGetUniqueId makes an id of a magic string and
// 128 random bits; the caller hands it to every rank (NcclComm.cu broadcasts
// rank 0's). ncclCommInitRankConfig needs MPI initialised at
// MPI_THREAD_MULTIPLE (collectives are polled from stream and watchdog
// threads while the main thread uses MPI too) and nranks equal to the size of
// MPI_COMM_WORLD: a communicator holds every process mpirun started (nranks
// == 1 is a communicator of this process alone, without MPI). Joining is two
// non-blocking steps on MPI_COMM_WORLD, so concurrent inits must be made in
// the same order on every process:
//   1. MPI_Comm_idup: the communicator's own MPI context;
//   2. MPI_Iallgather of each process's hello: its id, nranks and rank, and
//      what identifies the process (pid, start time, boot id, pid namespace)
//      to notice that it died.
// Every process then checks the same table: one id on every process (else
// ncclInvalidUsage everywhere: the ranks were given different ids), and the
// ranks a permutation of 0..nranks-1. The NCCL rank need not be the world
// rank: the permutation is applied when copying through the staging buffer
// (below), so no blocking MPI_Comm_split is needed. A blocking init polls
// these steps to the end; a non-blocking one (config.blocking = 0) returns
// ncclInProgress and advances whenever ncclCommGetAsyncError is called.
//
// Collectives. ncclAllGather takes any built-in datatype (moved as bytes);
// ncclReduceScatter takes ncclFloat with ncclSum; anything else is rejected
// with ncclInvalidArgument, as is a count above INT_MAX (MPI's). A count of
// 0 is a no-op, as in NCCL. Each collective copies its input into a staging
// buffer of its own, runs MPI_Iallgather or MPI_Ireduce_scatter_block in
// place there and copies the result out once MPI_Test reports it complete.
// Staging costs a copy each way; it keeps MPI away from the caller's buffers
// after an abort (MPI cannot cancel a collective) and applies the rank
// permutation. In place is NCCL's: all-gather when sendbuff == recvbuff +
// rank * sendcount, reduce-scatter when recvbuff == sendbuff + rank *
// recvcount (both in elements); any other overlap of the two buffers is
// undefined on a GPU and fatal here.
//
// Streams. In `threads` mode a collective is a work item of its stream that
// starts the MPI collective and polls it to the end: the call returns at
// once, later work on the stream waits for it like a kernel, and a hung
// peer leaves the stream's later events incomplete for a watchdog to see. In
// `inorder` mode work runs on the calling thread at once, so a collective
// that waited inside the call would block the host with every event already
// complete: nothing could time it out. There a non-blocking communicator's
// collective starts the MPI collective and returns ncclInProgress until it
// completes, which ncclCommGetAsyncError reports (NcclComm.cu's settle()
// polls it, with its timeout); NCCL's contract for ncclInProgress (no other
// call on the stream or communicator before it settles) stands in for the
// stream order, and another NCCL call before then is ncclInvalidUsage. A
// blocking communicator's collective waits in the call in inorder mode.
//
// Errors. Every error returned is printed as `cuda emulation: NCCL: ...` on
// stderr and kept for ncclGetLastError. A collective that fails in flight
// (an MPI error, or a peer process that died) breaks the communicator:
// ncclCommGetAsyncError reports it from then on (ncclRemoteError, or
// ncclSystemError when an MPI call failed to start), and later collectives
// return it. MPI itself does not notice a dead peer (a collective with one
// just never completes), so the peers on this machine are looked up while a
// collective has waited for over a second, every half second: a peer whose
// /proc entry is gone, a zombie's or another process's has died (after one
// last test of the collective, in case it left once its part was done).
// Under Open MPI's mpirun a rank killed by a signal usually ends the whole
// job within a second or two anyway; this covers the rest (mpirun
// --enable-recovery, other launchers) and names the rank. A stopped peer
// (SIGSTOP) is not an error, as in NCCL: the collective waits until the
// caller times out and aborts, and the abort names the peers on this
// machine that are stopped or gone.
//
// Abort and destroy. ncclCommAbort marks the communicator aborted and waits
// for whichever thread is polling it to finish its current step (a test or a
// copy, never a wait), so once it returns nothing touches the caller's
// buffers; pollers then give up (a collective waiting on a stream thread
// returns, its result unwritten). Nothing is freed: MPI may still use the
// staging buffers and the MPI communicator, and another thread may still
// call ncclCommGetAsyncError (which then reports the error, or
// ncclInvalidUsage); only the idle stage buffers kept for reuse are freed.
// ncclCommDestroy waits for the collectives in flight, then frees the MPI
// communicator. Communicator objects themselves are never freed (a few
// hundred bytes each), so a use after destroy, a second abort or a destroy
// after an abort (double frees on a GPU) are reported as fatal instead of
// being undefined.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/emu/Stream.h"

#define OMPI_SKIP_MPICXX 1 // MPI's C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using fastllm::emu::fatal;

namespace {

using Clock = std::chrono::steady_clock;

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

/// ncclGetLastError's message. Plain storage and a leaked lock: a stream
/// thread may still report while the process exits.
char lastError[1024];
std::mutex &lastErrorLock = *new std::mutex;

/// This process's rank in MPI_COMM_WORLD, or -1 without MPI.
int worldRank() {
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized)
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

/// Formats a message, keeps it for ncclGetLastError, prints it to stderr as
/// `cuda emulation: NCCL: rank R: ...` for a communicator's rank R, or
/// `cuda emulation: NCCL: world rank W: ...` when `rank` is kWorld, and
/// returns `result`.
constexpr int kWorld = -1;
__attribute__((format(printf, 3, 4))) ncclResult_t
report(ncclResult_t result, int rank, const char *format, ...) {
  char message[sizeof(lastError)];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  {
    std::lock_guard<std::mutex> guard(lastErrorLock);
    std::memcpy(lastError, message, sizeof(lastError));
  }
  int world = rank == kWorld ? worldRank() : -1;
  if (rank >= 0)
    std::fprintf(stderr, "cuda emulation: NCCL: rank %d: %s\n", rank, message);
  else if (world >= 0)
    std::fprintf(stderr, "cuda emulation: NCCL: world rank %d: %s\n", world,
                 message);
  else
    std::fprintf(stderr, "cuda emulation: NCCL: %s\n", message);
  std::fflush(stderr);
  return result;
}

/// The MPI error `code`'s description.
std::string mpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, size_t(length));
}

//===----------------------------------------------------------------------===//
// Unique ids and the processes behind the ranks
//===----------------------------------------------------------------------===//

/// What an id made by ncclGetUniqueId starts with.
constexpr char kIdMagic[] = "fastllm-emu-nccl-id";

struct IdLayout {
  char magic[sizeof(kIdMagic)];
  uint64_t tag[2];
};
static_assert(sizeof(IdLayout) <= sizeof(ncclUniqueId),
              "the emulated id must fit in ncclUniqueId");

/// What each process tells the others when it joins a communicator: the
/// same table on every process decides whether the join succeeds.
struct Hello {
  ncclUniqueId id;
  int32_t nranks, rank;
  int64_t pid;
  uint64_t startTime;    ///< /proc/<pid>/stat's starttime, 0 if unknown
  uint64_t pidNamespace; ///< the inode of /proc/self/ns/pid, 0 if unknown
  char bootId[40];       ///< the machine's boot id: "on this machine"
  char host[64];
};

/// A process's state from /proc/<pid>/stat.
struct ProcessState {
  bool exists = false;
  char state = '?';
  uint64_t startTime = 0;
};

ProcessState readProcess(int64_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat", (long long)pid);
  ProcessState result;
  FILE *file = std::fopen(path, "r");
  if (!file)
    return result;
  char text[1024];
  size_t n = std::fread(text, 1, sizeof(text) - 1, file);
  std::fclose(file);
  text[n] = 0;
  result.exists = true;
  // Fields 1 and 2 are the pid and "(name)", which may hold anything.
  const char *rest = std::strrchr(text, ')');
  if (!rest)
    return result;
  std::istringstream fields(rest + 1);
  std::string field;
  for (int index = 3; fields >> field; ++index) {
    if (index == 3)
      result.state = field[0];
    if (index == 22) {
      result.startTime = std::strtoull(field.c_str(), nullptr, 10);
      break;
    }
  }
  return result;
}

/// This process's identity (the hello's fields after the rank).
void describeSelf(Hello &hello) {
  hello.pid = int64_t(getpid());
  hello.startTime = readProcess(hello.pid).startTime;
  struct stat info;
  if (stat("/proc/self/ns/pid", &info) == 0)
    hello.pidNamespace = uint64_t(info.st_ino);
  if (FILE *file = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    size_t n = std::fread(hello.bootId, 1, sizeof(hello.bootId) - 1, file);
    std::fclose(file);
    hello.bootId[n] = 0;
    if (char *newline = std::strchr(hello.bootId, '\n'))
      *newline = 0;
  }
  if (gethostname(hello.host, sizeof(hello.host) - 1) != 0)
    std::strcpy(hello.host, "?");
}

/// Whether `peer` runs on this machine, in this pid namespace: whether its
/// pid can be looked up here.
bool visible(const Hello &self, const Hello &peer) {
  return self.bootId[0] && self.pidNamespace &&
         !std::strcmp(self.bootId, peer.bootId) &&
         self.pidNamespace == peer.pidNamespace;
}

/// How a visible peer is doing, or null while it runs (or sleeps).
const char *trouble(const Hello &peer) {
  ProcessState state = readProcess(peer.pid);
  if (!state.exists || state.state == 'Z' || state.state == 'X' ||
      state.state == 'x' ||
      (peer.startTime && state.startTime && state.startTime != peer.startTime))
    return "has exited";
  if (state.state == 'T')
    return "is stopped";
  if (state.state == 't')
    return "is stopped by a tracer";
  return nullptr;
}

//===----------------------------------------------------------------------===//
// Collectives in flight
//===----------------------------------------------------------------------===//

enum class OpState { Queued, Running, Done, Failed };

/// One collective, from its call until MPI is done with it.
struct Op {
  const char *name; ///< "all-gather" or "reduce-scatter"
  bool gather;
  uint64_t seq; ///< 1-based, per communicator
  const char *send;
  char *recv;
  size_t count;    ///< elements per rank
  size_t elemSize; ///< bytes per element
  MPI_Datatype type;
  std::unique_ptr<char[]> stage; ///< nranks * count elements
  size_t stageBytes = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  OpState state = OpState::Queued;
  Clock::time_point started;
};

enum class Phase { Joining, Greeting, Ready, Broken };

constexpr uint64_t kCommMagic = 0x6e63636c2d656d75; // "nccl-emu"

/// After how long a collective waits, and how often then, the peers on this
/// machine are looked up to notice one that died.
constexpr auto kPeerCheckAfter = std::chrono::seconds(1);
constexpr auto kPeerCheckEvery = std::chrono::milliseconds(500);

/// Stage buffers kept for reuse per communicator.
constexpr size_t kSpareStages = 4;

/// Sleeps a little between two polls of something pending for `waited`:
/// spins first (most collectives end within a millisecond), then leaves
/// the core to the peers (ranks often share cores).
void pause(Clock::duration waited) {
  if (waited < std::chrono::milliseconds(1))
    std::this_thread::yield();
  else if (waited < std::chrono::milliseconds(50))
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  else
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

} // namespace

/// nccl.h's opaque communicator. Never freed (see the file comment).
struct ncclComm {
  uint64_t magic = kCommMagic;
  int rank = 0, nranks = 1;
  bool blocking = true;
  std::atomic<bool> aborted{false}, destroyed{false};

  /// Guards everything below. Held for one poll step at a time (an MPI_Test,
  /// a copy), never across a wait.
  std::mutex lock;
  Phase phase = Phase::Ready;
  /// Sticky: why the join or a collective failed.
  ncclResult_t error = ncclSuccess;
  MPI_Comm mpi = MPI_COMM_NULL;
  bool joined = false; ///< `mpi` exists (the idup completed)
  MPI_Request joinRequest = MPI_REQUEST_NULL;
  Clock::time_point joinStarted;
  Hello self{};
  std::vector<Hello> table; ///< by world rank
  int myWorldRank = 0;
  std::vector<int> rankOfWorld; ///< NCCL rank of each world rank
  bool permuted = false;        ///< some NCCL rank differs from its world rank
  /// Collectives called and not finished, in call order.
  std::vector<std::shared_ptr<Op>> pending;
  /// Collectives given up with MPI still holding their stage: kept forever.
  std::vector<std::shared_ptr<Op>> abandoned;
  /// Inorder, non-blocking: the call that returned ncclInProgress.
  std::shared_ptr<Op> settling;
  uint64_t issued = 0;
  Clock::time_point nextPeerCheck;
  std::vector<std::pair<std::unique_ptr<char[]>, size_t>> spare;
};

namespace {

/// Checks a handle passed to `function`: null is an invalid argument;
/// anything but a live communicator is fatal.
ncclResult_t checkComm(ncclComm_t comm, const char *function) {
  if (!comm)
    return report(ncclInvalidArgument, kWorld, "%s: comm is NULL", function);
  if (comm->magic != kCommMagic)
    fatal("%s: %p is not a communicator made by ncclCommInitRankConfig",
          function, static_cast<void *>(comm));
  if (comm->destroyed)
    fatal("%s: the communicator was destroyed (ncclCommDestroy)", function);
  return ncclSuccess;
}

/// Marks the communicator broken by `result` (lock held) and reports why.
__attribute__((format(printf, 3, 4))) void
breakComm(ncclComm *c, ncclResult_t result, const char *format, ...) {
  char message[sizeof(lastError)];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  c->error = result;
  c->phase = Phase::Broken;
  report(result, c->rank, "%s", message);
}

/// Advances a join (lock held): the idup, then the hello exchange, then the
/// checks.
void advanceJoin(ncclComm *c) {
  int done = 0;
  if (c->phase == Phase::Joining) {
    int rc = MPI_Test(&c->joinRequest, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
      return breakComm(c, ncclSystemError,
                       "joining the communicator: MPI_Comm_idup failed: %s",
                       mpiError(rc).c_str());
    if (!done)
      return;
    c->joined = true;
    MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
    c->table.assign(size_t(c->nranks), Hello{});
    rc = MPI_Iallgather(&c->self, int(sizeof(Hello)), MPI_BYTE, c->table.data(),
                        int(sizeof(Hello)), MPI_BYTE, c->mpi, &c->joinRequest);
    if (rc != MPI_SUCCESS)
      return breakComm(c, ncclSystemError,
                       "joining the communicator: MPI_Iallgather failed: %s",
                       mpiError(rc).c_str());
    c->phase = Phase::Greeting;
  }
  if (c->phase != Phase::Greeting)
    return;
  int rc = MPI_Test(&c->joinRequest, &done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS)
    return breakComm(c, ncclRemoteError,
                     "joining the communicator: the exchange with the other "
                     "ranks failed: %s",
                     mpiError(rc).c_str());
  if (!done)
    return;
  // Every process sees this same table, so all of them fail alike.
  std::string others;
  for (int w = 0; w < c->nranks; ++w)
    if (std::memcmp(&c->table[w].id, &c->table[0].id, sizeof(ncclUniqueId)))
      others += (others.empty() ? "" : ", ") + std::to_string(w);
  if (!others.empty())
    return breakComm(c, ncclInvalidUsage,
                     "the ranks were given different unique ids: world "
                     "rank(s) %s hold another id than world rank 0 (every "
                     "rank must pass the id that one rank's ncclGetUniqueId "
                     "made)",
                     others.c_str());
  std::vector<int> worldOfRank(size_t(c->nranks), -1);
  c->rankOfWorld.assign(size_t(c->nranks), -1);
  for (int w = 0; w < c->nranks; ++w) {
    const Hello &h = c->table[w];
    if (h.nranks != c->nranks || h.rank < 0 || h.rank >= c->nranks)
      return breakComm(c, ncclInvalidUsage,
                       "world rank %d joined as rank %d of %d, this rank as "
                       "rank %d of %d",
                       w, h.rank, h.nranks, c->rank, c->nranks);
    if (worldOfRank[h.rank] >= 0)
      return breakComm(c, ncclInvalidUsage,
                       "world ranks %d and %d both joined as rank %d",
                       worldOfRank[h.rank], w, h.rank);
    worldOfRank[h.rank] = w;
    c->rankOfWorld[w] = h.rank;
    c->permuted = c->permuted || h.rank != w;
  }
  c->phase = Phase::Ready;
}

/// A stage buffer of at least `bytes` (lock held): a spare one, or new.
std::pair<std::unique_ptr<char[]>, size_t> takeStage(ncclComm *c,
                                                     size_t bytes) {
  auto best = c->spare.end();
  for (auto it = c->spare.begin(); it != c->spare.end(); ++it)
    if (it->second >= bytes &&
        (best == c->spare.end() || it->second < best->second))
      best = it;
  if (best != c->spare.end()) {
    auto stage = std::move(*best);
    c->spare.erase(best);
    return stage;
  }
  return {std::unique_ptr<char[]>(new char[bytes]), bytes};
}

/// Keeps a finished op's stage for reuse (lock held).
void giveStage(ncclComm *c, Op &op) {
  if (!op.stage)
    return;
  c->spare.emplace_back(std::move(op.stage), op.stageBytes);
  if (c->spare.size() > kSpareStages) // drop the smallest
    c->spare.erase(std::min_element(
        c->spare.begin(), c->spare.end(),
        [](const auto &a, const auto &b) { return a.second < b.second; }));
}

void forget(ncclComm *c, const Op &op) {
  c->pending.erase(std::remove_if(c->pending.begin(), c->pending.end(),
                                  [&](const std::shared_ptr<Op> &p) {
                                    return p.get() == &op;
                                  }),
                   c->pending.end());
}

/// Fails every collective in flight after `why` broke the communicator
/// (lock held): MPI keeps the stage of those it runs.
__attribute__((format(printf, 3, 4))) void
failAll(ncclComm *c, ncclResult_t result, const char *format, ...) {
  char message[sizeof(lastError)];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  for (auto &op : c->pending) {
    if (op->state == OpState::Running)
      c->abandoned.push_back(op);
    op->state = OpState::Failed;
  }
  c->pending.clear();
  breakComm(c, result, "%s", message);
}

/// Starts `op` on MPI (lock held); on failure it is Failed, and the
/// communicator broken.
void start(ncclComm *c, Op &op) {
  if (op.state != OpState::Queued) // failed or abandoned meanwhile
    return;
  if (c->aborted || c->error != ncclSuccess) {
    op.state = OpState::Failed;
    forget(c, op);
    return;
  }
  const size_t block = op.count * op.elemSize;
  auto [stage, capacity] = takeStage(c, block * size_t(c->nranks));
  op.stage = std::move(stage);
  op.stageBytes = capacity;
  // The stage is in world rank order: block w is world rank w's.
  int rc;
  if (op.gather) {
    std::memcpy(op.stage.get() + size_t(c->myWorldRank) * block, op.send,
                block);
    rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, op.stage.get(),
                        int(op.count), op.type, c->mpi, &op.request);
  } else {
    if (!c->permuted)
      std::memcpy(op.stage.get(), op.send, block * size_t(c->nranks));
    else
      for (int w = 0; w < c->nranks; ++w)
        std::memcpy(op.stage.get() + size_t(w) * block,
                    op.send + size_t(c->rankOfWorld[w]) * block, block);
    rc = MPI_Ireduce_scatter_block(MPI_IN_PLACE, op.stage.get(), int(op.count),
                                   op.type, MPI_SUM, c->mpi, &op.request);
  }
  if (rc != MPI_SUCCESS) {
    op.state = OpState::Failed;
    forget(c, op);
    giveStage(c, op);
    return breakComm(c, ncclSystemError, "%s #%llu could not start: %s",
                     op.name, (unsigned long long)op.seq, mpiError(rc).c_str());
  }
  op.state = OpState::Running;
  op.started = Clock::now();
}

/// Copies a completed op's result to the caller's buffer (lock held).
void complete(ncclComm *c, Op &op) {
  const size_t block = op.count * op.elemSize;
  if (!op.gather)
    std::memcpy(op.recv, op.stage.get(), block);
  else if (!c->permuted)
    std::memcpy(op.recv, op.stage.get(), block * size_t(c->nranks));
  else
    for (int w = 0; w < c->nranks; ++w)
      std::memcpy(op.recv + size_t(c->rankOfWorld[w]) * block,
                  op.stage.get() + size_t(w) * block, block);
  op.state = OpState::Done;
  giveStage(c, op);
  forget(c, op);
}

/// Looks up the peers on this machine when a collective has waited long
/// (lock held): one that died breaks the communicator.
void checkPeers(ncclComm *c, Clock::time_point now) {
  if (now < c->nextPeerCheck)
    return;
  bool waitedLong = false;
  for (auto &op : c->pending)
    waitedLong = waitedLong || (op->state == OpState::Running &&
                                now - op->started >= kPeerCheckAfter);
  if (!waitedLong)
    return;
  c->nextPeerCheck = now + kPeerCheckEvery;
  std::string dead;
  for (int w = 0; w < c->nranks; ++w) {
    const Hello &peer = c->table[w];
    const char *state = w == c->myWorldRank || !visible(c->self, peer)
                            ? nullptr
                            : trouble(peer);
    if (state && !std::strcmp(state, "has exited"))
      dead += std::string(dead.empty() ? "" : ", ") + "rank " +
              std::to_string(c->rankOfWorld[w]) + " (pid " +
              std::to_string(peer.pid) + " on " + peer.host + ")";
  }
  if (dead.empty())
    return;
  // A peer may have left after its part was done: a last look first.
  for (auto op : std::vector<std::shared_ptr<Op>>(c->pending)) {
    int done = 0;
    if (op->state == OpState::Running &&
        MPI_Test(&op->request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done)
      complete(c, *op);
  }
  if (c->pending.empty())
    return;
  const Op &op = *c->pending.front();
  failAll(c, ncclRemoteError, "%s exited while %s #%llu was in flight",
          dead.c_str(), op.name, (unsigned long long)op.seq);
}

/// One poll of every collective in flight (lock held).
void progress(ncclComm *c) {
  if (c->aborted || c->phase != Phase::Ready || c->nranks == 1)
    return;
  for (auto op : std::vector<std::shared_ptr<Op>>(c->pending)) {
    if (op->state != OpState::Running)
      continue;
    int done = 0;
    int rc = MPI_Test(&op->request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
      return failAll(c, ncclRemoteError, "%s #%llu failed in MPI: %s", op->name,
                     (unsigned long long)op->seq, mpiError(rc).c_str());
    if (done)
      complete(c, *op);
  }
  if (!c->pending.empty())
    checkPeers(c, Clock::now());
}

/// Polls until `op` is done or failed, or the communicator aborted.
void waitFor(ncclComm *c, const std::shared_ptr<Op> &op) {
  const Clock::time_point begin = Clock::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> guard(c->lock);
      if (c->aborted || op->state == OpState::Done ||
          op->state == OpState::Failed)
        return;
      progress(c);
      if (op->state == OpState::Done || op->state == OpState::Failed)
        return;
    }
    pause(Clock::now() - begin);
  }
}

/// Bytes per element of a built-in datatype, 0 for anything else.
size_t elementSize(ncclDataType_t type) {
  switch (type) {
  case ncclInt8:
  case ncclUint8:
  case ncclFloat8e4m3:
  case ncclFloat8e5m2:
    return 1;
  case ncclFloat16:
  case ncclBfloat16:
    return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32:
    return 4;
  case ncclInt64:
  case ncclUint64:
  case ncclFloat64:
    return 8;
  default:
    return 0;
  }
}

/// The MPI type that moves elements of `bytes` bytes unchanged.
MPI_Datatype rawType(size_t bytes) {
  switch (bytes) {
  case 1:
    return MPI_UINT8_T;
  case 2:
    return MPI_UINT16_T;
  case 4:
    return MPI_UINT32_T;
  default:
    return MPI_UINT64_T;
  }
}

/// Whether [a, a + aBytes) and [b, b + bBytes) share a byte.
bool overlap(const void *a, size_t aBytes, const void *b, size_t bBytes) {
  uintptr_t x = uintptr_t(a), y = uintptr_t(b);
  return aBytes && bBytes && x < y + bBytes && y < x + aBytes;
}

/// ncclAllGather (`gather`) and ncclReduceScatter: the checks, then the
/// collective on `stream` (see the file comment).
ncclResult_t collective(const char *function, bool gather, const void *sendbuff,
                        void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = checkComm(comm, function))
    return r;
  ncclComm *c = comm;
  size_t elemSize = elementSize(datatype);
  if (!elemSize)
    return report(ncclInvalidArgument, c->rank,
                  "%s: datatype %d is not one "
                  "of NCCL's",
                  function, int(datatype));
  if (!gather && datatype != ncclFloat)
    return report(ncclInvalidArgument, c->rank,
                  "%s: datatype %d is not supported by the emulation (only "
                  "ncclFloat)",
                  function, int(datatype));
  if (!gather && op != ncclSum)
    return report(ncclInvalidArgument, c->rank,
                  "%s: reduction %d is not supported by the emulation (only "
                  "ncclSum)",
                  function, int(op));
  if (count > size_t(INT_MAX))
    return report(ncclInvalidArgument, c->rank,
                  "%s: %zu elements per rank is more than the emulation's "
                  "limit of INT_MAX (MPI's count)",
                  function, count);
  const size_t block = count * elemSize;
  const size_t whole = block * size_t(c->nranks);
  if (whole / size_t(c->nranks) != block)
    return report(ncclInvalidArgument, c->rank,
                  "%s: %zu elements per rank times %d ranks overflows",
                  function, count, c->nranks);
  if (count && (!sendbuff || !recvbuff))
    return report(ncclInvalidArgument, c->rank, "%s: %s is NULL", function,
                  sendbuff ? "recvbuff" : "sendbuff");
  const char *send = static_cast<const char *>(sendbuff);
  char *recv = static_cast<char *>(recvbuff);
  if (gather) {
    if (send != recv + size_t(c->rank) * block &&
        overlap(send, block, recv, whole))
      fatal("%s: sendbuff %p (%zu bytes) overlaps recvbuff %p (%zu bytes) "
            "without being in place (recvbuff + rank %d * sendcount)",
            function, sendbuff, block, recvbuff, whole, c->rank);
  } else {
    if (recv != send + size_t(c->rank) * block &&
        overlap(send, whole, recv, block))
      fatal("%s: recvbuff %p (%zu bytes) overlaps sendbuff %p (%zu bytes) "
            "without being in place (sendbuff + rank %d * recvcount)",
            function, recvbuff, block, sendbuff, whole, c->rank);
  }
  if (c->aborted)
    return report(ncclInvalidUsage, c->rank, "%s: the communicator was aborted",
                  function);
  std::shared_ptr<Op> work;
  {
    std::lock_guard<std::mutex> guard(c->lock);
    if (c->phase == Phase::Joining || c->phase == Phase::Greeting)
      return report(ncclInvalidUsage, c->rank,
                    "%s: the communicator is still joining: poll "
                    "ncclCommGetAsyncError until it leaves ncclInProgress",
                    function);
    if (c->error != ncclSuccess)
      return report(c->error, c->rank, "%s: the communicator failed before: %s",
                    function, ncclGetErrorString(c->error));
    if (c->settling && c->settling->state != OpState::Done)
      return report(ncclInvalidUsage, c->rank,
                    "%s: %s #%llu returned ncclInProgress and has not settled: "
                    "poll ncclCommGetAsyncError until it leaves "
                    "ncclInProgress before the next call",
                    function, c->settling->name,
                    (unsigned long long)c->settling->seq);
    c->settling.reset();
    if (count == 0)
      return ncclSuccess;
    if (c->nranks > 1) {
      work = std::make_shared<Op>();
      work->name = gather ? "all-gather" : "reduce-scatter";
      work->gather = gather;
      work->seq = ++c->issued;
      work->send = send;
      work->recv = recv;
      work->count = count;
      work->elemSize = elemSize;
      work->type = gather ? rawType(elemSize) : MPI_FLOAT;
      c->pending.push_back(work);
    }
  }
  if (!work) { // one rank: a copy, unless in place
    fastllm::emu::enqueue(stream, [c, send, recv, block] {
      if (!c->aborted && send != recv)
        std::memcpy(recv, send, block);
    });
    return ncclSuccess;
  }
  const bool threaded = fastllm::emu::threadedStreams();
  const bool waitInWork = threaded || c->blocking;
  fastllm::emu::enqueue(stream, [c, work, waitInWork] {
    {
      std::lock_guard<std::mutex> guard(c->lock);
      start(c, *work);
    }
    if (waitInWork)
      waitFor(c, work);
  });
  if (threaded)
    return ncclSuccess;
  std::lock_guard<std::mutex> guard(c->lock);
  if (!c->blocking && work->state == OpState::Running) {
    progress(c);
    if (work->state == OpState::Running) {
      c->settling = work;
      return ncclInProgress;
    }
  }
  if (work->state == OpState::Done)
    return ncclSuccess;
  if (c->error != ncclSuccess)
    return c->error; // reported when it broke
  return report(ncclInvalidUsage, c->rank,
                "%s: the communicator was aborted while %s #%llu was in "
                "flight",
                function, work->name, (unsigned long long)work->seq);
}

/// Whether `config` is what NCCL_CONFIG_INITIALIZER made (then tuned).
ncclResult_t checkConfig(const ncclConfig_t *config, bool &blocking) {
  blocking = true;
  if (!config)
    return ncclSuccess;
  const ncclConfig_t initial = NCCL_CONFIG_INITIALIZER;
  if (config->size != initial.size || config->magic != initial.magic ||
      config->version != initial.version)
    return report(ncclInvalidArgument, kWorld,
                  "ncclCommInitRankConfig: the config was not set up with "
                  "NCCL_CONFIG_INITIALIZER (size %zu, magic %#x, version %u; "
                  "expected %zu, %#x, %u)",
                  config->size, config->magic, config->version, initial.size,
                  initial.magic, initial.version);
  if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
      config->blocking != 1)
    return report(ncclInvalidArgument, kWorld,
                  "ncclCommInitRankConfig: config.blocking is %d, not 0 or 1",
                  config->blocking);
  blocking = config->blocking != 0;
  // The other fields tune the GPU's kernels and transports: no effect here.
  return ncclSuccess;
}

const char *threadLevelName(int level) {
  switch (level) {
  case MPI_THREAD_SINGLE:
    return "MPI_THREAD_SINGLE";
  case MPI_THREAD_FUNNELED:
    return "MPI_THREAD_FUNNELED";
  case MPI_THREAD_SERIALIZED:
    return "MPI_THREAD_SERIALIZED";
  default:
    return "MPI_THREAD_MULTIPLE";
  }
}

} // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  if (!uniqueId)
    return report(ncclInvalidArgument, kWorld,
                  "ncclGetUniqueId: uniqueId is NULL");
  IdLayout id;
  std::memcpy(id.magic, kIdMagic, sizeof(kIdMagic));
  // random_device may be deterministic somewhere: the pid and the clock too.
  std::random_device device;
  std::seed_seq seed{
      device(),           device(),
      device(),           device(),
      unsigned(getpid()), unsigned(Clock::now().time_since_epoch().count())};
  std::mt19937_64 bits(seed);
  id.tag[0] = bits();
  id.tag[1] = bits();
  std::memset(uniqueId, 0, sizeof(*uniqueId));
  std::memcpy(uniqueId->internal, &id, sizeof(id));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks,
                                    ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
  const char *function = "ncclCommInitRankConfig";
  if (!comm)
    return report(ncclInvalidArgument, kWorld, "%s: comm is NULL", function);
  *comm = nullptr;
  bool blocking;
  if (ncclResult_t r = checkConfig(config, blocking))
    return r;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return report(ncclInvalidArgument, kWorld, "%s: rank %d of %d ranks",
                  function, rank, nranks);
  if (std::memcmp(commId.internal, kIdMagic, sizeof(kIdMagic)))
    return report(ncclInvalidArgument, kWorld,
                  "%s: the unique id was not made by ncclGetUniqueId",
                  function);
  if (nranks == 1) { // this process alone: no MPI
    ncclComm *c = new ncclComm();
    c->blocking = blocking;
    *comm = c;
    return ncclSuccess;
  }
  int initialized = 0, finalized = 0, level = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return report(ncclInvalidUsage, kWorld,
                  "%s: MPI is %s: the emulated NCCL carries %d ranks over "
                  "MPI (one process per rank, under mpirun)",
                  function, finalized ? "finalised" : "not initialised",
                  nranks);
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE)
    return report(ncclInvalidUsage, kWorld,
                  "%s: MPI provides %s, the emulated NCCL needs "
                  "MPI_THREAD_MULTIPLE (stream and watchdog threads poll its "
                  "collectives while the main thread uses MPI): initialise "
                  "MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)",
                  function, threadLevelName(level));
  int worldSize = 0, worldRank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &worldSize);
  MPI_Comm_rank(MPI_COMM_WORLD, &worldRank);
  if (nranks != worldSize)
    return report(ncclInvalidUsage, kWorld,
                  "%s: %d ranks, but the emulation's communicators hold every "
                  "process of MPI_COMM_WORLD (%d)",
                  function, nranks, worldSize);
  ncclComm *c = new ncclComm();
  c->rank = rank;
  c->nranks = nranks;
  c->blocking = blocking;
  c->myWorldRank = worldRank;
  c->self.id = commId;
  c->self.nranks = nranks;
  c->self.rank = rank;
  describeSelf(c->self);
  c->phase = Phase::Joining;
  c->joinStarted = Clock::now();
  int rc = MPI_Comm_idup(MPI_COMM_WORLD, &c->mpi, &c->joinRequest);
  if (rc != MPI_SUCCESS) {
    report(ncclSystemError, kWorld, "%s: MPI_Comm_idup failed: %s", function,
           mpiError(rc).c_str());
    delete c; // nothing refers to it yet
    return ncclSystemError;
  }
  for (;;) {
    {
      std::lock_guard<std::mutex> guard(c->lock);
      advanceJoin(c);
      if (c->phase == Phase::Ready) {
        *comm = c;
        return ncclSuccess;
      }
      if (c->phase == Phase::Broken) {
        if (!blocking) // the caller aborts or destroys it
          *comm = c;
        return c->error;
      }
      if (!blocking) {
        *comm = c;
        return ncclInProgress;
      }
    }
    pause(Clock::now() - c->joinStarted);
  }
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (ncclResult_t r = checkComm(comm, "ncclCommGetAsyncError"))
    return r;
  if (!asyncError)
    return report(ncclInvalidArgument, comm->rank,
                  "ncclCommGetAsyncError: asyncError is NULL");
  ncclComm *c = comm;
  Clock::time_point since;
  {
    std::lock_guard<std::mutex> guard(c->lock);
    if (c->aborted) { // the error that led to the abort, if known
      *asyncError = c->error != ncclSuccess ? c->error : ncclInvalidUsage;
      return ncclSuccess;
    }
    if (c->phase == Phase::Joining || c->phase == Phase::Greeting)
      advanceJoin(c);
    else
      progress(c);
    if (c->error != ncclSuccess) {
      *asyncError = c->error;
      return ncclSuccess;
    }
    if (c->phase == Phase::Joining || c->phase == Phase::Greeting) {
      since = c->joinStarted;
    } else if (c->settling && c->settling->state != OpState::Done) {
      since = c->settling->started;
    } else {
      c->settling.reset();
      *asyncError = ncclSuccess;
      return ncclSuccess;
    }
    *asyncError = ncclInProgress;
  }
  pause(Clock::now() - since); // the caller polls: spare its core
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (ncclResult_t r = checkComm(comm, "ncclCommAbort"))
    return r;
  ncclComm *c = comm;
  if (c->aborted.exchange(true))
    fatal("ncclCommAbort: the communicator was aborted before (an abort "
          "frees it)");
  // Wait for the poller in its step, if any: after it, none touches the
  // caller's buffers (each looks at `aborted` first).
  std::lock_guard<std::mutex> guard(c->lock);
  std::string running;
  const Clock::time_point now = Clock::now();
  for (auto &op : c->pending) {
    if (op->state != OpState::Running)
      continue;
    char line[160];
    std::snprintf(line, sizeof(line), "%s%s #%llu (in flight for %.1f s)",
                  running.empty() ? "" : ", ", op->name,
                  (unsigned long long)op->seq,
                  std::chrono::duration<double>(now - op->started).count());
    running += line;
    c->abandoned.push_back(op);
  }
  for (auto &op : c->pending)
    op->state = OpState::Failed;
  c->pending.clear();
  c->settling.reset();
  c->spare.clear(); // idle: no poller starts a collective any more
  if (!running.empty() && c->phase == Phase::Ready) {
    // Say what the peers on this machine are doing.
    std::string peers;
    for (int w = 0; w < c->nranks; ++w) {
      const Hello &peer = c->table[w];
      if (w == c->myWorldRank || !visible(c->self, peer))
        continue;
      if (const char *state = trouble(peer))
        peers += "; rank " + std::to_string(c->rankOfWorld[w]) + " (pid " +
                 std::to_string(peer.pid) + ") " + state;
    }
    std::fprintf(stderr, "cuda emulation: NCCL: rank %d: aborted with %s%s\n",
                 c->rank, running.c_str(), peers.c_str());
    std::fflush(stderr);
  }
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (ncclResult_t r = checkComm(comm, "ncclCommDestroy"))
    return r;
  ncclComm *c = comm;
  if (c->aborted)
    fatal("ncclCommDestroy: the communicator was aborted (an abort frees "
          "it)");
  {
    std::lock_guard<std::mutex> guard(c->lock);
    if (c->phase == Phase::Joining || c->phase == Phase::Greeting)
      return report(ncclInvalidUsage, c->rank,
                    "ncclCommDestroy: the communicator is still joining "
                    "(abort it instead)");
  }
  // Like NCCL's, a destroy finishes the collectives in flight first.
  const Clock::time_point begin = Clock::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> guard(c->lock);
      progress(c);
      if (c->pending.empty() || c->aborted)
        break;
    }
    pause(Clock::now() - begin);
  }
  std::lock_guard<std::mutex> guard(c->lock);
  if (c->joined && c->error == ncclSuccess && c->abandoned.empty() &&
      !c->aborted)
    MPI_Comm_free(&c->mpi);
  c->spare.clear();
  c->destroyed = true;
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff,
                           size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllGather", true, sendbuff, recvbuff, sendcount,
                    datatype, ncclSum, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff,
                               size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return collective("ncclReduceScatter", false, sendbuff, recvbuff, recvcount,
                    datatype, op, comm, stream);
}

const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
  case ncclSuccess:
    return "no error";
  case ncclUnhandledCudaError:
    return "unhandled cuda error";
  case ncclSystemError:
    return "unhandled system error (an MPI call failed; see the emulation's "
           "message on stderr)";
  case ncclInternalError:
    return "internal error";
  case ncclInvalidArgument:
    return "invalid argument (see the emulation's message on stderr)";
  case ncclInvalidUsage:
    return "invalid usage (see the emulation's message on stderr)";
  case ncclRemoteError:
    return "remote process exited or there was a network error";
  case ncclInProgress:
    return "NCCL operation in progress";
  default:
    return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t) {
  // A copy per thread: another thread may report meanwhile.
  thread_local char copy[sizeof(lastError)];
  std::lock_guard<std::mutex> guard(lastErrorLock);
  std::memcpy(copy, lastError, sizeof(copy));
  return copy;
}

} // extern "C"
