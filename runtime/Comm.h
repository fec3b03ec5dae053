//===- Comm.h - collectives over MPI for the training runtime ---*- C++ -*-===//
//
// Every training process, launched by mpirun or alone, owns one Communicator:
// MPI is always initialised (a process started without mpirun is a 1-rank
// world), so the training loop has a single code path.
//
// A collective that cannot complete is fatal for the whole job: the peers are
// already inside it and only MPI_Abort releases them. So collectives do not
// return a Status. Each wait polls with a deadline (--collective-timeout); on
// timeout or an MPI error the process prints
//
//   train: error: rank R: step S: <collective> timed out after T s; rank(s)
//   2 never arrived
//
// and aborts the job, so no rank hangs forever on a dead or diverged peer.
//
// Naming the rank that never arrived: every rank numbers the collectives it
// issues (all ranks issue the same sequence). A rank whose wait times out
// asks every peer, on a communicator of its own, how many collectives it
// has issued, and waits a short grace period (--collective-timeout / 10,
// between 2 and 10 s) for the answers. Peers answer from inside their own
// waits (every rank stuck behind a missing one is waiting), so the ranks
// that do not answer, or answer with a number below the stuck collective's,
// are the ones that never arrived: hung, stopped, dead or still computing.
//
// The header does not include <mpi.h>: generated code and tests can call the
// runtime without MPI's include paths.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_COMM_H
#define FASTLLM_RUNTIME_COMM_H

#include "runtime/Status.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace fastllm::rt {

/// Bytes moved by the collectives since the last reset. Each counts the full
/// (unsharded) buffer: a reduce-scatter of p*n elements into n per rank
/// counts p*n*4 bytes, an all-gather of n into p*n counts p*n*4, an
/// all-reduce of n counts n*4. These are the figures the compiler's plan
/// states per step.
struct CommBytes {
  int64_t allReduce = 0, reduceScatter = 0, allGather = 0, broadcast = 0;
  /// The runtime's own small exchanges (the global loss, checkpoint
  /// checksums), kept apart so the other kinds match the plan exactly.
  int64_t control = 0;
};

class Communicator;

/// A non-blocking collective in flight. Its buffers must stay untouched until
/// wait() returns; destroying a pending Request waits for it.
class Request {
public:
  Request();
  Request(Request &&other) noexcept;
  Request &operator=(Request &&other) noexcept;
  Request(const Request &) = delete;
  Request &operator=(const Request &) = delete;
  ~Request();

  /// Returns once the collective is complete (at once for an empty Request);
  /// aborts the job on timeout or an MPI error.
  void wait();
  /// Whether the collective is complete, without blocking.
  bool test();
  /// Whether it was waited (or never started).
  bool waited() const { return !pending; }

private:
  friend class Communicator;
  struct Pending;
  std::unique_ptr<Pending> pending;
};

class Communicator {
public:
  /// Initialises MPI (MPI_Init_thread, funneled: only the calling thread
  /// communicates) and duplicates MPI_COMM_WORLD with MPI_ERRORS_RETURN. Call
  /// once per process: MPI cannot be initialised again after it finalises.
  /// argc/argv may be null. A process no launcher (mpirun, srun) started is
  /// a 1-rank world without MPI: nothing is initialised, the collectives are
  /// local copies, so a lone trainer needs no working MPI installation.
  static Expected<std::unique_ptr<Communicator>> create(int *argc,
                                                        char ***argv);
  /// A 1-rank world of this process alone (a duplicate of MPI_COMM_SELF, or
  /// without MPI when create() did not initialise it), for single-rank work
  /// inside a job, such as a test's reference run; destroying it does not
  /// finalise.
  static Expected<std::unique_ptr<Communicator>> createSelf();
  Communicator(const Communicator &) = delete;
  Communicator &operator=(const Communicator &) = delete;
  /// Frees the communicator; finalises MPI when create() initialised it.
  ~Communicator();

  int rank() const { return myRank; }
  /// The rank among the processes on this machine.
  int localRank() const { return myLocalRank; }
  int size() const { return worldSize; }

  /// Seconds a wait may last before the job is aborted (default 300).
  void setTimeout(double seconds) { timeoutSeconds = seconds; }
  double timeout() const { return timeoutSeconds; }
  /// The 1-based training step named in error messages; 0 before training.
  /// Atomic: a watchdog thread reads it while the loop sets it.
  void setStep(int64_t step) {
    currentStep.store(step, std::memory_order_relaxed);
  }
  int64_t step() const { return currentStep.load(std::memory_order_relaxed); }

  /// out[i] = sum over ranks of in[i], for i < n. `in == out` is in place.
  void allReduceSum(const float *in, float *out, int64_t n);
  /// in: size()*n elements; out: this rank's n-element shard of their sum
  /// over ranks (block rank() of the summed array). Averaging is the
  /// caller's.
  void reduceScatterSum(const float *in, float *out, int64_t n);
  /// in: this rank's n elements; out: size()*n, rank r's in block r.
  /// `in == out + rank() * n` is in place.
  void allGather(const float *in, float *out, int64_t n);
  /// out[i] = sum over ranks of in[i], added in rank order in double, so
  /// that every rank gets the same bits whatever algorithm MPI picks (for
  /// small n: it gathers every rank's n values). Counted as an all-reduce of
  /// n * 8 bytes. `in == out` is allowed.
  /// `perRank`, when given, receives every rank's n inputs (size() * n
  /// values, rank r's at r * n): the all-reduce gathers them anyway.
  void allReduceSumOrdered(const double *in, double *out, int64_t n,
                           double *perRank = nullptr);
  void broadcast(void *data, int64_t bytes, int root);
  void barrier();
  /// An all-gather of `bytes` raw bytes per rank, counted as control.
  void allGatherBytes(const void *in, void *out, int64_t bytes);

  /// Non-blocking forms of the three fp32 collectives, for overlapping them
  /// with compute; counted when issued. ireduceScatterSum may run in place
  /// (in == out): the buffer holds size() * n inputs and the result lands in
  /// its first n.
  Request iallReduceSum(const float *in, float *out, int64_t n);
  Request ireduceScatterSum(const float *in, float *out, int64_t n);
  Request iallGather(const float *in, float *out, int64_t n);

  const CommBytes &bytes() const { return counters; }
  /// Counts bytes another transport moved for this group (NCCL on GPUs).
  CommBytes &mutableBytes() { return counters; }
  void resetBytes() { counters = CommBytes(); }

  /// Prints `train: error: rank R: message` and aborts every rank of the
  /// job. For failures of one rank that its peers cannot know about.
  [[noreturn]] void abort(const std::string &message);

private:
  friend class Request;
  struct Handle;
  Communicator();
  /// The 1-rank world without MPI.
  static std::unique_ptr<Communicator> createLocal();
  /// Aborts naming the rank, the step and `what` went wrong in `op`.
  [[noreturn]] void fail(const char *op, const std::string &what);
  /// Aborts with MPI's description of `code` when it is not MPI_SUCCESS.
  void check(int code, const char *op);
  /// Waits for a pending collective until the timeout.
  void wait(Request::Pending &pending);
  /// The next collective's sequence number (1-based).
  int64_t issue() { return ++issued; }
  /// Answers peers asking how far this rank has got (see the file comment).
  void answerProbes();
  /// After collective `seq` timed out: the ranks that never issued it, as
  /// "rank(s) 2, 3 never arrived", or what else is known.
  std::string whoNeverArrived(int64_t seq);

  std::unique_ptr<Handle> handle;
  int myRank = 0, worldSize = 1, myLocalRank = 0;
  bool ownsMpi = false; ///< created by create(): finalises MPI
  bool local = false;   ///< a 1-rank world without MPI (see create())
  double timeoutSeconds = 300;
  std::atomic<int64_t> currentStep{0};
  CommBytes counters;
  int64_t issued = 0; ///< collectives issued so far
};

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_COMM_H
