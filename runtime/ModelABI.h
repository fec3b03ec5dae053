//===- ModelABI.h - what generated code and the runtime agree on -*- C++
//-*-===//
//
// The compiler emits one C++ (or CUDA) translation unit per model that
// defines `fastllm_plan()` and `fastllm_step()`; the runtime's main() links
// against it. Everything the runtime needs to know about the model (its
// parameters, the inputs, the memory plan) is in the PlanInfo the generated
// code returns, so the runtime has no MLIR dependency and no per-model code.
//
// Memory: the runtime allocates ONE arena of `arenaBytes` (64-byte aligned)
// and every buffer lives at a fixed byte offset in it, as the static memory
// plan decided (docs/DESIGN.md section 3 for the ZeRO stages):
//
//   params      fp32 [paramElements]   ZeRO-1/2: the weights the step reads
//   weight slots                       ZeRO-3: stages' full weights, gathered
//                                      by the step (round-robin, + tie slots)
//   grads       fp32 [paramElements]   ZeRO-1: the gradients the step adds
//   grad slots                         ZeRO-2/3: a stage's gradients for one
//                                      micro-batch, reduce-scattered by the
//                                      step
//   master, adamM, adamV, gradShard
//               fp32 [paramElements/dp] this rank's shard of the fp32
//                                       master weights, AdamW moments and
//                                       reduced gradients
//   tokens      int64 [batch, seq]     the micro-batch's input token ids
//   targets     int64 [batch, seq]     the micro-batch's target token ids
//   the rest    activations and temporaries, shared by liveness
//
// `fastllm_step(arena, comm, context)` runs forward and backward on the
// micro-batch in the arena and returns its loss (mean over its batch*seq
// tokens). `context` says which step and samples the micro-batch is, which
// keys the random ops (dropout: runtime/Philox.h). ZeRO-1:
// it ADDS d(loss)/d(param) into `grads` (the runtime zeroes them before a
// step's first micro-batch), and after the step's micro-batches the runtime
// reduce-scatters each stage's gradients into the shard (the mean over dp
// ranks and micro-batches). ZeRO-2/3: the step itself starts and waits the
// collectives through `comm`: each stage's gradients are reduce-scattered
// into gradShard (which the runtime zeroes before the first micro-batch)
// after its backward, and ZeRO-3 gathers the weights into slots before they
// are read. The optimizer, the schedule, clipping and the data pipeline
// belong to the runtime, which all-gathers the updated master shards into
// `params` after each optimizer step (ZeRO-1/2).
//
// Tracing (train --trace): every kernel call of the step is one entry of
// PlanInfo::traceOps, in program order. When `context->trace` is not null
// the step calls its begin and end around each of them; when it is null the
// step costs one pointer test per kernel call more than without tracing.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_MODELABI_H
#define FASTLLM_RUNTIME_MODELABI_H

#include <cstdint>
#include <string>

namespace fastllm::rt {

constexpr int32_t kAbiVersion = 9;
constexpr int kMaxRank = 8;

struct ParamInfo {
  /// The ONNX initializer name: `nameBytes` bytes of UTF-8, which may hold
  /// any character, NUL included (use paramName()).
  const char *name;
  int32_t nameBytes;
  int32_t rank;
  int64_t shape[kMaxRank];
  int64_t numel;
  int64_t offset;      ///< element offset into the flat params/grads
                       ///< arrays, or into `frozen` when not trainable
  int32_t trainable;   ///< 0 when frozen (--freeze): no update
  int32_t weightDecay; ///< 1 when AdamW's decay applies (rank >= 2)
};

/// A parameter's name, exactly as the model spells it.
inline std::string paramName(const ParamInfo &p) {
  return p.name && p.nameBytes > 0 ? std::string(p.name, size_t(p.nameBytes))
                                   : std::string();
}

/// A stage's slice of the flat parameter (and gradient) arrays. Its length is
/// padded to a multiple of dp * 32 elements, so the stage splits into dp
/// equal shards; rank r owns elements [offset + r * elements / dp, ... +
/// elements / dp), stored in the shard arrays at offset / dp + ... .
///
/// The runtime's validatePlan requires: the stages tile [0, paramElements)
/// in table order (stage 0 at 0, each starting where the previous ends);
/// every parameter lies inside one stage and overlaps no other; the regions
/// of PlanInfo lie inside the arena and do not overlap. Elements covered by
/// no parameter are padding: the runtime keeps them zero in params, and
/// ignores them in grads (the step need not write them).
struct StageInfo {
  int64_t offset;     ///< first element in the flat params/grads arrays
  int64_t elements;   ///< padded length
  int32_t gradSlot;   ///< ZeRO-2/3: the gradient slot it uses, else -1
  int32_t weightSlot; ///< ZeRO-3: the weight slot it uses, else -1
};

/// A buffer that holds one stage at a time. A gradient slot is reduced in
/// place: its reduce-scatter leaves this rank's part at its start.
struct SlotInfo {
  int64_t offset;   ///< bytes into the arena
  int64_t elements; ///< fp32 elements: the largest stage it serves
};

/// One kernel call of the step, as a trace names it.
struct TraceOp {
  const char *name; ///< the op's name without its dialect: "matmul", ...
  int32_t stage;    ///< the op's model.stage, -1 when it has none
  int32_t layer;    ///< the op's model.layer, -1 when it has none
  int32_t backward; ///< 1: built by autodiff (the backward phase), else 0
};

/// The model's plan. Its scalars are one member per line of
/// runtime/PlanFields.def (read it for what each means; the compiler's
/// MemoryPlan has the same members); then what only the runtime's view has:
/// the target, the inputs' names and the tables.
///
/// The static memory plan puts every buffer at a fixed byte offset in the
/// arena of `arenaBytes`; full arrays hold paramElements fp32 each (-1 when
/// the ZeRO stage uses slots instead), this rank's shards paramElements /
/// dataParallel each. Frozen parameters (--freeze) have an array of their
/// own (-1: none), whole on every rank, read by the step and never reduced,
/// sharded or updated. The traffic is what one rank's collectives move, as
/// the compiler proved the schedule.
struct PlanInfo {
  /// kAbiVersion of the compiler that emitted it: first, so that a runtime
  /// of another version reads it whatever else changed.
  int32_t abiVersion;
#define FASTLLM_PLAN_FIELD(type, name, key, none, part, doc) type name;
#include "runtime/PlanFields.def"
  const char *target;       ///< "cpu" or "cuda"
  const char *tokensInput;  ///< the model input fed with tokens
  const char *targetsInput; ///< the model input fed with next tokens
  int32_t numParams;
  const ParamInfo *params;
  int32_t numStages;
  const StageInfo *stages;
  int32_t numGradSlots;
  const SlotInfo *gradSlots;
  int32_t numWeightSlots;
  const SlotInfo *weightSlots;
  int32_t numTraceOps;     ///< the step's kernel calls
  const TraceOp *traceOps; ///< [numTraceOps], in program order
};

/// The collectives a ZeRO-2/3 step starts and waits. The runtime provides
/// them (MPI on CPUs); a call that fails ends the job with a message, so
/// they return no error.
struct Collectives {
  void *context;
  /// Starts gathering every rank's shard of stage `stage`'s master weights
  /// into weight slot `slot`; returns the request to wait.
  int32_t (*allGather)(void *context, int32_t stage, int32_t slot);
  /// Starts reducing gradient slot `slot` (stage `stage`'s gradients) into
  /// this rank's gradShard: when waited, gradShard += the mean over ranks
  /// and micro-batches of this rank's part.
  int32_t (*reduceScatter)(void *context, int32_t stage, int32_t slot);
  void (*wait)(void *context, int32_t request);
};

/// What a step's random ops are keyed by, so that a sample draws the same
/// dropout masks whatever the data parallelism, micro-batching or ZeRO stage
/// (runtime/Philox.h): row i of the micro-batch is global sample
/// `firstSample + i` of the step (Sampler::sampleIndex; samples of a
/// micro-batch are consecutive).
/// The runtime's trace recorder (train --trace): the step calls begin(op)
/// just before kernel call `op` (an index into PlanInfo::traceOps) and
/// end(op) just after it. On CUDA, end waits for the kernel to finish, so
/// that a span is the kernel's real time.
struct TraceHooks {
  void *context;
  void (*begin)(void *context, int32_t op);
  void (*end)(void *context, int32_t op);
};

struct StepContext {
  uint64_t seed;       ///< the run's --seed
  int64_t step;        ///< 0-based optimizer step
  int64_t firstSample; ///< global index in the step's batch of row 0
  /// Null unless this micro-batch is traced (see TraceHooks).
  const TraceHooks *trace;
  /// True for a validation batch (train --val-data): dropout is the
  /// identity, as in PyTorch's model.eval(); the step's gradients are
  /// discarded by the runtime.
  bool evaluating;
};

} // namespace fastllm::rt

extern "C" {
/// The plan of the model this binary was compiled for.
const fastllm::rt::PlanInfo *fastllm_plan();
/// One forward+backward over the micro-batch in the arena (see above).
float fastllm_step(char *arena, const fastllm::rt::Collectives *comm,
                   const fastllm::rt::StepContext *context);
}

#endif // FASTLLM_RUNTIME_MODELABI_H
