//===- Optimizer.cpp - AdamW, clipping, learning-rate schedules -----------===//

#include "runtime/Optimizer.h"

#include <regex.h>

#include "runtime/Plan.h"

#include <algorithm>
#include <cmath>

using namespace fastllm::rt;

/// Elements per chunk: large enough to amortise scheduling, small enough to
/// balance a few big embedding tables against many small vectors.
constexpr int64_t kChunkElements = 1 << 15;

AdamW::AdamW(const PlanInfo &plan, const AdamWConfig &config, int64_t rank)
    : config(config) {
  const StageInfo *stagesEnd = plan.stages + plan.numStages;
  for (int32_t i = 0; i < plan.numParams; ++i) {
    const ParamInfo &p = plan.params[i];
    if (!p.trainable || p.numel == 0)
      continue;
    // The stage that holds the parameter (validatePlan: exactly one).
    const StageInfo *stage = std::upper_bound(
        plan.stages, stagesEnd, p.offset,
        [](int64_t x, const StageInfo &s) { return x < s.offset; });
    ShardSlice slice = shardSlice(plan, int32_t(stage - plan.stages) - 1, rank);
    int64_t begin = std::max(p.offset, slice.fullOffset);
    int64_t end =
        std::min(p.offset + p.numel, slice.fullOffset + slice.elements);
    if (begin >= end)
      continue; // in other ranks' shards
    int64_t at = slice.shardOffset + (begin - slice.fullOffset);
    const bool decay = decays(p, config);
    for (int64_t b = 0; b < end - begin; b += kChunkElements)
      chunks.push_back({at + b, at + std::min(end - begin, b + kChunkElements),
                        decay});
  }
}

namespace {
/// Whether POSIX extended `regex` matches somewhere in `name`.
bool searches(const std::string &regex, const std::string &name) {
  regex_t re;
  if (regcomp(&re, regex.c_str(), REG_EXTENDED | REG_NOSUB) != 0)
    return false; // checked valid when the flag was read
  // REG_STARTEND: the whole name, a NUL in it included.
  regmatch_t span[1] = {{0, regoff_t(name.size())}};
  bool found = regexec(&re, name.c_str(), 1, span, REG_STARTEND) == 0;
  regfree(&re);
  return found;
}
} // namespace

bool fastllm::rt::decays(const ParamInfo &p, const AdamWConfig &config) {
  std::string name = paramName(p);
  bool decay = p.weightDecay != 0;
  if (!config.decayRegex.empty() && searches(config.decayRegex, name))
    decay = true;
  if (!config.noDecayRegex.empty() && searches(config.noDecayRegex, name))
    decay = false;
  return decay;
}

std::string fastllm::rt::checkDecayRegex(const std::string &regex) {
  regex_t re;
  int code = regcomp(&re, regex.c_str(), REG_EXTENDED | REG_NOSUB);
  if (code == 0) {
    regfree(&re);
    return "";
  }
  char why[256];
  regerror(code, &re, why, sizeof(why));
  return why;
}

int64_t AdamW::trainableElements() const {
  int64_t n = 0;
  for (const Chunk &c : chunks)
    n += c.end - c.begin;
  return n;
}

double AdamW::sumOfSquares(const float *grads) const {
  int64_t n = chunks.size();
  std::vector<double> partial(n);
#pragma omp parallel for schedule(dynamic)
  for (int64_t c = 0; c < n; ++c) {
    double sum = 0;
    for (int64_t j = chunks[c].begin; j < chunks[c].end; ++j)
      sum += double(grads[j]) * grads[j];
    partial[c] = sum;
  }
  double total = 0;
  for (double s : partial)
    total += s;
  return total;
}

double AdamW::gradNorm(const float *grads) const {
  return std::sqrt(sumOfSquares(grads));
}

float AdamW::clipCoefficient(double totalNorm, double maxNorm) {
  // torch computes `max_norm / (total_norm + 1e-6)` on an fp32 tensor, and
  // Tensor.__rtruediv__ is reciprocal() * other.
  float coef = (1.0f / (float(totalNorm) + 1e-6f)) * float(maxNorm);
  return coef < 1.0f ? coef : 1.0f;
}

void AdamW::clipGradients(float *grads, double totalNorm,
                          double maxNorm) const {
  float coef = clipCoefficient(totalNorm, maxNorm);
  if (coef == 1.0f)
    return;
  int64_t n = chunks.size();
#pragma omp parallel for schedule(dynamic)
  for (int64_t c = 0; c < n; ++c)
    for (int64_t j = chunks[c].begin; j < chunks[c].end; ++j)
      grads[j] *= coef;
}

AdamWScalars AdamW::scalarsAt(double lr, int64_t t) const {
  // Scalars in double, as torch/optim/adamw.py computes them in Python...
  double biasCorrection1 = 1 - std::pow(config.beta1, double(t));
  double biasCorrection2 = 1 - std::pow(config.beta2, double(t));
  double stepSize = lr / biasCorrection1;
  // ...then rounded to float, as ATen's fp32 kernels take a Python scalar.
  AdamWScalars s;
  s.decay = float(1 - lr * config.weightDecay);
  s.lerpWeight = float(1 - config.beta1);
  s.smallWeight = std::abs(s.lerpWeight) < 0.5f;
  s.beta2 = float(config.beta2);
  s.oneMinusBeta2 = float(1 - config.beta2);
  s.correction2Sqrt = float(std::sqrt(biasCorrection2));
  s.eps = float(config.eps);
  s.negStepSize = float(-stepSize);
  s.anyDecay = config.weightDecay != 0;
  return s;
}

void AdamW::step(float *master, const float *grads, float *m, float *v,
                 double lr, int64_t t) const {
  const AdamWScalars s = scalarsAt(lr, t);
  int64_t n = chunks.size();
#pragma omp parallel for schedule(dynamic)
  for (int64_t c = 0; c < n; ++c) {
    const Chunk &chunk = chunks[c];
    for (int64_t j = chunk.begin; j < chunk.end; ++j)
      adamwUpdate(s, chunk.decay, grads[j], master[j], m[j], v[j]);
  }
}

double LrSchedule::at(int64_t step) const {
  if (step < warmupSteps)
    return lr * double(step + 1) / double(warmupSteps);
  if (kind == LrScheduleKind::Constant)
    return lr;
  double progress = double(step - warmupSteps) /
                    double(std::max<int64_t>(1, totalSteps - warmupSteps));
  return lr * 0.5 * (1 + std::cos(M_PI * progress));
}
