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
//   params      fp32 [paramElements]   the weights (fp32 master weights)
//   grads       fp32 [paramElements]   gradient accumulator
//   adamM/adamV fp32 [paramElements]   AdamW moments
//   tokens      int64 [batch, seq]     the micro-batch's input token ids
//   targets     int64 [batch, seq]     the micro-batch's target token ids
//   the rest    activations and temporaries, shared by liveness
//
// `fastllm_step(arena)` runs forward and backward on the micro-batch in the
// arena, ADDS d(loss)/d(param) into `grads` (the runtime zeroes them before a
// step's first micro-batch and averages over micro-batches) and returns the
// micro-batch loss (mean over its batch*seq tokens). The optimizer, the
// schedule, clipping and the data pipeline belong to the runtime.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_MODELABI_H
#define FASTLLM_RUNTIME_MODELABI_H

#include <cstdint>

namespace fastllm::rt {

constexpr int32_t kAbiVersion = 1;
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
  int64_t paramElements;  ///< length of the flat params/grads/m/v arrays

  // The static memory plan, in bytes.
  int64_t arenaBytes;
  int64_t paramsOffset, gradsOffset, adamMOffset, adamVOffset;
  int64_t tokensOffset, targetsOffset;
  int64_t activationsOffset, activationsBytes; ///< the liveness-shared region
  int64_t activationsUnsharedBytes; ///< sum of all activation sizes, for reports

  /// The --dp the model was compiled for; the job must run that many ranks.
  /// 0 (generated code that predates the field) means 1.
  int64_t dataParallel;
};

} // namespace fastllm::rt

extern "C" {
/// The plan of the model this binary was compiled for.
const fastllm::rt::PlanInfo *fastllm_plan();
/// One forward+backward over the micro-batch in the arena (see above).
float fastllm_step(char *arena);
}

#endif // FASTLLM_RUNTIME_MODELABI_H
