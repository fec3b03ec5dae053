//===- FakeModel.cpp - a model with known gradients for runtime tests -----===//

#include "FakeModel.h"

#include <cmath>
#include <csignal>
#include <initializer_list>
#include <utility>

using namespace fastllm::rt;
using namespace fake;

namespace {

ParamInfo params[] = {
    {"embed", 5, 2, {kVocab, kDim}, kVocab *kDim, 0, 1, 1},
    {"bias", 4, 1, {kDim}, kDim, 0, 1, 0},
    {"code", 4, 2, {kVocab, kDim}, kVocab *kDim, 0, 0, 1},
};
StageInfo stages[2];
PlanInfo plan;
int64_t paddingViolations = 0;
std::vector<int64_t> nanCalls;
int64_t calls = 0, signalCall = -1;
int signalToRaise = 0;
std::vector<StepContext> contexts;

int64_t alignUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

struct InitialShape {
  InitialShape() { setShape(2, 3); }
} initialShape;

} // namespace

Layout fake::layout(int64_t dp) {
  Layout l;
  l.bias = 0;
  l.embed = kDim;
  l.stage1 = alignUp(kDim + kVocab * kDim, dp * 32);
  l.code = l.stage1;
  l.paramElements = l.stage1 + alignUp(kVocab * kDim, dp * 32);
  return l;
}

static_assert(kCodeOffset == 96 && kParamElements == 160);

void fake::setShape(int64_t batch, int64_t seq, int64_t dp) {
  Layout l = layout(dp);
  params[0].offset = l.embed;
  params[1].offset = l.bias;
  params[2].offset = l.code;
  stages[0] = {0, l.stage1, -1, -1};
  stages[1] = {l.stage1, l.paramElements - l.stage1, -1, -1};

  plan = PlanInfo();
  plan.abiVersion = kAbiVersion;
  plan.target = "cpu";
  plan.batchSize = batch;
  plan.seqLen = seq;
  plan.vocabSize = kVocab;
  plan.tokensInput = "input_ids";
  plan.targetsInput = "labels";
  plan.numParams = 3;
  plan.params = params;
  plan.paramElements = l.paramElements;
  plan.dataParallel = int32_t(dp);
  plan.zeroStage = 1;
  plan.numStages = 2;
  plan.stages = stages;
  int64_t full = alignUp(l.paramElements * sizeof(float), 64);
  int64_t shard = alignUp(l.paramElements / dp * sizeof(float), 64);
  int64_t tokenBytes = alignUp(batch * seq * sizeof(int64_t), 64);
  int64_t at = 0;
  for (int64_t *region : {&plan.paramsOffset, &plan.gradsOffset}) {
    *region = at;
    at += full;
  }
  for (int64_t *region : {&plan.masterOffset, &plan.adamMOffset,
                          &plan.adamVOffset, &plan.gradShardOffset}) {
    *region = at;
    at += shard;
  }
  plan.tokensOffset = at;
  plan.targetsOffset = at + tokenBytes;
  plan.activationsOffset = at + 2 * tokenBytes;
  plan.activationsBytes = 0;
  plan.activationsUnsharedBytes = 0;
  plan.arenaBytes = plan.activationsOffset;
  // ZeRO-1: one reduce-scatter and one all-gather of the whole layout.
  plan.reduceScatterBytesPerStep = dp > 1 ? l.paramElements * 4 : 0;
  plan.allGatherBytesPerStep = plan.reduceScatterBytesPerStep;
}

int64_t fake::takePaddingViolations() {
  int64_t n = paddingViolations;
  paddingViolations = 0;
  return n;
}

void fake::scheduleFaults(std::vector<int64_t> nanGradient, int64_t signalAt,
                          int signal) {
  nanCalls = std::move(nanGradient);
  calls = 0;
  signalCall = signalAt;
  signalToRaise = signal;
}

std::vector<StepContext> fake::takeStepContexts() {
  return std::exchange(contexts, {});
}

extern "C" const PlanInfo *fastllm_plan() { return &plan; }

extern "C" float fastllm_step(char *arena, const Collectives *,
                              const StepContext *context) {
  contexts.push_back(*context);
  const float *p = reinterpret_cast<const float *>(arena + plan.paramsOffset);
  float *g = reinterpret_cast<float *>(arena + plan.gradsOffset);
  const int64_t *tokens =
      reinterpret_cast<const int64_t *>(arena + plan.tokensOffset);
  const int64_t *targets =
      reinterpret_cast<const int64_t *>(arena + plan.targetsOffset);
  const int64_t embed = params[0].offset, bias = params[1].offset,
                code = params[2].offset;

  // Padding: after embed to stage 1, after code to the end.
  bool clean = true;
  for (auto [begin, end] :
       {std::pair{embed + kVocab * kDim, code},
        std::pair{code + kVocab * kDim, plan.paramElements}})
    for (int64_t j = begin; j < end; ++j) {
      clean = clean && p[j] == 0.0f && !std::signbit(p[j]);
      g[j] = NAN;
    }
  paddingViolations += !clean;

  const int64_t call = calls++;
  if (call == signalCall)
    std::raise(signalToRaise);
  bool poisoned = false;
  for (int64_t c : nanCalls)
    poisoned = poisoned || c == call;
  if (poisoned)
    g[bias] += NAN;

  int64_t n = plan.batchSize * plan.seqLen;
  double loss = 0;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t d = 0; d < kDim; ++d) {
      float r = p[embed + tokens[j] * kDim + d] + p[bias + d] -
                p[code + targets[j] * kDim + d];
      loss += 0.5 * double(r) * r;
      g[embed + tokens[j] * kDim + d] += r / float(n);
      g[bias + d] += r / float(n);
    }
  }
  return float(loss / double(n));
}
