//===- Comm.cpp - collectives over MPI for the training runtime -----------===//

#include "runtime/Comm.h"

// The C API, without the C++ bindings mpi.h would add for C++ sources.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

using namespace fastllm::rt;

namespace {

/// Elements (or bytes, for broadcast) per MPI call: MPI counts are int, and
/// single messages over a few GiB are where MPI implementations break.
constexpr int64_t kMaxChunk = int64_t(1) << 28;

/// Whether a launcher (mpirun, srun) started this process, as opposed to a
/// plain `./train`.
bool launched() {
  for (const char *var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(var))
      return true;
  return false;
}

/// out = in over n elements, unless they are the same buffer: a
/// collective's result over one rank (the local world).
template <typename T> void copyUnlessSame(const T *in, T *out, int64_t n) {
  if (in != out)
    std::copy_n(in, n, out);
}

} // namespace

/// Tags on the probe communicator: a timed-out rank's question (payload: the
/// stuck collective's number) and a peer's answer (collectives it issued).
constexpr int kQueryTag = 1, kAnswerTag = 2;

struct Communicator::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
  /// Where timed-out ranks ask who has arrived (see Comm.h).
  MPI_Comm probe = MPI_COMM_NULL;
  /// Answers being sent, with their buffers.
  struct Answer {
    std::unique_ptr<int64_t> value;
    MPI_Request request;
  };
  std::vector<Answer> answers;
};

struct Request::Pending {
  Communicator *comm = nullptr;
  const char *op = "";
  std::vector<MPI_Request> requests;
  int64_t seq = 0; ///< the collective's number (Communicator::issue)
};

//===----------------------------------------------------------------------===//
// Request
//===----------------------------------------------------------------------===//

Request::Request() = default;
Request::Request(Request &&other) noexcept = default;

Request &Request::operator=(Request &&other) noexcept {
  if (this != &other) {
    wait();
    pending = std::move(other.pending);
  }
  return *this;
}

Request::~Request() { wait(); }

void Request::wait() {
  if (!pending)
    return;
  pending->comm->wait(*pending);
  pending.reset();
}

bool Request::test() {
  if (!pending)
    return true;
  int done = 0;
  pending->comm->check(MPI_Testall(int(pending->requests.size()),
                                   pending->requests.data(), &done,
                                   MPI_STATUSES_IGNORE),
                       pending->op);
  if (done)
    pending.reset();
  return done;
}

//===----------------------------------------------------------------------===//
// Communicator
//===----------------------------------------------------------------------===//

Communicator::Communicator() : handle(std::make_unique<Handle>()) {}

Expected<std::unique_ptr<Communicator>> Communicator::create(int *argc,
                                                             char ***argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized)
    return errorf("MPI is already initialised: create one Communicator per "
                  "process");
  if (!launched())
    return createLocal();
  // The runtime itself calls MPI from the main thread only (FUNNELED). The
  // CUDA emulation's NCCL calls it from stream threads too, and checks that
  // it got MULTIPLE: ask for it, require what the runtime needs.
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) !=
      MPI_SUCCESS)
    return errorf("cannot initialise MPI");
  std::unique_ptr<Communicator> comm(new Communicator());
  comm->ownsMpi = true;
  MPI_Comm &handle = comm->handle->comm;
  if (provided < MPI_THREAD_FUNNELED ||
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) !=
          MPI_SUCCESS ||
      MPI_Comm_dup(MPI_COMM_WORLD, &handle) != MPI_SUCCESS ||
      MPI_Comm_set_errhandler(handle, MPI_ERRORS_RETURN) != MPI_SUCCESS ||
      MPI_Comm_dup(MPI_COMM_WORLD, &comm->handle->probe) != MPI_SUCCESS ||
      MPI_Comm_set_errhandler(comm->handle->probe, MPI_ERRORS_RETURN) !=
          MPI_SUCCESS ||
      MPI_Comm_rank(handle, &comm->myRank) != MPI_SUCCESS ||
      MPI_Comm_size(handle, &comm->worldSize) != MPI_SUCCESS)
    return errorf("cannot set up MPI_COMM_WORLD (thread level %d provided)",
                  provided);
  // The rank among the processes on this machine (which GPU to use).
  MPI_Comm local = MPI_COMM_NULL;
  if (MPI_Comm_split_type(handle, MPI_COMM_TYPE_SHARED, comm->myRank,
                          MPI_INFO_NULL, &local) != MPI_SUCCESS ||
      MPI_Comm_rank(local, &comm->myLocalRank) != MPI_SUCCESS)
    return errorf("cannot find the ranks on this machine");
  MPI_Comm_free(&local);
  return comm;
}

std::unique_ptr<Communicator> Communicator::createLocal() {
  std::unique_ptr<Communicator> comm(new Communicator());
  comm->local = true;
  return comm;
}

Expected<std::unique_ptr<Communicator>> Communicator::createSelf() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    return errorf("MPI is finalised: no communicator can be created");
  if (!initialized) // a world without MPI (create() in a lone process)
    return createLocal();
  std::unique_ptr<Communicator> comm(new Communicator());
  MPI_Comm &handle = comm->handle->comm;
  if (MPI_Comm_dup(MPI_COMM_SELF, &handle) != MPI_SUCCESS ||
      MPI_Comm_set_errhandler(handle, MPI_ERRORS_RETURN) != MPI_SUCCESS ||
      MPI_Comm_rank(handle, &comm->myRank) != MPI_SUCCESS ||
      MPI_Comm_size(handle, &comm->worldSize) != MPI_SUCCESS)
    return errorf("cannot set up MPI_COMM_SELF");
  return comm;
}

Communicator::~Communicator() {
  for (Handle::Answer &a : handle->answers) // not yet received: let go
    MPI_Request_free(&a.request);
  if (handle->probe != MPI_COMM_NULL)
    MPI_Comm_free(&handle->probe);
  if (handle->comm != MPI_COMM_NULL)
    MPI_Comm_free(&handle->comm);
  if (ownsMpi)
    MPI_Finalize();
}

void Communicator::abort(const std::string &message) {
  std::fprintf(stderr, "train: error: rank %d: %s\n", myRank, message.c_str());
  std::fflush(stderr);
  if (local)
    std::_Exit(1);
  MPI_Abort(handle->comm != MPI_COMM_NULL ? handle->comm : MPI_COMM_WORLD, 1);
  std::_Exit(1); // MPI_Abort does not return; this is for the compiler
}

void Communicator::fail(const char *op, const std::string &what) {
  std::string where = currentStep > 0 ? "step " + std::to_string(currentStep)
                                      : std::string("startup");
  abort(where + ": " + op + " " + what);
}

void Communicator::check(int code, const char *op) {
  if (code == MPI_SUCCESS)
    return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail(op, "failed: " + std::string(text, length));
}

void Communicator::wait(Request::Pending &pending) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point start = Clock::now();
  // (Capped at 30 years, which a clock's 64-bit nanoseconds still hold.)
  Clock::time_point deadline =
      start + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(std::min(timeoutSeconds, 1e9)));
  for (;;) {
    // Open MPI progresses non-blocking collectives inside MPI calls, so the
    // wait must keep testing; it spins for the first few milliseconds (most
    // collectives end there), then yields the core between tests and
    // answers peers that timed out asking how far this rank has got.
    int done = 0;
    check(MPI_Testall(int(pending.requests.size()), pending.requests.data(),
                      &done, MPI_STATUSES_IGNORE),
          pending.op);
    if (done)
      return;
    Clock::time_point now = Clock::now();
    if (now >= deadline) {
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%g", timeoutSeconds);
      fail(pending.op, std::string("timed out after ") + seconds + " s; " +
                           whoNeverArrived(pending.seq));
    }
    if (now - start > std::chrono::milliseconds(5)) {
      answerProbes();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void Communicator::answerProbes() {
  MPI_Comm probe = handle->probe;
  if (probe == MPI_COMM_NULL)
    return;
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, probe, &flag, &status) !=
            MPI_SUCCESS ||
        !flag)
      break;
    int64_t asked = 0;
    if (MPI_Recv(&asked, 1, MPI_INT64_T, status.MPI_SOURCE, kQueryTag, probe,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
      break;
    Handle::Answer answer{std::make_unique<int64_t>(issued), MPI_REQUEST_NULL};
    if (MPI_Isend(answer.value.get(), 1, MPI_INT64_T, status.MPI_SOURCE,
                  kAnswerTag, probe, &answer.request) == MPI_SUCCESS)
      handle->answers.push_back(std::move(answer));
  }
  auto &answers = handle->answers;
  answers.erase(std::remove_if(answers.begin(), answers.end(),
                               [](Handle::Answer &a) {
                                 int sent = 0;
                                 MPI_Test(&a.request, &sent, MPI_STATUS_IGNORE);
                                 return sent != 0;
                               }),
                answers.end());
}

std::string Communicator::whoNeverArrived(int64_t seq) {
  MPI_Comm probe = handle->probe;
  if (probe == MPI_COMM_NULL || worldSize < 2)
    return "(a peer rank may have died)";
  using Clock = std::chrono::steady_clock;
  const double grace = std::clamp(timeoutSeconds / 10, 2.0, 10.0);
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(grace));
  std::vector<int64_t> question(worldSize, seq), answer(worldSize, -1);
  std::vector<MPI_Request> asks(worldSize, MPI_REQUEST_NULL),
      answers(worldSize, MPI_REQUEST_NULL);
  for (int r = 0; r < worldSize; ++r) {
    if (r == myRank)
      continue;
    MPI_Irecv(&answer[r], 1, MPI_INT64_T, r, kAnswerTag, probe, &answers[r]);
    MPI_Isend(&question[r], 1, MPI_INT64_T, r, kQueryTag, probe, &asks[r]);
  }
  std::vector<bool> answered(worldSize, false);
  answered[myRank] = true;
  for (;;) {
    bool all = true;
    for (int r = 0; r < worldSize; ++r) {
      if (answered[r])
        continue;
      int got = 0;
      if (MPI_Test(&answers[r], &got, MPI_STATUS_IGNORE) == MPI_SUCCESS && got)
        answered[r] = true;
      all = all && answered[r];
    }
    if (all || Clock::now() >= deadline)
      break;
    answerProbes(); // peers that timed out too ask this rank
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // (The requests still open are abandoned: the job is about to abort.)
  std::string missing;
  for (int r = 0; r < worldSize; ++r)
    if (r != myRank && (!answered[r] || answer[r] < seq)) // silent, or behind
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  if (missing.empty())
    return "every rank reached it (a transport failure, or a peer failed "
           "inside it)";
  return "rank(s) " + missing + " never arrived";
}

Request Communicator::iallReduceSum(const float *in, float *out, int64_t n) {
  counters.allReduce += n * int64_t(sizeof(float));
  Request r;
  if (local) { // the sum over one rank
    copyUnlessSame(in, out, n);
    return r;
  }
  r.pending.reset(new Request::Pending{this, "all-reduce", {}, issue()});
  for (int64_t begin = 0; begin < n; begin += kMaxChunk) {
    int count = int(std::min(kMaxChunk, n - begin));
    MPI_Request request;
    check(MPI_Iallreduce(in == out ? MPI_IN_PLACE : in + begin, out + begin,
                         count, MPI_FLOAT, MPI_SUM, handle->comm, &request),
          "all-reduce");
    r.pending->requests.push_back(request);
  }
  return r;
}

Request Communicator::ireduceScatterSum(const float *in, float *out,
                                        int64_t n) {
  const char *op = "reduce-scatter";
  if (n > INT_MAX)
    fail(op, "of " + std::to_string(n) +
                 " elements per rank is larger than "
                 "MPI's count limit");
  counters.reduceScatter += worldSize * n * int64_t(sizeof(float));
  Request r;
  if (local) { // one rank's part is the whole buffer
    copyUnlessSame(in, out, n);
    return r;
  }
  r.pending.reset(new Request::Pending{this, op, {MPI_REQUEST_NULL}, issue()});
  // In place (in == out): the buffer holds every rank's part and the
  // result lands at its start.
  check(MPI_Ireduce_scatter_block(in == out ? MPI_IN_PLACE : in, out, int(n),
                                  MPI_FLOAT, MPI_SUM, handle->comm,
                                  &r.pending->requests[0]),
        op);
  return r;
}

Request Communicator::iallGather(const float *in, float *out, int64_t n) {
  const char *op = "all-gather";
  if (n > INT_MAX)
    fail(op, "of " + std::to_string(n) +
                 " elements per rank is larger than "
                 "MPI's count limit");
  counters.allGather += worldSize * n * int64_t(sizeof(float));
  Request r;
  if (local) {
    copyUnlessSame(in, out, n);
    return r;
  }
  r.pending.reset(new Request::Pending{this, op, {MPI_REQUEST_NULL}, issue()});
  bool inPlace = in == out + int64_t(myRank) * n;
  check(MPI_Iallgather(inPlace ? MPI_IN_PLACE : in, int(n), MPI_FLOAT, out,
                       int(n), MPI_FLOAT, handle->comm,
                       &r.pending->requests[0]),
        op);
  return r;
}

void Communicator::allReduceSum(const float *in, float *out, int64_t n) {
  iallReduceSum(in, out, n).wait();
}

void Communicator::reduceScatterSum(const float *in, float *out, int64_t n) {
  ireduceScatterSum(in, out, n).wait();
}

void Communicator::allGather(const float *in, float *out, int64_t n) {
  iallGather(in, out, n).wait();
}

void Communicator::allReduceSumOrdered(const double *in, double *out, int64_t n,
                                       double *perRank) {
  const char *op = "all-reduce";
  if (n > INT_MAX / std::max(worldSize, 1))
    fail(op, "of " + std::to_string(n) +
                 " doubles is larger than the ordered form handles");
  counters.allReduce += n * int64_t(sizeof(double));
  if (local) {
    if (perRank)
      copyUnlessSame(in, perRank, n);
    copyUnlessSame(in, out, n);
    return;
  }
  std::vector<double> all(size_t(worldSize) * n);
  Request::Pending pending{this, op, {MPI_REQUEST_NULL}, issue()};
  check(MPI_Iallgather(in, int(n), MPI_DOUBLE, all.data(), int(n), MPI_DOUBLE,
                       handle->comm, &pending.requests[0]),
        op);
  wait(pending);
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int r = 0; r < worldSize; ++r)
      sum += all[size_t(r) * n + i];
    out[i] = sum;
  }
  if (perRank)
    std::copy(all.begin(), all.end(), perRank);
}

void Communicator::broadcast(void *data, int64_t bytes, int root) {
  counters.broadcast += bytes;
  if (local)
    return;
  Request::Pending pending{this, "broadcast", {}, issue()};
  for (int64_t begin = 0; begin < bytes; begin += kMaxChunk) {
    MPI_Request request;
    check(MPI_Ibcast(static_cast<char *>(data) + begin,
                     int(std::min(kMaxChunk, bytes - begin)), MPI_BYTE, root,
                     handle->comm, &request),
          pending.op);
    pending.requests.push_back(request);
  }
  wait(pending);
}

void Communicator::barrier() {
  if (local)
    return;
  Request::Pending pending{this, "barrier", {MPI_REQUEST_NULL}, issue()};
  check(MPI_Ibarrier(handle->comm, &pending.requests[0]), pending.op);
  wait(pending);
}

void Communicator::allGatherBytes(const void *in, void *out, int64_t bytes) {
  const char *op = "all-gather (control)";
  if (bytes > INT_MAX)
    fail(op, "of " + std::to_string(bytes) +
                 " bytes is larger than MPI's "
                 "count limit");
  counters.control += worldSize * bytes;
  if (local) {
    if (in != out)
      std::memcpy(out, in, size_t(bytes));
    return;
  }
  Request::Pending pending{this, op, {MPI_REQUEST_NULL}, issue()};
  check(MPI_Iallgather(in, int(bytes), MPI_BYTE, out, int(bytes), MPI_BYTE,
                       handle->comm, &pending.requests[0]),
        op);
  wait(pending);
}
