//===- TrainTest.cpp - the training loop on a model with known gradients --===//
//
// The fake model's gradient is a closed form (FakeModel.h), so these tests
// recompute a step from the token file and docs/DESIGN.md's sequential formula
// and compare the runtime's dumped gradients, saved weights and logged loss
// with it; they check that bad inputs stop the run before it writes anything,
// and that a run resumed from a checkpoint repeats the uninterrupted one
// exactly.
//
//===----------------------------------------------------------------------===//

#include "FakeModel.h"
#include "TestComm.h"
#include "TestUtil.h"

#include "runtime/Checkpoint.h"
#include "runtime/Json.h"
#include "runtime/Metrics.h"
#include "runtime/Plan.h"
#include "runtime/Safetensors.h"
#include "runtime/Signals.h"
#include "runtime/Train.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

using namespace fastllm::rt;
using namespace fastllm::rt::test;
using namespace fake;

namespace {

/// Where element j of the dp = 1 layout lies.
bool isEmbed(int64_t j) {
  return j >= kEmbedOffset && j < kEmbedOffset + kVocab * kDim;
}
bool isBias(int64_t j) { return j >= kBiasOffset && j < kBiasOffset + kDim; }
bool isCode(int64_t j) {
  return j >= kCodeOffset && j < kCodeOffset + kVocab * kDim;
}
bool isPadding(int64_t j) { return !isEmbed(j) && !isBias(j) && !isCode(j); }

class TrainTest : public ::testing::Test {
protected:
  void SetUp() override { setShape(2, 3); }
  void TearDown() override { setShape(2, 3); }

  const PlanInfo &plan() const { return *fastllm_plan(); }

  /// Writes N(0, 1) weights for every parameter and returns them, flat,
  /// with zero padding.
  std::vector<float> writeWeights(const std::string &path, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<float> flat(kParamElements);
    for (int64_t j = 0; j < kParamElements; ++j)
      flat[j] = isPadding(j) ? 0.0f : normal(rng);
    EXPECT_TRUE(saveParams(path, plan(), flat.data(), false).ok());
    return flat;
  }

  Options options(int64_t steps, double lr) const {
    Options o;
    o.dataPath = dir.file("tokens.u16");
    o.weightsPath = dir.file("init.safetensors");
    o.steps = steps;
    o.lr = lr;
    o.sampler = SamplerKind::Sequential;
    return o;
  }

  /// The trainable (or all) tensors of a file written by the runtime, flat.
  std::vector<float> readFlat(const std::string &path, bool trainableOnly) {
    std::vector<float> flat(kParamElements, 0.0f);
    Expected<SafetensorsReader> r = SafetensorsReader::open(path);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok())
      return flat;
    for (int32_t i = 0; i < plan().numParams; ++i) {
      const ParamInfo &p = plan().params[i];
      if (p.trainable || !trainableOnly)
        EXPECT_TRUE(r->readF32(p.name,
                               std::vector<int64_t>(p.shape, p.shape + p.rank),
                               flat.data() + p.offset)
                        .ok());
    }
    return flat;
  }

  /// Each line of a metrics file, parsed.
  std::vector<JsonValue> readMetrics(const std::string &path) {
    std::vector<JsonValue> lines;
    std::istringstream in(readBytes(path));
    for (std::string line; std::getline(in, line);) {
      // NaN and Infinity (Python's json reads them) as strings, which
      // number() converts.
      for (const char *word : {"-Infinity", "Infinity", "NaN"})
        for (size_t at = 0; (at = line.find(std::string(": ") + word, at)) !=
                            std::string::npos;
             at += 4)
          line.replace(at, 2 + std::strlen(word),
                       std::string(": \"") + word + "\"");
      Expected<JsonValue> v = parseJson(line);
      EXPECT_TRUE(v.ok()) << line;
      if (v.ok())
        lines.push_back(*v);
    }
    return lines;
  }

  TempDir dir;
};

double number(const JsonValue &line, const char *key) {
  return std::stod(line.get(key)->text);
}

/// The fake model's mean loss and gradient over the first step's G sequential
/// samples of T tokens, in double.
struct StepMath {
  double loss = 0;
  std::vector<double> grad = std::vector<double>(kParamElements, 0.0);
};

StepMath firstStepMath(const std::vector<uint16_t> &ids,
                       const std::vector<float> &w, int64_t G, int64_t T) {
  StepMath math;
  int64_t modulus = ids.size() - T - 1;
  double count = double(G * T);
  for (int64_t i = 0; i < G; ++i) {
    int64_t start = (i * T) % modulus;
    for (int64_t k = start; k < start + T; ++k)
      for (int64_t d = 0; d < kDim; ++d) {
        double r = double(w[kEmbedOffset + ids[k] * kDim + d]) +
                   w[kBiasOffset + d] - w[kCodeOffset + ids[k + 1] * kDim + d];
        math.loss += 0.5 * r * r / count;
        math.grad[kEmbedOffset + ids[k] * kDim + d] += r / count;
        math.grad[kBiasOffset + d] += r / count;
      }
  }
  return math;
}

std::vector<uint16_t> randomTokens(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> ids(n);
  for (uint16_t &t : ids)
    t = rng() % kVocab;
  return ids;
}

TEST_F(TrainTest, LossFallsOnALearnableSequence) {
  // Token t is always followed by 5t + 3 mod 16, so the fake model can fit
  // embed[t] + bias = code[next(t)] exactly. 32 tokens a step show it every
  // row of embed.
  setShape(4, 8);
  std::vector<uint16_t> ids(2000);
  for (size_t i = 1; i < ids.size(); ++i)
    ids[i] = (5 * ids[i - 1] + 3) % kVocab;
  writeTokens(dir.file("tokens.u16"), ids);
  writeWeights(dir.file("init.safetensors"), 1);
  Options opts = options(150, 0.05);
  opts.sampler = SamplerKind::Random;
  opts.lrSchedule = LrScheduleKind::Cosine;
  opts.warmupSteps = 5;
  opts.adamw.weightDecay = 0;
  opts.metricsPath = dir.file("metrics.jsonl");
  Status s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  ASSERT_TRUE(s.ok()) << s.message();

  std::vector<JsonValue> lines = readMetrics(opts.metricsPath);
  ASSERT_EQ(lines.size(), 150u);
  LrSchedule schedule{LrScheduleKind::Cosine, 0.05, 5, 150};
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(number(lines[i], "step"), double(i + 1));
    EXPECT_DOUBLE_EQ(number(lines[i], "lr"), schedule.at(i));
    // What the allocator handed out for the arena: the plan's bytes, plus
    // no more than its header, alignment and page rounding add.
    EXPECT_GE(number(lines[i], "mem_bytes"), double(plan().arenaBytes));
    EXPECT_LT(number(lines[i], "mem_bytes"),
              double(plan().arenaBytes + 4096 + 128));
    EXPECT_GT(number(lines[i], "tokens_per_s"), 0);
    EXPECT_GE(number(lines[i], "step_ms"), 0);
    EXPECT_GT(number(lines[i], "grad_norm"), 0);
  }
  double first = number(lines.front(), "loss"),
         last = number(lines.back(), "loss");
  EXPECT_GT(first, 1.0);
  EXPECT_LT(last, 0.02 * first) << "first " << first << " last " << last;
}

TEST_F(TrainTest, GradAccumulationAveragesMicroBatches) {
  const int64_t B = 2, T = 3, A = 2, G = A * B;
  std::vector<uint16_t> ids = randomTokens(101, 2);
  writeTokens(dir.file("tokens.u16"), ids);
  std::vector<float> w = writeWeights(dir.file("init.safetensors"), 3);
  StepMath math = firstStepMath(ids, w, G, T);

  Options opts = options(1, 0.01);
  opts.gradAccum = A;
  opts.dumpGradsPath = dir.file("grads.safetensors");
  opts.saveWeightsPath = dir.file("final.safetensors");
  opts.metricsPath = dir.file("metrics.jsonl");
  Status s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  ASSERT_TRUE(s.ok()) << s.message();

  std::vector<JsonValue> lines = readMetrics(opts.metricsPath);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NEAR(number(lines[0], "loss"), math.loss, 1e-6 * math.loss);
  double norm = 0;
  for (double g : math.grad)
    norm += g * g;
  EXPECT_NEAR(number(lines[0], "grad_norm"), std::sqrt(norm), 1e-6);

  std::vector<float> grads = readFlat(opts.dumpGradsPath, true);
  for (int64_t j = 0; j < kCodeOffset; ++j)
    EXPECT_NEAR(grads[j], math.grad[j], 1e-6) << j;

  // First AdamW step: decay on embed only, then lr * g / (|g| + eps).
  std::vector<float> after = readFlat(opts.saveWeightsPath, false);
  for (int64_t j = 0; j < kParamElements; ++j) {
    double g = math.grad[j];
    double expected = isEmbed(j) ? w[j] * (1 - 0.01 * 0.1) : w[j];
    if (isEmbed(j) || isBias(j))
      expected -= 0.01 * g / (std::abs(g) + 1e-8);
    EXPECT_NEAR(after[j], expected, 1e-6) << j;
  }

  // One micro-batch of 2B samples is the same global batch: same step.
  setShape(G, T);
  Options single = opts;
  single.gradAccum = 1;
  single.dumpGradsPath = dir.file("grads1.safetensors");
  single.saveWeightsPath = dir.file("final1.safetensors");
  single.metricsPath = "";
  s = train(plan(), fastllm_step, single, testComm(), nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<float> grads1 = readFlat(single.dumpGradsPath, true);
  std::vector<float> after1 = readFlat(single.saveWeightsPath, false);
  for (int64_t j = 0; j < kParamElements; ++j) {
    EXPECT_NEAR(grads1[j], grads[j], 1e-6) << j;
    EXPECT_NEAR(after1[j], after[j], 1e-6) << j;
  }
}

TEST_F(TrainTest, StepContextNamesTheSeedStepAndGlobalSamples) {
  // What dropout is keyed by: every micro-batch of B = 2 gets the run's
  // seed, the 0-based step and its first sample's index in the global batch
  // (consecutive micro-batches: 0, 2, 4), the same on every step.
  std::vector<uint16_t> ids = randomTokens(101, 6);
  writeTokens(dir.file("tokens.u16"), ids);
  writeWeights(dir.file("init.safetensors"), 6);
  Options opts = options(2, 0.01);
  opts.gradAccum = 3;
  opts.seed = 0x123456789abcdefull;
  takeStepContexts();
  Status s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<StepContext> got = takeStepContexts();
  ASSERT_EQ(got.size(), 6u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].seed, opts.seed) << i;
    EXPECT_EQ(got[i].step, int64_t(i / 3)) << i;
    EXPECT_EQ(got[i].firstSample, int64_t(i % 3) * 2) << i;
  }
}

TEST_F(TrainTest, DumpsOnlyTheFirstStepsGradients) {
  std::vector<uint16_t> ids = randomTokens(101, 4);
  writeTokens(dir.file("tokens.u16"), ids);
  std::vector<float> w = writeWeights(dir.file("init.safetensors"), 5);
  Options opts = options(3, 0.1);
  opts.dumpGradsPath = dir.file("grads.safetensors");
  ASSERT_TRUE(train(plan(), fastllm_step, opts, testComm(), nullptr).ok());
  StepMath math = firstStepMath(ids, w, 2, 3);
  std::vector<float> grads = readFlat(opts.dumpGradsPath, true);
  for (int64_t j = 0; j < kCodeOffset; ++j)
    EXPECT_NEAR(grads[j], math.grad[j], 1e-6) << j;
}

TEST_F(TrainTest, ClippingScalesGradientsBeforeTheUpdate) {
  std::vector<uint16_t> ids = randomTokens(101, 6);
  writeTokens(dir.file("tokens.u16"), ids);
  std::vector<float> w = writeWeights(dir.file("init.safetensors"), 7);
  StepMath math = firstStepMath(ids, w, 2, 3);
  double norm = 0;
  for (double g : math.grad)
    norm += g * g;
  norm = std::sqrt(norm);

  Options opts = options(1, 0.01);
  opts.clipGradNorm = norm / 3;
  // A large eps makes the first update depend on the gradient's scale.
  opts.adamw.eps = 1.0;
  opts.adamw.weightDecay = 0;
  opts.metricsPath = dir.file("metrics.jsonl");
  opts.saveWeightsPath = dir.file("final.safetensors");
  ASSERT_TRUE(train(plan(), fastllm_step, opts, testComm(), nullptr).ok());

  std::vector<JsonValue> lines = readMetrics(opts.metricsPath);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NEAR(number(lines[0], "grad_norm"), norm, 1e-6); // before clipping
  std::vector<float> after = readFlat(opts.saveWeightsPath, false);
  double coef = (norm / 3) / (norm + 1e-6);
  for (int64_t j = 0; j < kCodeOffset; ++j) {
    double g = math.grad[j] * coef;
    EXPECT_NEAR(after[j], w[j] - 0.01 * g / (std::abs(g) + 1.0), 1e-6) << j;
  }
}

TEST_F(TrainTest, RejectsATokenOutsideTheVocabularyBeforeWriting) {
  std::vector<uint16_t> ids = randomTokens(101, 8);
  ids[50] = kVocab;
  writeTokens(dir.file("tokens.u16"), ids);
  writeWeights(dir.file("init.safetensors"), 9);
  Options opts = options(1, 0.01);
  opts.metricsPath = dir.file("metrics.jsonl");
  Status s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "data file '" + opts.dataPath +
                             "': token 16 at position 50 is not below the "
                             "vocabulary size 16 (is --data-dtype u16 right?)");
  EXPECT_FALSE(std::filesystem::exists(opts.metricsPath));
}

TEST_F(TrainTest, RejectsBadInputsBeforeWriting) {
  writeTokens(dir.file("tokens.u16"), randomTokens(101, 10));
  writeWeights(dir.file("init.safetensors"), 11);
  Options good = options(1, 0.01);
  good.metricsPath = dir.file("metrics.jsonl");
  auto error = [&](const Options &o) {
    Status s = train(plan(), fastllm_step, o, testComm(), nullptr);
    EXPECT_FALSE(s.ok());
    EXPECT_FALSE(std::filesystem::exists(good.metricsPath));
    return s.message();
  };

  Options missing = good;
  missing.dataPath = dir.file("nope.u16");
  EXPECT_EQ(error(missing), "cannot open data file '" + missing.dataPath +
                                "': it does not exist");

  Options odd = good;
  odd.dataDtype = TokenDtype::U32;
  writeTokens(dir.file("odd.u16"), randomTokens(101, 12));
  odd.dataPath = dir.file("odd.u16");
  EXPECT_EQ(error(odd), "data file '" + odd.dataPath +
                            "' has 202 bytes, not a multiple of 4 "
                            "(--data-dtype u32)");

  Options noWeights = good;
  std::vector<float> flat(kParamElements);
  noWeights.weightsPath = dir.file("partial.safetensors");
  ASSERT_TRUE(
      saveParams(noWeights.weightsPath, plan(), flat.data(), true).ok());
  EXPECT_EQ(error(noWeights),
            "weights: '" + noWeights.weightsPath + "' has no tensor 'code'");

  Options noFolder = good;
  noFolder.saveWeightsPath = dir.file("no/such/final.safetensors");
  EXPECT_EQ(error(noFolder), "--save-weights '" + noFolder.saveWeightsPath +
                                 "': cannot write to folder '" +
                                 dir.file("no/such/") +
                                 "': No such file or directory");

  PlanInfo old = plan();
  old.abiVersion = kAbiVersion + 1;
  Status s = train(old, fastllm_step, good, testComm(), nullptr);
  EXPECT_EQ(s.message(), "the model was compiled for runtime ABI " +
                             std::to_string(kAbiVersion + 1) +
                             " but this runtime is ABI " +
                             std::to_string(kAbiVersion) +
                             "; recompile it with this fastllm-opt");
  PlanInfo broken = plan();
  broken.targetsOffset = broken.arenaBytes - 8;
  EXPECT_NE(validatePlan(broken).message().find("targets region"),
            std::string::npos);
  EXPECT_TRUE(validatePlan(plan()).ok());
}

TEST_F(TrainTest, NonFiniteLossStopsTheRunUnlessAllowed) {
  std::vector<float> flat(kParamElements, 0.0f);
  flat[kCodeOffset] = INFINITY; // (a frozen tensor may hold infinities)
  // Every target is token 0, whose code is infinite.
  writeTokens(dir.file("tokens.u16"), std::vector<uint16_t>(101, 0));
  ASSERT_TRUE(
      saveParams(dir.file("init.safetensors"), plan(), flat.data(), false)
          .ok());
  Options opts = options(3, 0.01);
  opts.metricsPath = dir.file("metrics.jsonl");
  Status s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  EXPECT_EQ(s.message(), "loss is infinite at step 1 (pass --allow-nonfinite "
                         "to keep training)");

  opts.allowNonfinite = true;
  opts.overwrite = true; // the first attempt's metrics
  s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  std::string metrics = readBytes(opts.metricsPath);
  EXPECT_NE(metrics.find("{\"step\": 3, \"loss\": Infinity"),
            std::string::npos)
      << metrics;
}

TEST_F(TrainTest, ResumedRunRepeatsTheUninterruptedOneBitForBit) {
  // Everything that carries state from step to step is on: AdamW, warmup,
  // clipping, accumulation, and the random sampler's seed.
  writeTokens(dir.file("tokens.u16"), randomTokens(500, 20));
  writeWeights(dir.file("init.safetensors"), 21);
  Options opts = options(20, 0.05);
  opts.sampler = SamplerKind::Random;
  opts.seed = 7;
  opts.warmupSteps = 3;
  opts.clipGradNorm = 0.5;
  opts.gradAccum = 2;
  opts.checkpointEvery = 5;

  Options full = opts;
  full.checkpointDir = dir.file("full/checkpoints"); // created with parents
  full.metricsPath = dir.file("full.jsonl");
  full.saveWeightsPath = dir.file("full.safetensors");
  Status s = train(plan(), fastllm_step, full, testComm(), nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  for (int step : {5, 10, 15, 20})
    EXPECT_TRUE(std::filesystem::exists(
        full.checkpointDir + "/" + stepFolderName(step) + "/manifest.json"));

  // Killed during step 13 while the checkpoint of step 12 (the last step of
  // that run) was being written: checkpoints 5 and 10, an incomplete 12,
  // metrics through step 12 and a torn line.
  Options killed = opts;
  killed.steps = 12;
  killed.checkpointDir = dir.file("killed");
  killed.metricsPath = dir.file("killed.jsonl");
  s = train(plan(), fastllm_step, killed, testComm(), nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  std::string twelve = killed.checkpointDir + "/" + stepFolderName(12);
  ASSERT_TRUE(std::filesystem::remove(twelve + "/manifest.json"));
  std::ofstream(killed.metricsPath, std::ios::app) << "{\"step\": 13, \"lo";

  Options resumed = killed;
  resumed.steps = 20;
  resumed.resume = true;
  resumed.weightsPath = dir.file("absent.safetensors"); // not read on resume
  resumed.saveWeightsPath = dir.file("resumed.safetensors");
  s = train(plan(), fastllm_step, resumed, testComm(), nullptr);
  ASSERT_TRUE(s.ok()) << s.message();

  std::vector<JsonValue> a = readMetrics(full.metricsPath),
                         b = readMetrics(resumed.metricsPath);
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].get("step")->text, std::to_string(i + 1));
    // The loss with float precision, the norm and lr as exact doubles.
    for (const char *key : {"loss", "grad_norm", "lr"})
      EXPECT_EQ(b[i].get(key)->text, a[i].get(key)->text)
          << key << " at step " << i + 1;
  }
  EXPECT_EQ(readBytes(resumed.saveWeightsPath),
            readBytes(full.saveWeightsPath));
  // Both runs wrote step 20's checkpoint with the same state.
  auto shard = [](const Options &o) {
    return readBytes(o.checkpointDir + "/" + stepFolderName(20) + "/" +
                     shardFileName(0));
  };
  EXPECT_EQ(shard(resumed), shard(full));
}

TEST_F(TrainTest, ResumeNeedsACompleteCheckpointOfTheSamePlan) {
  writeTokens(dir.file("tokens.u16"), randomTokens(200, 22));
  writeWeights(dir.file("init.safetensors"), 23);
  Options opts = options(4, 0.01);
  opts.checkpointDir = dir.file("ckpt");
  opts.resume = true;
  opts.metricsPath = dir.file("resumed.jsonl");
  // No folder yet: --resume starts from the initial weights, like a fresh
  // run, and checkpoints the last step.
  Status s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(std::filesystem::exists(opts.checkpointDir + "/" +
                                      stepFolderName(4) + "/manifest.json"));

  Options first = opts;
  first.resume = false;
  first.checkpointEvery = 2;
  first.checkpointDir = dir.file("ckpt2");
  first.metricsPath = dir.file("fresh.jsonl");
  ASSERT_TRUE(train(plan(), fastllm_step, first, testComm(), nullptr).ok());
  // The same losses: --resume without a checkpoint is a fresh start.
  std::vector<JsonValue> a = readMetrics(opts.metricsPath),
                         b = readMetrics(first.metricsPath);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i].get("loss")->text, b[i].get("loss")->text);
  // Starting afresh among them would leave a later --resume another run's.
  first.overwrite = true; // (its metrics file exists too)
  s = train(plan(), fastllm_step, first, testComm(), nullptr);
  EXPECT_EQ(s.message(), "--checkpoint-dir '" + first.checkpointDir +
                             "' already holds checkpoints (the newest is "
                             "step 4); pass --resume to continue from them or "
                             "choose an empty folder");

  // The same checkpoint read by a binary compiled with another batch size.
  setShape(4, 3);
  s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  EXPECT_EQ(s.message(),
            "--resume: checkpoint '" + opts.checkpointDir + "/" +
                stepFolderName(4) +
                "' was written for a different plan: batch_size is 2 in the "
                "checkpoint but 4 now; resume with the binary that wrote it, "
                "or start a new --checkpoint-dir");

  setShape(2, 3);
  opts.steps = 3;
  s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  EXPECT_EQ(s.message(), "--resume: checkpoint '" + opts.checkpointDir + "/" +
                             stepFolderName(4) +
                             "' is at step 4, past --steps 3");
  opts.steps = 4; // already done: nothing to train, not an error
  s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST_F(TrainTest, RankCountMustMatchTheCompiledDp) {
  setShape(2, 3, 2);
  PlanInfo twoRanks = plan();
  EXPECT_EQ(checkWorldSize(twoRanks, 1).message(),
            "this binary was compiled for --dp 2 but runs on 1 rank");
  EXPECT_EQ(checkWorldSize(twoRanks, 3).message(),
            "this binary was compiled for --dp 2 but runs on 3 ranks");
  EXPECT_TRUE(checkWorldSize(twoRanks, 2).ok());
  Status s =
      train(twoRanks, fastllm_step, options(1, 0.01), testComm(), nullptr);
  EXPECT_EQ(s.message(),
            "this binary was compiled for --dp 2 but runs on 1 rank");
}

TEST_F(TrainTest, ValidationRejectsCorruptPlans) {
  // Each case corrupts one field of a valid dp = 2 plan (stages of 128 and
  // 64 elements) and names what the message must say.
  setShape(2, 3, 2);
  const PlanInfo good = plan();
  ASSERT_TRUE(validatePlan(good).ok()) << validatePlan(good).message();
  StageInfo stages[2] = {good.stages[0], good.stages[1]};
  ParamInfo params[3] = {good.params[0], good.params[1], good.params[2]};
  auto check = [&](const char *what, auto corrupt, const std::string &text) {
    PlanInfo p = good;
    StageInfo st[2] = {stages[0], stages[1]};
    ParamInfo pa[3] = {params[0], params[1], params[2]};
    p.stages = st;
    p.params = pa;
    corrupt(p, st, pa);
    Status s = validatePlan(p);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find(text), std::string::npos)
        << what << ": " << s.message();
  };
  using P = PlanInfo &;
  using S = StageInfo *;
  using A = ParamInfo *;
  // A ZeRO-1 layout labelled ZeRO-2/3 has full arrays it must not have and
  // no slots.
  check(
      "zero stage 2", [](P p, S, A) { p.zeroStage = 2; },
      "ZeRO-2 must have full weights and must not have full gradients");
  check(
      "zero stage 3", [](P p, S, A) { p.zeroStage = 3; },
      "ZeRO-3 must not have full weights and must not have full gradients");
  check(
      "zero-2 without slots",
      [](P p, S, A) {
        p.zeroStage = 2;
        p.gradsOffset = -1;
      },
      "the slot tables do not fit ZeRO-2");
  check(
      "zero stage 0", [](P p, S, A) { p.zeroStage = 0; },
      "invalid model plan: zero stage 0 is not 1, 2 or 3");
  check(
      "dp 0", [](P p, S, A) { p.dataParallel = 0; },
      "data parallelism 0 is not positive");
  check(
      "stage gap", [](P, S s, A) { s[1].offset += 64; },
      "stage 1 [192, +64) does not start where stage 0 ends (128)");
  check(
      "first stage late", [](P, S s, A) { s[0].offset = 64; },
      "stage 0 [64, +128) does not start where the parameters do (0)");
  check(
      "stage not a multiple of dp * 32",
      [](P p, S s, A) {
        s[0].elements = 96;
        s[1].offset = 96;
        p.paramElements = 160;
      },
      "stage 0 [0, +96) is not a multiple of dp * 32 = 64 elements");
  check(
      "stage past the end", [](P, S s, A) { s[1].elements = 128; },
      "stage 1 [128, +128) does not lie inside the 192 parameter elements");
  check(
      "negative stage", [](P, S s, A) { s[1].elements = -64; },
      "does not lie inside");
  check(
      "stages short", [](P p, S, A) { p.numStages = 1; },
      "the stages cover 128 of the 192 parameter elements");
  check(
      "no stage table", [](P p, S, A) { p.stages = nullptr; },
      "a missing table");
  check(
      "param across stages", [](P, S, A a) { a[2].offset = 100; },
      "parameter #2 'code' [100, +64) crosses the end of stage 0 at 128");
  check(
      "params overlap", [](P, S, A a) { a[1].offset = 2; },
      "parameters 'bias' and 'embed' overlap");
  check(
      "duplicate name",
      [](P, S, A a) {
        a[2].name = "embed";
        a[2].nameBytes = 5;
      },
      "parameter #2 'embed' has the name of an earlier parameter");
  // Names are compared by their bytes, NUL included: "embed\0x" is another
  // name than "embed", and a negative length is refused.
  check(
      "negative name length", [](P, S, A a) { a[2].nameBytes = -1; },
      "parameter #2");
  check(
      "param outside", [](P, S, A a) { a[2].offset = 190; },
      "parameter #2 'code' has an inconsistent shape or lies outside");
  check(
      "negative dims",
      [](P, S, A a) {
        a[0].shape[0] = -16;
        a[0].shape[1] = -4;
      },
      "parameter #0 'embed' has an inconsistent shape");
  check(
      "shard outside the arena",
      [](P p, S, A) { p.gradShardOffset = p.arenaBytes - 64; },
      "grad shard region");
  check(
      "shards overlap", [](P p, S, A) { p.adamVOffset = p.adamMOffset + 4; },
      "adam m region");
  check(
      "full arrays overlap",
      [](P p, S, A) { p.gradsOffset = p.paramsOffset + 64; },
      "params region [0, +768) overlaps grads region [64, +768)");
  check(
      "activations over master",
      [](P p, S, A) {
        p.activationsOffset = p.masterOffset;
        p.activationsBytes = 64;
      },
      "master region");
  check(
      "misaligned tokens", [](P p, S, A) { p.tokensOffset += 4; },
      "tokens region");
  check(
      "huge param count", [](P p, S, A) { p.paramElements = INT64_MAX; },
      "parameter elements do not fit the arena");
  check(
      "huge batch", [](P p, S, A) { p.batchSize = INT64_MAX / 2; },
      "tokens region");
  check(
      "null input name", [](P p, S, A) { p.tokensInput = nullptr; },
      "an input name is missing");
}

TEST_F(TrainTest, PaddingStaysZeroAndNothingIsCommunicatedOnOneRank) {
  // The fake step poisons the padding of grads with NaN and counts steps
  // whose params padding is not zero.
  writeTokens(dir.file("tokens.u16"), randomTokens(300, 30));
  writeWeights(dir.file("init.safetensors"), 31);
  Options opts = options(5, 0.05);
  opts.gradAccum = 3;
  opts.clipGradNorm = 0.1;
  opts.metricsPath = dir.file("metrics.jsonl");
  takePaddingViolations();
  ASSERT_TRUE(train(plan(), fastllm_step, opts, testComm(), nullptr).ok());
  EXPECT_EQ(takePaddingViolations(), 0);
  std::vector<JsonValue> lines = readMetrics(opts.metricsPath);
  ASSERT_EQ(lines.size(), 5u);
  for (const JsonValue &line : lines) {
    EXPECT_TRUE(std::isfinite(number(line, "grad_norm")));
    EXPECT_TRUE(std::isfinite(number(line, "loss")));
    for (const char *key :
         {"reduce_scatter_bytes", "all_gather_bytes", "all_reduce_bytes"})
      EXPECT_EQ(number(line, key), 0) << key;
  }
}

/// The state a checkpoint shard holds (master, m, v), without its header.
std::string shardState(const std::string &dir, int64_t step) {
  std::string bytes =
      readBytes(dir + "/" + stepFolderName(step) + "/" + shardFileName(0));
  if (bytes.size() < 16)
    return "";
  uint64_t header;
  std::memcpy(&header, bytes.data() + 8, 8);
  return bytes.substr(16 + header);
}

int64_t manifestOptimizerStep(const std::string &dir, int64_t step) {
  Expected<Manifest> m = parseManifest(
      readBytes(dir + "/" + stepFolderName(step) + "/manifest.json"));
  EXPECT_TRUE(m.ok());
  return m.ok() ? m->optimizerStep : -1;
}

TEST_F(TrainTest, ANonFiniteGradientNormSkipsTheUpdate) {
  writeTokens(dir.file("tokens.u16"), randomTokens(300, 40));
  writeWeights(dir.file("init.safetensors"), 41);
  Options opts = options(2, 0.05);
  opts.clipGradNorm = 1; // clipping must not turn NaN into an update either
  opts.checkpointEvery = 1;

  // Two clean steps: the reference state.
  Options two = opts;
  two.checkpointDir = dir.file("two");
  two.saveWeightsPath = dir.file("two.safetensors");
  ASSERT_TRUE(train(plan(), fastllm_step, two, testComm(), nullptr).ok());

  // The same two steps, then a third whose gradient is NaN (the loss is
  // finite): nothing may change.
  Options three = opts;
  three.steps = 3;
  three.checkpointDir = dir.file("three");
  three.saveWeightsPath = dir.file("three.safetensors");
  three.metricsPath = dir.file("three.jsonl");
  scheduleFaults({2});
  Status s = train(plan(), fastllm_step, three, testComm(), nullptr);
  scheduleFaults({});
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(readBytes(three.saveWeightsPath), readBytes(two.saveWeightsPath));
  // Master weights, m and v, and AdamW's step count.
  EXPECT_EQ(shardState(three.checkpointDir, 3),
            shardState(two.checkpointDir, 2));
  EXPECT_FALSE(shardState(two.checkpointDir, 2).empty());
  EXPECT_EQ(manifestOptimizerStep(three.checkpointDir, 3), 2);
  std::vector<JsonValue> lines = readMetrics(three.metricsPath);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1].get("skipped")->kind, JsonValue::Kind::Bool);
  EXPECT_FALSE(lines[1].get("skipped")->boolean);
  EXPECT_TRUE(lines[2].get("skipped")->boolean);
  EXPECT_TRUE(std::isnan(number(lines[2], "grad_norm")));
  EXPECT_TRUE(std::isfinite(number(lines[2], "loss")));

  // A skip is not a reset: after it, training goes on from the same state
  // with AdamW's next step count (3 updates in 4 steps).
  Options four = three;
  four.steps = 4;
  four.checkpointDir = dir.file("four");
  four.saveWeightsPath = dir.file("four.safetensors");
  four.metricsPath = dir.file("four.jsonl");
  scheduleFaults({2});
  s = train(plan(), fastllm_step, four, testComm(), nullptr);
  scheduleFaults({});
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(manifestOptimizerStep(four.checkpointDir, 4), 3);
  EXPECT_NE(readBytes(four.saveWeightsPath), readBytes(two.saveWeightsPath));
}

TEST_F(TrainTest, TooManySkippedStepsInARowEndTheRun) {
  writeTokens(dir.file("tokens.u16"), randomTokens(300, 42));
  writeWeights(dir.file("init.safetensors"), 43);
  Options opts = options(10, 0.05);
  opts.metricsPath = dir.file("metrics.jsonl");
  // Steps 2, 3 skipped, 4 applied, then 5, 6, 7 skipped: three in a row.
  opts.maxSkippedSteps = 3;
  scheduleFaults({1, 2, 4, 5, 6, 7, 8, 9});
  Status s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  scheduleFaults({});
  EXPECT_EQ(s.message(),
            "the global gradient norm was not finite for 3 consecutive steps "
            "(5 to 7), each skipped; stopping (--max-skipped-steps 3)");
  std::vector<JsonValue> lines = readMetrics(opts.metricsPath);
  ASSERT_EQ(lines.size(), 7u);
  std::string pattern;
  for (const JsonValue &line : lines)
    pattern += line.get("skipped")->boolean ? "S" : ".";
  EXPECT_EQ(pattern, ".SS.SSS");

  // The default is 5.
  Options byDefault = options(10, 0.05);
  scheduleFaults({0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  s = train(plan(), fastllm_step, byDefault, testComm(), nullptr);
  scheduleFaults({});
  EXPECT_NE(s.message().find("for 5 consecutive steps (1 to 5)"),
            std::string::npos)
      << s.message();
}

TEST_F(TrainTest, NoCheckpointHoldsANonFiniteValue) {
  // A trainable weight near float's largest: its gradient is finite, its
  // square is not, so AdamW's v overflows to infinity when the checkpoint
  // is due: the weight's v and that of the bias the same residual reaches.
  // (A weights file holding NaN or inf is refused at load.)
  std::vector<float> flat = writeWeights(dir.file("init.safetensors"), 44);
  flat[kEmbedOffset + 3] = 3e38f;
  ASSERT_TRUE(
      saveParams(dir.file("nan.safetensors"), plan(), flat.data(), false).ok());
  writeTokens(dir.file("tokens.u16"), randomTokens(300, 45));
  Options opts = options(3, 0.05);
  opts.weightsPath = dir.file("nan.safetensors");
  opts.allowNonfinite = true;
  opts.checkpointDir = dir.file("ckpt");
  opts.checkpointEvery = 1;
  Status s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  EXPECT_EQ(s.message(),
            "refusing to write the checkpoint of step 1: the optimizer state "
            "holds values that are not finite (rank and count: 0 (2)); the "
            "newest checkpoint is an earlier one");
  Expected<std::vector<int64_t>> steps =
      listCheckpointSteps(opts.checkpointDir);
  ASSERT_TRUE(steps.ok());
  EXPECT_TRUE(steps->empty());
}

TEST_F(TrainTest, AStopSignalEndsTheStepCheckpointsAndResumesExactly) {
  writeTokens(dir.file("tokens.u16"), randomTokens(400, 46));
  writeWeights(dir.file("init.safetensors"), 47);
  Options opts = options(8, 0.05);
  opts.sampler = SamplerKind::Random;
  opts.seed = 3;
  opts.gradAccum = 2;
  opts.checkpointEvery = 5;

  Options full = opts;
  full.checkpointDir = dir.file("full");
  full.metricsPath = dir.file("full.jsonl");
  ASSERT_TRUE(train(plan(), fastllm_step, full, testComm(), nullptr).ok());

  // SIGTERM arrives during step 3's second micro-batch (call 5), through
  // the real handler: the step finishes, is checkpointed although 3 is not
  // a multiple of 5, and the run returns with the signal.
  installStopHandlers();
  Options cut = opts;
  cut.checkpointDir = dir.file("cut");
  cut.metricsPath = dir.file("cut.jsonl");
  RunOutcome outcome;
  scheduleFaults({}, 5, SIGTERM);
  Status s = train(plan(), fastllm_step, cut, testComm(), nullptr, &outcome);
  scheduleFaults({});
  int signal = stopRequest();
  clearStopRequest();
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGUSR1, SIG_DFL);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(signal, SIGTERM);
  EXPECT_EQ(outcome.stopSignal, SIGTERM);
  EXPECT_EQ(outcome.lastStep, 3);
  EXPECT_EQ(readMetrics(cut.metricsPath).size(), 3u);
  Expected<std::vector<int64_t>> steps =
      listCompleteCheckpointSteps(cut.checkpointDir);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, std::vector<int64_t>{3});

  Options resumed = cut;
  resumed.resume = true;
  s = train(plan(), fastllm_step, resumed, testComm(), nullptr, &outcome);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(outcome.stopSignal, 0);
  std::vector<JsonValue> a = readMetrics(full.metricsPath),
                         b = readMetrics(resumed.metricsPath);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i)
    for (const char *key : {"loss", "grad_norm", "lr"})
      EXPECT_EQ(b[i].get(key)->text, a[i].get(key)->text)
          << key << " at step " << i + 1;
  EXPECT_EQ(shardState(cut.checkpointDir, 8),
            shardState(full.checkpointDir, 8));

  // A stop requested before the first step stops after it.
  requestStop(SIGUSR1);
  Options early = opts;
  early.checkpointDir = dir.file("early");
  s = train(plan(), fastllm_step, early, testComm(), nullptr, &outcome);
  clearStopRequest();
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(outcome.stopSignal, SIGUSR1);
  EXPECT_EQ(outcome.lastStep, 1);
}

TEST_F(TrainTest, KeepLastRemovesOlderCheckpointsOnceANewerIsComplete) {
  writeTokens(dir.file("tokens.u16"), randomTokens(300, 48));
  writeWeights(dir.file("init.safetensors"), 49);
  Options opts = options(7, 0.05);
  opts.checkpointDir = dir.file("ckpt");
  opts.checkpointEvery = 2;
  opts.keepLast = 2;
  // Left by an earlier, killed run: an incomplete step (no manifest) and an
  // orphan temporary of a shard in it; and files not ours: one that merely
  // looks like a temporary (train writes no manifest at the top), and one
  // that does not.
  std::filesystem::create_directories(opts.checkpointDir + "/" +
                                      stepFolderName(1));
  writeBytes(opts.checkpointDir + "/" + stepFolderName(1) +
                 "/rank-00000.bin.tmp-a1B2c3",
             "torn");
  writeBytes(opts.checkpointDir + "/manifest.json.tmp-XyZ123", "torn");
  writeBytes(opts.checkpointDir + "/notes.txt", "mine");
  // A fresh run among incomplete checkpoints only is not refused.
  Status s = train(plan(), fastllm_step, opts, testComm(), nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<std::string> names;
  for (const auto &e : std::filesystem::directory_iterator(opts.checkpointDir))
    names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  // 2, 4, 6 and the last step, 7: the two newest kept; step 1 went with the
  // older ones.
  EXPECT_EQ(names, (std::vector<std::string>{
                       "manifest.json.tmp-XyZ123", "notes.txt",
                       stepFolderName(6), stepFolderName(7), "train.lock",
                       "train.lock.owner"}));
  EXPECT_EQ(readBytes(opts.checkpointDir + "/notes.txt"), "mine");
  EXPECT_EQ(readBytes(opts.checkpointDir + "/manifest.json.tmp-XyZ123"),
            "torn");
}

TEST_F(TrainTest, ASecondJobCannotUseTheSameCheckpointFolder) {
  writeTokens(dir.file("tokens.u16"), randomTokens(300, 50));
  writeWeights(dir.file("init.safetensors"), 51);
  Options opts = options(2, 0.05);
  opts.checkpointDir = dir.file("ckpt");
  opts.checkpointEvery = 1;
  opts.metricsPath = dir.file("metrics.jsonl");
  std::filesystem::create_directory(opts.checkpointDir);
  {
    Expected<CheckpointLock> other =
        CheckpointLock::acquire(opts.checkpointDir);
    ASSERT_TRUE(other.ok()) << other.status().message();
    Status s = train(plan(), fastllm_step, opts, testComm(), nullptr);
    EXPECT_EQ(
        s.message(),
        "--checkpoint-dir '" + opts.checkpointDir +
            "' is in use by another training job (pid " +
            std::to_string(getpid()) + " on " +
            [] {
              char host[256] = {};
              gethostname(host, sizeof(host) - 1);
              return std::string(host);
            }() +
            ") (it holds '" + opts.checkpointDir +
            "/train.lock'); wait for it to end or use another folder");
    EXPECT_FALSE(std::filesystem::exists(opts.metricsPath));
  }
  // Released: the folder is free again, and train() releases it too.
  ASSERT_TRUE(train(plan(), fastllm_step, opts, testComm(), nullptr).ok());
  EXPECT_TRUE(CheckpointLock::acquire(opts.checkpointDir).ok());
}

TEST_F(TrainTest, OutputsAreNeverWrittenThroughLinksOrIntoDevices) {
  writeTokens(dir.file("tokens.u16"), randomTokens(101, 52));
  writeWeights(dir.file("init.safetensors"), 53);
  writeBytes(dir.file("target"), "keep");
  std::filesystem::create_symlink(dir.file("target"), dir.file("link"));
  ASSERT_EQ(mkfifo(dir.file("fifo").c_str(), 0666), 0);
  std::filesystem::create_directory(dir.file("folder"));
  auto error = [&](const char *flag, const std::string &path) {
    Options o = options(1, 0.01);
    if (std::string(flag) == "save-weights")
      o.saveWeightsPath = path;
    else if (std::string(flag) == "metrics")
      o.metricsPath = path;
    else
      o.dumpGradsPath = path;
    Status s = train(plan(), fastllm_step, o, testComm(), nullptr);
    EXPECT_FALSE(s.ok()) << flag << " " << path;
    return s.message();
  };
  const std::string tail =
      "; refusing to replace it (write to a regular file or a new path)";
  EXPECT_EQ(error("save-weights", "/dev/full"),
            "--save-weights: '/dev/full' is a device" + tail);
  EXPECT_EQ(error("save-weights", "/dev/null"),
            "--save-weights: '/dev/null' is a device" + tail);
  EXPECT_EQ(error("save-weights", dir.file("link")),
            "--save-weights: '" + dir.file("link") + "' is a symbolic link" +
                tail);
  EXPECT_EQ(error("save-weights", dir.file("folder")),
            "--save-weights: '" + dir.file("folder") + "' is a directory" +
                tail);
  EXPECT_EQ(error("dump-grads", dir.file("fifo")),
            "--dump-grads: '" + dir.file("fifo") + "' is a FIFO" + tail);
  EXPECT_EQ(error("metrics", dir.file("link")),
            "--metrics: '" + dir.file("link") + "' is a symbolic link" + tail);
  EXPECT_EQ(readBytes(dir.file("target")), "keep");
  EXPECT_TRUE(std::filesystem::is_symlink(dir.file("link")));

  // The metrics file itself, opened for appending on resume, refuses them.
  Expected<MetricsFile> m = MetricsFile::create(dir.file("fifo"), true);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(),
            "metrics file: '" + dir.file("fifo") + "' is a FIFO" + tail);
  m = MetricsFile::create(dir.file("link"), true);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(readBytes(dir.file("target")), "keep");

  // A regular file is replaced whole with --overwrite, and --save-weights
  // says what it wrote.
  writeBytes(dir.file("final.safetensors"), "old");
  Options o = options(1, 0.01);
  o.overwrite = true;
  o.saveWeightsPath = dir.file("final.safetensors");
  char *text = nullptr;
  size_t size = 0;
  FILE *log = open_memstream(&text, &size);
  ASSERT_TRUE(train(plan(), fastllm_step, o, testComm(), log).ok());
  std::fclose(log);
  std::string printed(text, size);
  std::free(text);
  std::string bytes = readBytes(o.saveWeightsPath);
  EXPECT_NE(printed.find("saved weights: '" + o.saveWeightsPath +
                         "' (3 tensors, " + std::to_string(bytes.size()) +
                         " bytes)\n"),
            std::string::npos)
      << printed;
  for (const auto &e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos)
        << e.path();
}

} // namespace

TEST(LogLine, ShowsSmallMfuWithoutRoundingItToZero) {
  StepRecord r;
  r.step = 1;
  r.mfu = 0.3351;
  EXPECT_NE(logLine(r, 10, 0).find("| MFU 33.5% |"), std::string::npos)
      << logLine(r, 10, 0);
  r.mfu = 0.000123;
  EXPECT_NE(logLine(r, 10, 0).find("| MFU 0.012% |"), std::string::npos)
      << logLine(r, 10, 0);
  r.mfu = -1; // no peak known: no MFU at all
  EXPECT_EQ(logLine(r, 10, 0).find("MFU"), std::string::npos);
}

TEST(MetricsFile, ANewFileWithoutOverwriteNeverReplacesOne) {
  // Two runs started at once with the same --metrics: the second to create
  // it finds the first's file there and fails, leaving it and nothing else.
  TempDir dir;
  std::string path = dir.file("m.jsonl");
  writeBytes(path, "{\"step\": 1}\n");
  Expected<MetricsFile> second = MetricsFile::create(path, false, false);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().message(),
            "metrics file: '" + path +
                "' appeared since the run started (another run writing the "
                "same --metrics?) and is left as it is");
  EXPECT_EQ(readBytes(path), "{\"step\": 1}\n");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1);
  ASSERT_TRUE(MetricsFile::create(path, false, true).ok()); // --overwrite
  EXPECT_EQ(readBytes(path), "");
}

TEST(MetricsLine, ReadsEveryLineMetricsJsonWrites) {
  StepRecord r;
  r.step = 7;
  for (double loss : {2.5, 3.14159274, std::nan(""), -double(INFINITY)}) {
    r.loss = loss;
    r.gradNorm = loss; // also non-finite, elsewhere in the line
    Expected<MetricsLine> line = parseMetricsLine(metricsJson(r));
    ASSERT_TRUE(line.ok()) << metricsJson(r) << ": "
                           << line.status().message();
    EXPECT_EQ(line->step, 7u);
    EXPECT_EQ(line->loss, lossText(loss));
  }
  EXPECT_EQ(lossText(std::nan("")), "NaN");
  // Inside a string the words stay as they are; elsewhere JSON still rules.
  Expected<MetricsLine> quoted =
      parseMetricsLine(R"({"step": 2, "note": "NaN \" Infinity", "loss": 1})");
  ASSERT_TRUE(quoted.ok()) << quoted.status().message();
  EXPECT_EQ(quoted->loss, "1");
  EXPECT_FALSE(parseMetricsLine(R"({"step": 2, "loss": NaNx})").ok());
  EXPECT_FALSE(parseMetricsLine(R"({"loss": 1})").ok());
  EXPECT_FALSE(parseMetricsLine(R"({"step": -2, "loss": 1})").ok());
}

namespace {
/// Runs `child` in a forked process and returns its wait status, or -1 when
/// it has not ended within `seconds` (it is killed then).
int runForked(void (*child)(), int seconds) {
  pid_t pid = fork();
  if (pid == 0) {
    child();
    _exit(0);
  }
  for (int i = 0; i < seconds * 20; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return status;
    usleep(50000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}
} // namespace

TEST(StopSignals, BeforeTheFirstStepAStopEndsTheProcessAtOnce) {
  int status = runForked(
      [] {
        installStopHandlers();
        setStopWaitsForStep(false);
        raise(SIGTERM);
        sleep(30); // (loading, stuck)
      },
      10);
  ASSERT_NE(status, -1) << "still running 10 s after SIGTERM";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
}

TEST(StopSignals, AStepThatNeverEndsIsEndedAtTheDeadline) {
  int status = runForked(
      [] {
        installStopHandlers();
        setStopWaitsForStep(true);
        setStopDeadline(1);
        raise(SIGTERM);
        for (;;)
          pause(); // a step stuck in a library: the stop never comes
      },
      10);
  ASSERT_NE(status, -1) << "still running 10 s after SIGTERM";
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGALRM);
}
