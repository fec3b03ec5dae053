//===- OptimizerTest.cpp - AdamW, clipping and schedules ------------------===//
//
// The reference here is torch.optim.AdamW's formula written out in double,
// independently of Optimizer.cpp's float arithmetic; the two must agree to
// float rounding over several steps, with decay on, off and on a frozen
// parameter that must stay untouched.
//
//===----------------------------------------------------------------------===//

#include "runtime/Optimizer.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

using namespace fastllm::rt;

namespace {

/// A plan with only parameters: decayed [3, 4], undecayed [5], frozen [2, 2]
/// (rank 2, so weightDecay is set, yet it must not decay) and, optionally, a
/// decayed matrix larger than one optimizer chunk.
struct ParamsOnlyPlan {
  std::vector<ParamInfo> params;
  PlanInfo plan{};

  explicit ParamsOnlyPlan(int64_t bigRows = 0) {
    params.push_back({"w", 2, {3, 4}, 12, 0, 1, 1});
    params.push_back({"b", 1, {5}, 5, 12, 1, 0});
    params.push_back({"frozen", 2, {2, 2}, 4, 17, 0, 1});
    if (bigRows)
      params.push_back({"big", 2, {bigRows, 1000}, bigRows * 1000, 21, 1, 1});
    plan.numParams = params.size();
    plan.params = params.data();
    plan.paramElements = 21 + bigRows * 1000;
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
  const std::vector<float> frozen(p.begin() + 17, p.end());
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
  expectMatchesReference(AdamWConfig{0.9, 0.95, 1e-8, 0.1});
}

TEST(AdamW, MatchesTorchFormulaWithoutDecay) {
  expectMatchesReference(AdamWConfig{0.9, 0.999, 1e-6, 0.0});
}

TEST(AdamW, MatchesTorchFormulaWithLargeLerpWeight) {
  // beta1 < 0.5 takes the other branch of ATen's lerp.
  expectMatchesReference(AdamWConfig{0.3, 0.9, 1e-8, 0.5});
}

TEST(AdamW, FirstStepMovesEachWeightByLr) {
  // After one step m/(1-beta1) = g and sqrt(v/(1-beta2)) = |g|: every
  // trainable weight moves by lr * sign(g) (eps aside), after decay.
  ParamsOnlyPlan fixture;
  std::vector<float> p(21, 1.0f), m(21), v(21), g(21);
  for (int j = 0; j < 21; ++j)
    g[j] = j % 2 ? 0.5f : -2.0f;
  AdamW(fixture.plan, AdamWConfig{0.9, 0.95, 1e-8, 0.1})
      .step(p.data(), g.data(), m.data(), v.data(), 0.01, 1);
  for (int j = 0; j < 21; ++j) {
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
    bool frozen = j >= 17 && j < 21;
    if (frozen)
      g[j] = 1e6f; // a frozen parameter's stale gradient must not count
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
    bool frozen = j >= 17 && j < 21;
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
