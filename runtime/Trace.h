//===- Trace.h - a Chrome trace-event file of chosen steps ------*- C++ -*-===//
//
// `train --trace FILE --trace-steps A-B` records, for steps A to B (1-based),
// every kernel call of the generated step (through the hooks of
// runtime/ModelABI.h's TraceHooks), every collective from its start to the
// return of its wait (the step's ZeRO-2/3 all-gathers and reduce-scatters,
// and the runtime's per-step ones: ZeRO-1's reduce-scatter, the all-gather
// of the updated master shards, the gradient-norm all-reduce and the loss
// exchange), and the runtime's phases (the step, each micro-batch, its data
// loading, the optimizer update). At the end of the run rank 0 gathers every
// rank's events through the Communicator and writes one file in the Chrome
// trace-event format ("traceEvents", "X" complete events in microseconds,
// one process per rank, named tracks), which ui.perfetto.dev and
// chrome://tracing open.
//
// Memory is bounded: each rank preallocates room for the events the traced
// steps should produce (at most kMaxTraceEvents); when it is full, later
// events are dropped and counted, and the run's log and the file's
// "otherData" say how many.
//
// Clocks: every rank measures from the moment a barrier released it when
// the Tracer was created, so the ranks' timelines line up to within that
// barrier's skew. On CUDA the end of each span waits for the device (the
// kernels are asynchronous), so traced steps run slower than others but
// their spans are the kernels' real times.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_TRACE_H
#define FASTLLM_RUNTIME_TRACE_H

#include "runtime/Comm.h"
#include "runtime/ModelABI.h"
#include "runtime/Status.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace fastllm::rt {

/// The most events one rank keeps (48 bytes each: 48 MiB).
constexpr int64_t kMaxTraceEvents = int64_t(1) << 20;

/// What a span is.
enum class TraceKind : int32_t {
  Op,            ///< a kernel call of the step; index: PlanInfo::traceOps
  AllGather,     ///< collectives; index: the stage, -1 when not one
  ReduceScatter, //
  AllReduce,     //
  Step,          ///< the runtime's phases
  MicroBatch,    //
  DataLoading,   //
  Optimizer,     //
};

/// What a collective moves (the args' "moves").
enum class TraceMoves : int32_t { None, Weights, Gradients, GradNorm, Loss };

/// One recorded span. Plain data: ranks send it to rank 0 as bytes.
struct TraceEvent {
  int64_t start, end; ///< nanoseconds since the trace's origin
  int64_t bytes;      ///< collectives: bytes moved (the full buffer)
  int32_t step;       ///< 1-based
  int32_t micro;      ///< the micro-batch, -1 when outside one
  TraceKind kind;
  int32_t index;    ///< see TraceKind
  TraceMoves moves; ///< collectives
  int32_t fromStep; ///< collectives: 1 when the generated step issued it
};

class Tracer {
public:
  /// A trace of steps [first, last] (1-based) of `plan`'s step with
  /// `gradAccum` micro-batches per step, as rank comm.rank(). Every rank
  /// constructs it at the same point: a barrier sets the common origin.
  Tracer(const PlanInfo &plan, int64_t first, int64_t last, int64_t gradAccum,
         Communicator &comm);
  Tracer(const Tracer &) = delete;
  Tracer &operator=(const Tracer &) = delete;

  /// Starts step `step` (1-based): returns this Tracer when the step is
  /// traced, else null (and nothing of it is recorded).
  Tracer *beginStep(int64_t step);
  /// The micro-batch the next spans belong to (-1: none).
  void setMicroBatch(int32_t micro) { currentMicro = micro; }
  /// The hooks the generated step calls (StepContext::trace).
  const TraceHooks *hooks() const { return &table; }

  /// Nanoseconds since the origin.
  int64_t now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() -
                                                                origin)
        .count();
  }
  /// Records a span from `start` to now in the current step and micro-batch.
  void record(TraceKind kind, int64_t start, int32_t index, int64_t bytes = 0,
              TraceMoves moves = TraceMoves::None, bool fromStep = false);

  /// Gathers every rank's events at rank 0, which writes `path` (whole or
  /// not at all, never over an existing file). Every rank calls it; every
  /// rank returns rank 0's error. Rank 0 reports to `log` (may be null).
  Status write(Communicator &comm, const std::string &path, FILE *log);

private:
  using Clock = std::chrono::steady_clock;
  static void beginHook(void *self, int32_t op);
  static void endHook(void *self, int32_t op);

  const PlanInfo &plan;
  int64_t first, last;
  Clock::time_point origin;
  std::vector<TraceEvent> events; ///< reserved once: never reallocates
  int64_t dropped = 0;
  int64_t stepsTraced = 0;
  int32_t currentStep = 0, currentMicro = -1;
  int64_t opStart = 0;
  TraceHooks table;
};

/// A runtime span recorded when it ends (or goes out of scope); nothing when
/// `tracer` is null. On CUDA its end waits for the device first.
class TraceSpan {
public:
  TraceSpan(Tracer *tracer, TraceKind kind, int32_t index = -1,
            int64_t bytes = 0, TraceMoves moves = TraceMoves::None)
      : tracer(tracer), kind(kind), index(index), bytes(bytes), moves(moves),
        start(tracer ? tracer->now() : 0) {}
  TraceSpan(const TraceSpan &) = delete;
  TraceSpan &operator=(const TraceSpan &) = delete;
  ~TraceSpan() { end(); }
  /// Ends the span now (once).
  void end();

private:
  Tracer *tracer;
  TraceKind kind;
  int32_t index;
  int64_t bytes;
  TraceMoves moves;
  int64_t start;
};

/// --trace FILE must not exist yet unless `overwrite` (--overwrite), and its
/// folder must be writable; checked before training.
Status checkTracePath(const std::string &path, bool overwrite);

/// Parses --trace-steps' "A-B" or "A" (1-based, A <= B) into first and last.
Status parseTraceSteps(const std::string &text, int64_t &first, int64_t &last);

} // namespace fastllm::rt

#endif // FASTLLM_RUNTIME_TRACE_H
