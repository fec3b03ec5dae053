//===- FakeModel.cpp - a model with known gradients for runtime tests -----===//

#include "FakeModel.h"

using namespace fastllm::rt;
using namespace fake;

namespace {

ParamInfo params[] = {
    {"embed", 2, {kVocab, kDim}, kVocab *kDim, kEmbedOffset, 1, 1},
    {"bias", 1, {kDim}, kDim, kBiasOffset, 1, 0},
    {"code", 2, {kVocab, kDim}, kVocab *kDim, kCodeOffset, 0, 1},
};

PlanInfo plan;

int64_t alignUp(int64_t x) { return (x + 63) / 64 * 64; }

struct InitialShape {
  InitialShape() { setShape(2, 3); }
} initialShape;

} // namespace

void fake::setShape(int64_t batch, int64_t seq) {
  plan.abiVersion = kAbiVersion;
  plan.target = "cpu";
  plan.batchSize = batch;
  plan.seqLen = seq;
  plan.vocabSize = kVocab;
  plan.tokensInput = "input_ids";
  plan.targetsInput = "labels";
  plan.numParams = 3;
  plan.params = params;
  plan.paramElements = kParamElements;
  int64_t flat = alignUp(kParamElements * sizeof(float));
  int64_t tokenBytes = alignUp(batch * seq * sizeof(int64_t));
  plan.paramsOffset = 0;
  plan.gradsOffset = flat;
  plan.adamMOffset = 2 * flat;
  plan.adamVOffset = 3 * flat;
  plan.tokensOffset = 4 * flat;
  plan.targetsOffset = 4 * flat + tokenBytes;
  plan.activationsOffset = 4 * flat + 2 * tokenBytes;
  plan.activationsBytes = 0;
  plan.activationsUnsharedBytes = 0;
  plan.arenaBytes = plan.activationsOffset;
}

extern "C" const PlanInfo *fastllm_plan() { return &plan; }

extern "C" float fastllm_step(char *arena) {
  const float *p = reinterpret_cast<const float *>(arena + plan.paramsOffset);
  float *g = reinterpret_cast<float *>(arena + plan.gradsOffset);
  const int64_t *tokens =
      reinterpret_cast<const int64_t *>(arena + plan.tokensOffset);
  const int64_t *targets =
      reinterpret_cast<const int64_t *>(arena + plan.targetsOffset);
  int64_t n = plan.batchSize * plan.seqLen;
  double loss = 0;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t d = 0; d < kDim; ++d) {
      float r = p[kEmbedOffset + tokens[j] * kDim + d] + p[kBiasOffset + d] -
                p[kCodeOffset + targets[j] * kDim + d];
      loss += 0.5 * double(r) * r;
      g[kEmbedOffset + tokens[j] * kDim + d] += r / float(n);
      g[kBiasOffset + d] += r / float(n);
    }
  }
  return float(loss / double(n));
}
