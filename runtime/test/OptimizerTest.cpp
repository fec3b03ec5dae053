//===- OptimizerTest.cpp - AdamW, clipping and schedules ------------------===//
//
// The reference here is torch.optim.AdamW's formula written out in double,
// independently of Optimizer.cpp's float arithmetic; the two must agree to
// float rounding over several steps, with decay on, off and on a frozen
// parameter that must stay untouched.
//
//===----------------------------------------------------------------------===//

#include "runtime/Optimizer.h"
#include "runtime/Plan.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace fastllm::rt;

namespace {

/// A plan with only parameters: decayed [3, 4], undecayed [5], frozen [2, 2]
/// (rank 2, so weightDecay is set, yet it must not decay) in stage 0 and,
/// optionally, a decayed matrix larger than one optimizer chunk in stage 1.
/// Each stage is padded to a multiple of `pad` elements (dp * 32 unless
/// given) and split among dp ranks.
struct ParamsOnlyPlan {
  std::vector<ParamInfo> params;
  std::vector<StageInfo> stages;
  PlanInfo plan{};

  explicit ParamsOnlyPlan(int64_t bigRows = 0, int32_t dp = 1,
                          int64_t pad = 0) {
    if (!pad)
      pad = dp * 32;
    auto padded = [&](int64_t n) { return (n + pad - 1) / pad * pad; };
    params.push_back({"w", 1, 2, {3, 4}, 12, 0, 1, 1});
    params.push_back({"b", 1, 1, {5}, 5, 12, 1, 0});
    params.push_back({"frozen", 6, 2, {2, 2}, 4, 17, 0, 1});
    stages.push_back({0, padded(21)});
    if (bigRows) {
      int64_t at = stages.back().elements;
      params.push_back(
          {"big", 3, 2, {bigRows, 1000}, bigRows * 1000, at, 1, 1});
      stages.push_back({at, padded(bigRows * 1000)});
    }
    plan.numParams = params.size();
    plan.params = params.data();
    plan.numStages = stages.size();
    plan.stages = stages.data();
    plan.dataParallel = dp;
    plan.zeroStage = 1;
    plan.paramElements = stages.back().offset + stages.back().elements;
  }

  /// Whether element j belongs to a trainable parameter (not to a frozen
  /// one or padding).
  bool trainable(int64_t j) const {
    for (const ParamInfo &p : params)
      if (p.trainable && j >= p.offset && j < p.offset + p.numel)
        return true;
    return false;
  }

  /// Rank r's shard of a full array.
  std::vector<float> shard(const std::vector<float> &full, int64_t r) const {
    std::vector<float> out(shardElements(plan));
    for (int32_t k = 0; k < plan.numStages; ++k) {
      ShardSlice s = shardSlice(plan, k, r);
      std::copy(full.begin() + s.fullOffset,
                full.begin() + s.fullOffset + s.elements,
                out.begin() + s.shardOffset);
    }
    return out;
  }
  /// Writes rank r's shard back into a full array.
  void unshard(const std::vector<float> &shard, int64_t r,
               std::vector<float> &full) const {
    for (int32_t k = 0; k < plan.numStages; ++k) {
      ShardSlice s = shardSlice(plan, k, r);
      std::copy(shard.begin() + s.shardOffset,
                shard.begin() + s.shardOffset + s.elements,
                full.begin() + s.fullOffset);
    }
  }
};

struct Reference {
  std::vector<double> p, m, v;
};

/// torch.optim.AdamW, in double, for one step t on parameter index range.
void referenceStep(Reference &r, const std::vector<float> &g, double lr,
                   int64_t t, const AdamWConfig &c, const PlanInfo &plan) {
  for (int32_t k = 0; k < plan.numParams; ++k) {
    const ParamInfo &info = plan.params[k];
    if (!info.trainable)
      continue;
    for (int64_t j = info.offset; j < info.offset + info.numel; ++j) {
      if (info.weightDecay)
        r.p[j] *= 1 - lr * c.weightDecay;
      r.m[j] = c.beta1 * r.m[j] + (1 - c.beta1) * g[j];
      r.v[j] = c.beta2 * r.v[j] + (1 - c.beta2) * double(g[j]) * g[j];
      double bc1 = 1 - std::pow(c.beta1, t), bc2 = 1 - std::pow(c.beta2, t);
      double denom = std::sqrt(r.v[j]) / std::sqrt(bc2) + c.eps;
      r.p[j] -= lr / bc1 * r.m[j] / denom;
    }
  }
}

void expectMatchesReference(const AdamWConfig &config) {
  ParamsOnlyPlan fixture;
  const PlanInfo &plan = fixture.plan;
  int64_t n = plan.paramElements;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> p(n), m(n), v(n), g(n);
  for (float &x : p)
    x = normal(rng);
  Reference ref{std::vector<double>(p.begin(), p.end()), std::vector<double>(n),
                std::vector<double>(n)};
  const std::vector<float> frozen(p.begin() + 17, p.end()); // and padding
  AdamW adamw(plan, config);
  for (int64_t t = 1; t <= 6; ++t) {
    for (float &x : g)
      x = normal(rng) * (t == 3 ? 1e-3f : 1.0f);
    double lr = 1e-2 * t;
    adamw.step(p.data(), g.data(), m.data(), v.data(), lr, t);
    referenceStep(ref, g, lr, t, config, plan);
    for (int64_t j = 0; j < 17; ++j) {
      EXPECT_NEAR(p[j], ref.p[j], 2e-6 * (1 + std::abs(ref.p[j])))
          << "step " << t << " element " << j;
      EXPECT_NEAR(m[j], ref.m[j], 1e-6 * (1 + std::abs(ref.m[j])));
      EXPECT_NEAR(v[j], ref.v[j], 1e-6 * (1 + std::abs(ref.v[j])));
    }
  }
  EXPECT_EQ(std::vector<float>(p.begin() + 17, p.end()), frozen);
  for (int64_t j = 17; j < n; ++j)
    EXPECT_TRUE(m[j] == 0 && v[j] == 0);
}

TEST(AdamW, MatchesTorchFormulaWithDecay) {
  expectMatchesReference(AdamWConfig{0.9, 0.95, 1e-8, 0.1, {}, {}});
}

TEST(AdamW, MatchesTorchFormulaWithoutDecay) {
  expectMatchesReference(AdamWConfig{0.9, 0.999, 1e-6, 0.0, {}, {}});
}

TEST(AdamW, MatchesTorchFormulaWithLargeLerpWeight) {
  // beta1 < 0.5 takes the other branch of ATen's lerp.
  expectMatchesReference(AdamWConfig{0.3, 0.9, 1e-8, 0.5, {}, {}});
}

TEST(AdamW, FirstStepMovesEachWeightByLr) {
  // After one step m/(1-beta1) = g and sqrt(v/(1-beta2)) = |g|: every
  // trainable weight moves by lr * sign(g) (eps aside), after decay.
  ParamsOnlyPlan fixture;
  int64_t n = fixture.plan.paramElements;
  std::vector<float> p(n, 1.0f), m(n), v(n), g(n);
  for (int j = 0; j < n; ++j)
    g[j] = j % 2 ? 0.5f : -2.0f;
  AdamW(fixture.plan, AdamWConfig{0.9, 0.95, 1e-8, 0.1, {}, {}})
      .step(p.data(), g.data(), m.data(), v.data(), 0.01, 1);
  for (int j = 0; j < n; ++j) { // frozen and padding stay
    float decayed = j < 12 ? 1.0f * (1 - 0.01f * 0.1f) : 1.0f;
    float expected = j >= 17 ? 1.0f : decayed + (j % 2 ? -0.01f : 0.01f);
    EXPECT_NEAR(p[j], expected, 1e-6) << j;
  }
}

TEST(Clipping, NormCoversTrainableGradientsOnly) {
  ParamsOnlyPlan fixture(/*bigRows=*/70); // 70000 elements: several chunks
  const PlanInfo &plan = fixture.plan;
  std::vector<float> g(plan.paramElements);
  double sum = 0;
  for (int64_t j = 0; j < plan.paramElements; ++j) {
    g[j] = float((j % 13) - 6) * 0.01f;
    bool frozen = !fixture.trainable(j);
    if (frozen)
      g[j] = 1e6f; // a frozen parameter's or padding's gradient must not count
    else
      sum += double(g[j]) * g[j];
  }
  AdamW adamw(plan, AdamWConfig{});
  double norm = adamw.gradNorm(g.data());
  EXPECT_NEAR(norm, std::sqrt(sum), 1e-12 * std::sqrt(sum));

  // max_norm above the norm: nothing changes.
  std::vector<float> same = g;
  adamw.clipGradients(same.data(), norm, norm * 2);
  EXPECT_EQ(same, g);

  // max_norm below: trainable gradients scale by max / (norm + 1e-6).
  double maxNorm = norm / 4;
  std::vector<float> clipped = g;
  adamw.clipGradients(clipped.data(), norm, maxNorm);
  double coef = maxNorm / (norm + 1e-6);
  double after = 0;
  for (int64_t j = 0; j < plan.paramElements; ++j) {
    bool frozen = !fixture.trainable(j);
    EXPECT_NEAR(clipped[j], frozen ? g[j] : g[j] * coef, 1e-7) << j;
    if (!frozen)
      after += double(clipped[j]) * clipped[j];
  }
  EXPECT_NEAR(std::sqrt(after), maxNorm, 1e-5 * maxNorm);
}

TEST(Clipping, NormDoesNotDependOnTheThreadCount) {
  // A resumed run must be bit-exact, whatever OMP_NUM_THREADS it gets.
  ParamsOnlyPlan fixture(/*bigRows=*/300);
  std::vector<float> g(fixture.plan.paramElements);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (float &x : g)
    x = normal(rng);
  AdamW adamw(fixture.plan, AdamWConfig{});
  int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  double serial = adamw.gradNorm(g.data());
  omp_set_num_threads(3);
  double parallel = adamw.gradNorm(g.data());
  omp_set_num_threads(threads);
  EXPECT_EQ(serial, parallel);
}

TEST(AdamW, ShardsTogetherRepeatTheWholeArrayExactly) {
  // The big matrix crosses shard boundaries, the small parameters lie in
  // rank 0's shard, and a frozen one sits between them. The elementwise
  // update must not notice the split, and the norm's parts must add up to
  // the whole. Both layouts pad stages to 384 elements (a multiple of dp * 32
  // for every dp here), so their full arrays agree.
  for (int32_t dp : {2, 3, 4}) {
    ParamsOnlyPlan whole(/*bigRows=*/70, 1, 3 * 128);
    ParamsOnlyPlan split(/*bigRows=*/70, dp, 3 * 128);
    ASSERT_EQ(whole.plan.paramElements, split.plan.paramElements);
    const int64_t n = whole.plan.paramElements;
    std::mt19937 rng(dp);
    std::normal_distribution<float> normal;
    std::vector<float> p(n), m(n), v(n), g(n);
    for (float &x : p)
      x = normal(rng);
    for (int64_t j = 0; j < n; ++j) { // padding is zero
      bool inParam = false;
      for (const ParamInfo &info : whole.params)
        inParam = inParam || (j >= info.offset && j < info.offset + info.numel);
      if (!inParam)
        p[j] = 0;
    }
    AdamWConfig config{0.9, 0.95, 1e-8, 0.1, {}, {}};
    AdamW reference(whole.plan, config);
    std::vector<AdamW> ranks;
    std::vector<std::vector<float>> sp, sm, sv;
    for (int r = 0; r < dp; ++r) {
      ranks.emplace_back(split.plan, config, r);
      sp.push_back(split.shard(p, r));
      sm.push_back(std::vector<float>(shardElements(split.plan)));
      sv.push_back(sm.back());
    }
    int64_t trainable = 0;
    for (int r = 0; r < dp; ++r)
      trainable += ranks[r].trainableElements();
    EXPECT_EQ(trainable, reference.trainableElements());
    EXPECT_EQ(trainable, 12 + 5 + 70000);

    for (int64_t t = 1; t <= 3; ++t) {
      for (float &x : g)
        x = normal(rng);
      double total = 0;
      std::vector<std::vector<float>> sg;
      for (int r = 0; r < dp; ++r) {
        sg.push_back(split.shard(g, r));
        total += ranks[r].sumOfSquares(sg[r].data());
      }
      double norm = reference.gradNorm(g.data());
      EXPECT_NEAR(std::sqrt(total), norm, 1e-12 * norm);
      reference.clipGradients(g.data(), norm, 0.5 * norm);
      reference.step(p.data(), g.data(), m.data(), v.data(), 1e-2, t);
      std::vector<float> fp(n), fm(n), fv(n);
      for (int r = 0; r < dp; ++r) {
        ranks[r].clipGradients(sg[r].data(), norm, 0.5 * norm);
        ranks[r].step(sp[r].data(), sg[r].data(), sm[r].data(), sv[r].data(),
                      1e-2, t);
        split.unshard(sp[r], r, fp);
        split.unshard(sm[r], r, fm);
        split.unshard(sv[r], r, fv);
      }
      EXPECT_EQ(fp, p) << "dp " << dp << " step " << t;
      EXPECT_EQ(fm, m) << "dp " << dp << " step " << t;
      EXPECT_EQ(fv, v) << "dp " << dp << " step " << t;
    }
  }
}

TEST(AdamW, DecayRegexesChooseTheParameters) {
  auto param = [](const char *name, int32_t rank) {
    ParamInfo p{};
    p.name = name;
    p.nameBytes = int32_t(std::strlen(name));
    p.rank = rank;
    p.trainable = 1;
    p.weightDecay = rank >= 2;
    return p;
  };
  ParamInfo wte = param("wte.weight", 2), bias = param("h.0.ln_1.bias", 1);
  AdamWConfig config;
  // Today's default: matrices decay, vectors do not.
  EXPECT_TRUE(decays(wte, config));
  EXPECT_FALSE(decays(bias, config));
  // torch.optim.AdamW(model.parameters()): everything decays.
  config.decayRegex = ".*";
  EXPECT_TRUE(decays(bias, config));
  // Parameter groups keeping biases, norms and embeddings out.
  config.noDecayRegex = "bias|ln_|wte|wpe";
  EXPECT_FALSE(decays(wte, config));
  EXPECT_FALSE(decays(bias, config));
  config.decayRegex.clear();
  config.noDecayRegex = "^wte\\.";
  EXPECT_FALSE(decays(wte, config));
  EXPECT_TRUE(decays(param("h.0.mlp.c_fc.weight", 2), config));
  EXPECT_EQ(checkDecayRegex("bias|norm"), "");
  EXPECT_NE(checkDecayRegex("(bias"), "");
}

TEST(Schedule, ConstantWithWarmup) {
  LrSchedule s{LrScheduleKind::Constant, 1e-3, 4, 10};
  EXPECT_DOUBLE_EQ(s.at(0), 0.25e-3);
  EXPECT_DOUBLE_EQ(s.at(1), 0.5e-3);
  EXPECT_DOUBLE_EQ(s.at(3), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);
  LrSchedule flat{LrScheduleKind::Constant, 2e-3, 0, 10};
  EXPECT_DOUBLE_EQ(flat.at(0), 2e-3);
  EXPECT_DOUBLE_EQ(flat.at(9), 2e-3);
}

TEST(Schedule, CosineAfterWarmup) {
  const double pi = std::acos(-1.0);
  LrSchedule s{LrScheduleKind::Cosine, 1.0, 2, 12};
  EXPECT_DOUBLE_EQ(s.at(0), 0.5);
  EXPECT_DOUBLE_EQ(s.at(1), 1.0);
  EXPECT_DOUBLE_EQ(s.at(2), 1.0); // p = 0
  EXPECT_DOUBLE_EQ(s.at(7), 0.5); // p = 5 / 10
  EXPECT_DOUBLE_EQ(s.at(11), 0.5 * (1 + std::cos(pi * 0.9)));
  for (int64_t i = 2; i < 11; ++i)
    EXPECT_GT(s.at(i), s.at(i + 1));
  // All steps warm up: max(1, S - W) keeps p finite.
  LrSchedule all{LrScheduleKind::Cosine, 1.0, 5, 5};
  EXPECT_DOUBLE_EQ(all.at(4), 1.0);
  EXPECT_DOUBLE_EQ(all.at(5), 1.0);
  EXPECT_DOUBLE_EQ(all.at(6), 0.5 * (1 + std::cos(pi)));
}

} // namespace
