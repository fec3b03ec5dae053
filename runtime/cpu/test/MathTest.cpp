//===- MathTest.cpp - the scalar math ---------------------------*- C++ -*-===//
//
// Part of the CPU kernel library's tests: see TestUtil.h.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/test/TestUtil.h"

using namespace fastllm::rt::cpu;
using namespace fastllm::rt::cpu::test;

namespace {

// Tests that fastExp stays within 3e-7 relative of exp over the whole float
// range, flushes below FLT_MIN and handles ±inf and NaN.
TEST(MathTest, FastExpMatchesLibm) {
  double worst = 0;
  for (float x = -87.3f; x < 88.7f; x += 0.00123f) {
    double want = std::exp(double(x));
    worst = std::max(worst, std::abs(fastExp(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(fastExp(0.f), 1.f);
  EXPECT_EQ(fastExp(-kInfF), 0.f);
  EXPECT_EQ(fastExp(-100.f), 0.f);
  EXPECT_EQ(fastExp(kInfF), kInfF);
  EXPECT_EQ(fastExp(89.f), kInfF);
  EXPECT_TRUE(std::isnan(fastExp(std::nanf(""))));
}

// Tests that fastTanh keeps relative accuracy near 0 and saturates to ±1.
TEST(MathTest, FastTanhMatchesLibm) {
  double worst = 0;
  for (float x = -10.f; x < 10.f; x += 0.000731f) {
    double want = std::tanh(double(x));
    if (want != 0)
      worst = std::max(worst, std::abs(fastTanh(x) - want) / std::abs(want));
  }
  EXPECT_LT(worst, 4e-7);
  EXPECT_FLOAT_EQ(fastTanh(1e-6f), 1e-6f);
  EXPECT_EQ(fastTanh(20.f), 1.f);
  EXPECT_EQ(fastTanh(-kInfF), -1.f);
  EXPECT_TRUE(std::isnan(fastTanh(std::nanf(""))));
}

// Tests that fastErf is within 4e-7 absolute of erf and saturates to ±1.
TEST(MathTest, FastErfMatchesLibm) {
  double worst = 0;
  for (float x = -6.f; x < 6.f; x += 0.000419f)
    worst = std::max(worst, std::abs(fastErf(x) - std::erf(double(x))));
  EXPECT_LT(worst, 4e-7);
  EXPECT_NEAR(fastErf(kInfF), 1.f, 1e-7);
  EXPECT_NEAR(fastErf(-kInfF), -1.f, 1e-7);
  EXPECT_TRUE(std::isnan(fastErf(std::nanf(""))));
}

double refGelu(double x, bool tanhApprox) {
  if (tanhApprox)
    return 0.5 * x *
           (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

// Tests the activation helpers against their textbook definitions.
TEST(MathTest, ActivationsMatchDefinitions) {
  for (float x = -12.f; x < 12.f; x += 0.0137f) {
    double xd = x;
    EXPECT_NEAR(sigmoid(x), 1 / (1 + std::exp(-xd)), 2e-7) << x;
    EXPECT_NEAR(silu(x), xd / (1 + std::exp(-xd)), 1e-6 + 1e-6 * std::abs(xd))
        << x;
    for (bool t : {false, true})
      EXPECT_NEAR(gelu(x, t), refGelu(xd, t), 1e-6 + 1e-6 * std::abs(xd))
          << x << " tanh=" << t;
  }
  EXPECT_EQ(sigmoid(-kInfF), 0.f);
  EXPECT_EQ(sigmoid(kInfF), 1.f);
}

// Tests geluGrad against the analytic derivatives and against central
// differences of the double-precision definitions. Where tanh is within a
// few ulp of ±1, 1 - tanh² is float rounding noise times up to ~10, hence
// the 1e-5 bound.
TEST(MathTest, GeluGradIsTheDerivative) {
  for (float x = -8.f; x < 8.f; x += 0.0173f) {
    double xd = x;
    double pdf = std::exp(-0.5 * xd * xd) / std::sqrt(2 * M_PI);
    double erfForm = 0.5 * (1 + std::erf(xd / std::sqrt(2.0))) + xd * pdf;
    double u = std::sqrt(2 / M_PI) * (xd + 0.044715 * xd * xd * xd);
    double th = std::tanh(u);
    double tanhForm = 0.5 * (1 + th) + 0.5 * xd * (1 - th * th) *
                                           std::sqrt(2 / M_PI) *
                                           (1 + 3 * 0.044715 * xd * xd);
    EXPECT_NEAR(geluGrad(x, 1.5f, false), 1.5 * erfForm, 2e-6) << x;
    EXPECT_NEAR(geluGrad(x, 1.5f, true), 1.5 * tanhForm, 1e-5) << x;
    for (bool t : {false, true}) {
      double h = 1e-5;
      double fd = (refGelu(xd + h, t) - refGelu(xd - h, t)) / (2 * h);
      EXPECT_NEAR(geluGrad(x, 1.f, t), fd, 1e-5) << x << " tanh=" << t;
    }
  }
}

} // namespace
