//===- Train.cpp - the training loop --------------------------------------===//

#include "runtime/Train.h"

#include "runtime/Data.h"
#include "runtime/Metrics.h"
#include "runtime/Optimizer.h"
#include "runtime/Plan.h"
#include "runtime/Safetensors.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <unistd.h>

using namespace fastllm::rt;

namespace {

/// Data parallelism arrives with MPI; until then this process is the only
/// rank and the data API is already written for dp ranks.
constexpr int64_t kDataParallel = 1, kRank = 0;

/// The folder that will hold `path` must exist and be writable, checked
/// before training so a typo does not cost a finished run its output.
Status checkOutputPath(const char *flag, const std::string &path) {
  if (path.empty())
    return Status();
  size_t slash = path.find_last_of('/');
  std::string dir =
      slash == std::string::npos ? "." : path.substr(0, slash + 1);
  if (access(dir.c_str(), W_OK) != 0)
    return errorf("--%s '%s': cannot write to folder '%s': %s", flag,
                  path.c_str(), dir.c_str(), std::strerror(errno));
  return Status();
}

std::string planSummary(const PlanInfo &plan, const Options &opts) {
  ParamCounts counts = countParams(plan);
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "plan: %s | %lld params (%lld trainable) | arena %.1f MiB | "
                "batch %lld x seq %lld x accum %lld | %lld steps",
                plan.target, (long long)counts.total,
                (long long)counts.trainable, plan.arenaBytes / 1048576.0,
                (long long)plan.batchSize, (long long)plan.seqLen,
                (long long)opts.gradAccum, (long long)opts.steps);
  return buf;
}

} // namespace

Status fastllm::rt::train(const PlanInfo &plan, StepFunction step,
                          const Options &opts, FILE *log) {
  if (Status s = validatePlan(plan); !s.ok())
    return s;
  Expected<TokenFile> data = TokenFile::open(opts.dataPath, opts.dataDtype,
                                             plan.seqLen, plan.vocabSize);
  if (!data)
    return data.status();

  size_t arenaBytes = (plan.arenaBytes + 63) / 64 * 64;
  std::unique_ptr<char, decltype(&std::free)> arena(
      static_cast<char *>(std::aligned_alloc(64, arenaBytes)), &std::free);
  if (!arena)
    return errorf("cannot allocate the model's %lld-byte arena",
                  (long long)plan.arenaBytes);
  std::memset(arena.get(), 0, arenaBytes);
  auto *params = reinterpret_cast<float *>(arena.get() + plan.paramsOffset);
  auto *grads = reinterpret_cast<float *>(arena.get() + plan.gradsOffset);
  auto *adamM = reinterpret_cast<float *>(arena.get() + plan.adamMOffset);
  auto *adamV = reinterpret_cast<float *>(arena.get() + plan.adamVOffset);
  auto *tokens = reinterpret_cast<int64_t *>(arena.get() + plan.tokensOffset);
  auto *targets = reinterpret_cast<int64_t *>(arena.get() + plan.targetsOffset);
  if (Status s = loadParams(opts.weightsPath, plan, params); !s.ok())
    return Status::error("weights: " + s.message());

  for (Status s : {checkOutputPath("metrics", opts.metricsPath),
                   checkOutputPath("dump-grads", opts.dumpGradsPath),
                   checkOutputPath("save-weights", opts.saveWeightsPath)})
    if (!s.ok())
      return s;
  std::optional<MetricsFile> metrics;
  if (!opts.metricsPath.empty()) {
    Expected<MetricsFile> file = MetricsFile::create(opts.metricsPath);
    if (!file)
      return file.status();
    metrics = std::move(*file);
  }

  Sampler sampler(opts.sampler, opts.seed, data->size(), plan.seqLen,
                  plan.batchSize, opts.gradAccum, kDataParallel);
  AdamW adamw(plan, opts.adamw);
  LrSchedule schedule{opts.lrSchedule, opts.lr, opts.warmupSteps, opts.steps};
  const double tokensPerStep = double(sampler.globalBatch()) * plan.seqLen;
  const float gradScale = 1.0f / float(opts.gradAccum);
  if (log)
    std::fprintf(log, "%s\n", planSummary(plan, opts).c_str());

  using Clock = std::chrono::steady_clock;
  double totalSeconds = 0;
  for (int64_t s = 0; s < opts.steps; ++s) {
    Clock::time_point start = Clock::now();
    std::memset(grads, 0, plan.paramElements * sizeof(float));
    double lossSum = 0;
    for (int64_t micro = 0; micro < opts.gradAccum; ++micro) {
      fillMicroBatch(*data, sampler, s, kRank, micro, tokens, targets);
      lossSum += step(arena.get());
    }
    double loss = lossSum / double(opts.gradAccum);
    if (!std::isfinite(loss) && !opts.allowNonfinite)
      return errorf("loss is %s at step %lld (pass --allow-nonfinite to keep "
                    "training)",
                    std::isnan(loss) ? "NaN" : "infinite", (long long)(s + 1));
    if (opts.gradAccum > 1) {
#pragma omp parallel for
      for (int64_t i = 0; i < plan.paramElements; ++i)
        grads[i] *= gradScale;
    }
    if (s == 0 && !opts.dumpGradsPath.empty())
      if (Status st = saveParams(opts.dumpGradsPath, plan, grads,
                                 /*trainableOnly=*/true);
          !st.ok())
        return st;
    double gradNorm = adamw.gradNorm(grads);
    if (opts.clipGradNorm > 0)
      adamw.clipGradients(grads, gradNorm, opts.clipGradNorm);
    double lr = schedule.at(s);
    adamw.step(params, grads, adamM, adamV, lr, s + 1);

    double seconds =
        std::chrono::duration<double>(Clock::now() - start).count();
    totalSeconds += seconds;
    StepRecord record;
    record.step = s + 1;
    record.loss = loss;
    record.lr = lr;
    record.gradNorm = gradNorm;
    record.tokensPerSecond = tokensPerStep / seconds;
    record.stepMs = seconds * 1e3;
    record.memBytes = plan.arenaBytes;
    if (metrics)
      if (Status st = metrics->append(record); !st.ok())
        return st;
    if (log) {
      double eta = totalSeconds / double(s + 1) * double(opts.steps - s - 1);
      std::fprintf(log, "%s\n", logLine(record, opts.steps, eta).c_str());
      std::fflush(log);
    }
  }

  if (!opts.saveWeightsPath.empty())
    if (Status s = saveParams(opts.saveWeightsPath, plan, params,
                              /*trainableOnly=*/false);
        !s.ok())
      return s;
  if (log)
    std::fprintf(log, "done: %lld steps in %s, %.0f tok/s\n",
                 (long long)opts.steps, formatDuration(totalSeconds).c_str(),
                 tokensPerStep * double(opts.steps) / totalSeconds);
  return Status();
}
