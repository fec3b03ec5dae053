//===- ModelABI.h - what generated code and the runtime agree on -*- C++ -*-===//
//
// The compiler emits one C++ (or CUDA) translation unit per model that
// defines `fastllm_plan()` and `fastllm_step()`; the runtime's main() links
// against it. Everything the runtime needs to know about the model (its
// parameters, the inputs, the memory plan) is in the PlanInfo the generated
// code returns, so the runtime has no MLIR dependency and no per-model code.
//
// Memory: the runtime allocates ONE arena of `arenaBytes` (64-byte aligned)
// and every buffer lives at a fixed byte offset in it, as the static memory
// plan decided:
//
//   params      fp32 [paramElements]   the weights the step reads
//   grads       fp32 [paramElements]   gradient buffer the step adds into
//   master, adamM, adamV, gradShard
//               fp32 [paramElements/dp] this rank's shard of the fp32
//                                       master weights, AdamW moments and
//                                       reduced gradients (ZeRO)
//   tokens      int64 [batch, seq]     the micro-batch's input token ids
//   targets     int64 [batch, seq]     the micro-batch's target token ids
//   the rest    activations and temporaries, shared by liveness
//
// `fastllm_step(arena)` runs forward and backward on the micro-batch in the
// arena, ADDS d(loss)/d(param) into `grads` (the runtime zeroes them before a
// step's first micro-batch and averages over micro-batches) and returns the
// micro-batch loss (mean over its batch*seq tokens). The optimizer, the
// schedule, clipping, the data pipeline and (for ZeRO-1) the collectives
// belong to the runtime: after a step's micro-batches it reduce-scatters
// each stage's gradients into the shard (averaged over dp ranks and
// micro-batches), updates the master shard with AdamW, and all-gathers the
// updated weights into `params`.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_MODELABI_H
#define FASTLLM_RUNTIME_MODELABI_H

#include <cstdint>

namespace fastllm::rt {

constexpr int32_t kAbiVersion = 2;
constexpr int kMaxRank = 8;

struct ParamInfo {
  const char *name;       ///< the ONNX initializer name
  int32_t rank;
  int64_t shape[kMaxRank];
  int64_t numel;
  int64_t offset;         ///< element offset into the flat params/grads arrays
  int32_t trainable;      ///< 0 when frozen (--freeze): no update
  int32_t weightDecay;    ///< 1 when AdamW's decay applies (rank >= 2)
};

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
  int64_t offset;   ///< first element in the flat params/grads arrays
  int64_t elements; ///< padded length
};

struct PlanInfo {
  int32_t abiVersion;     ///< kAbiVersion of the compiler that emitted it
  const char *target;     ///< "cpu" or "cuda"
  int64_t batchSize;      ///< micro-batch per rank (samples)
  int64_t seqLen;         ///< tokens per sample
  int64_t vocabSize;      ///< token ids must be < vocabSize
  const char *tokensInput;  ///< the model input fed with tokens
  const char *targetsInput; ///< the model input fed with next tokens
  int32_t numParams;
  const ParamInfo *params;
  int64_t paramElements;  ///< length of the full params/grads arrays

  // Data parallelism and ZeRO (DESIGN.md section 3).
  int32_t dataParallel;   ///< the --dp compiled for: the job must run this many ranks
  int32_t zeroStage;      ///< 1, 2 or 3
  int32_t numStages;
  const StageInfo *stages;

  // The static memory plan, in bytes.
  int64_t arenaBytes;
  /// Full arrays (paramElements fp32 each): the weights the step reads and
  /// the gradients it adds into.
  int64_t paramsOffset, gradsOffset;
  /// This rank's shards (paramElements / dataParallel fp32 each): fp32
  /// master weights, AdamW moments, and the reduced gradient.
  int64_t masterOffset, adamMOffset, adamVOffset, gradShardOffset;
  int64_t tokensOffset, targetsOffset;
  int64_t activationsOffset, activationsBytes; ///< the liveness-shared region
  int64_t activationsUnsharedBytes; ///< sum of all activation sizes, for reports
};

} // namespace fastllm::rt

extern "C" {
/// The plan of the model this binary was compiled for.
const fastllm::rt::PlanInfo *fastllm_plan();
/// One forward+backward over the micro-batch in the arena (see above).
float fastllm_step(char *arena);
}

#endif // FASTLLM_RUNTIME_MODELABI_H
