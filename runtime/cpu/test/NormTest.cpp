//===- NormTest.cpp - layer and RMS norms -----------------------*- C++ -*-===//
//
// Part of the CPU kernel library's tests: see TestUtil.h.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/test/TestUtil.h"

using namespace fastllm::rt::cpu;
using namespace fastllm::rt::cpu::test;

namespace {

std::vector<double> refLayerNorm(const std::vector<float> &x,
                                 const std::vector<float> &scale,
                                 const float *bias, int64_t rows, int64_t cols,
                                 double eps, bool rms) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x.data() + r * cols;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < cols; ++i)
      mean += xr[i];
    mean = rms ? 0 : mean / cols;
    for (int64_t i = 0; i < cols; ++i)
      var += (xr[i] - mean) * (xr[i] - mean);
    var /= cols;
    for (int64_t i = 0; i < cols; ++i)
      y[r * cols + i] = (xr[i] - mean) / std::sqrt(var + eps) * scale[i] +
                        (bias ? bias[i] : 0.0);
  }
  return y;
}

/// The gradients of Σ dy·layerNorm(x) (or rmsNorm) in double, from the
/// chain rule written out per row.
void refLayerNormGrad(const std::vector<float> &x,
                      const std::vector<float> &scale,
                      const std::vector<float> &dy, int64_t rows, int64_t cols,
                      double eps, bool rms, std::vector<double> &dx,
                      std::vector<double> &dscale, std::vector<double> &dbias) {
  dx.assign(x.size(), 0);
  dscale.assign(cols, 0);
  dbias.assign(cols, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x.data() + r * cols, *gr = dy.data() + r * cols;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < cols; ++i)
      mean += xr[i];
    mean = rms ? 0 : mean / cols;
    for (int64_t i = 0; i < cols; ++i)
      var += (xr[i] - mean) * (xr[i] - mean);
    var /= cols;
    double rstd = 1 / std::sqrt(var + eps);
    // y_i = (x_i - mean)·rstd·s_i; dy_i/dx_j = s_i·rstd·(δij - [!rms]/n
    //        - (x_i - mean)(x_j - mean)·rstd²/n).
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < cols; ++i) {
        double d = (i == j) - (rms ? 0.0 : 1.0 / cols) -
                   (xr[i] - mean) * (xr[j] - mean) * rstd * rstd / cols;
        sum += gr[i] * scale[i] * rstd * d;
      }
      dx[r * cols + j] = sum;
    }
    for (int64_t i = 0; i < cols; ++i) {
      dscale[i] += gr[i] * (xr[i] - mean) * rstd;
      dbias[i] += gr[i];
    }
  }
}

struct NormCase {
  int64_t rows, cols;
};

// Tests layerNorm with and without bias, and rmsNorm, against the
// definitions.
TEST(NormTest, Forward) {
  for (NormCase c : {NormCase{5, 37}, NormCase{64, 768}}) {
    auto x = randomFloats(c.rows * c.cols, 90, -3.f, 5.f);
    auto scale = randomFloats(c.cols, 91), bias = randomFloats(c.cols, 92);
    std::vector<float> y(x.size());
    layerNorm(y.data(), x.data(), scale.data(), bias.data(), c.rows, c.cols,
              1e-5f);
    expectAllClose(
        y, refLayerNorm(x, scale, bias.data(), c.rows, c.cols, 1e-5, false),
        1e-5, 1e-5, "layerNorm");
    layerNorm(y.data(), x.data(), scale.data(), nullptr, c.rows, c.cols, 1e-5f);
    expectAllClose(y,
                   refLayerNorm(x, scale, nullptr, c.rows, c.cols, 1e-5, false),
                   1e-5, 1e-5, "layerNorm without bias");
    rmsNorm(y.data(), x.data(), scale.data(), c.rows, c.cols, 1e-6f);
    expectAllClose(y,
                   refLayerNorm(x, scale, nullptr, c.rows, c.cols, 1e-6, true),
                   1e-5, 1e-5, "rmsNorm");
  }
}

// Tests layerNormGrad and rmsNormGrad against the chain rule in double and
// against finite differences of the forward kernels.
TEST(NormTest, Grad) {
  for (NormCase c : {NormCase{5, 37}, NormCase{200, 300}}) {
    auto x = randomFloats(c.rows * c.cols, 93, -3.f, 5.f);
    auto scale = randomFloats(c.cols, 94), bias = randomFloats(c.cols, 95);
    auto dy = randomFloats(x.size(), 96);
    std::vector<double> wantDx, wantScale, wantBias;
    std::vector<float> dx(x.size()), dscale(c.cols, 9.f), dbias(c.cols, 9.f);
    const float eps = 1e-5f;

    layerNormGrad(dx.data(), dscale.data(), dbias.data(), x.data(),
                  scale.data(), dy.data(), c.rows, c.cols, eps);
    refLayerNormGrad(x, scale, dy, c.rows, c.cols, eps, false, wantDx,
                     wantScale, wantBias);
    expectAllClose(dx, wantDx, 1e-4, 1e-5, "layerNorm dx");
    expectAllClose(dscale, wantScale, 1e-5, 1e-5, "layerNorm dscale");
    expectAllClose(dbias, wantBias, 1e-5, 1e-5, "layerNorm dbias");
    auto lnLoss = [&](const std::vector<float> &xs,
                      const std::vector<float> &ss,
                      const std::vector<float> &bs) {
      std::vector<float> y(xs.size());
      layerNorm(y.data(), xs.data(), ss.data(), bs.data(), c.rows, c.cols, eps);
      return weighted(y, dy);
    };
    checkFiniteDifferences(
        x, dx, [&](const auto &xs) { return lnLoss(xs, scale, bias); }, 1e-2,
        2e-3, "layerNorm dx");
    checkFiniteDifferences(
        scale, dscale, [&](const auto &ss) { return lnLoss(x, ss, bias); },
        1e-2, 2e-3, "layerNorm dscale");
    checkFiniteDifferences(
        bias, dbias, [&](const auto &bs) { return lnLoss(x, scale, bs); }, 1e-2,
        2e-3, "layerNorm dbias");
    layerNormGrad(dx.data(), dscale.data(), nullptr, x.data(), scale.data(),
                  dy.data(), c.rows, c.cols, eps);
    expectAllClose(dscale, wantScale, 1e-5, 1e-5, "layerNorm without dbias");

    rmsNormGrad(dx.data(), dscale.data(), x.data(), scale.data(), dy.data(),
                c.rows, c.cols, eps);
    refLayerNormGrad(x, scale, dy, c.rows, c.cols, eps, true, wantDx, wantScale,
                     wantBias);
    expectAllClose(dx, wantDx, 1e-4, 1e-5, "rmsNorm dx");
    expectAllClose(dscale, wantScale, 1e-5, 1e-5, "rmsNorm dscale");
    auto rmsLoss = [&](const std::vector<float> &xs,
                       const std::vector<float> &ss) {
      std::vector<float> y(xs.size());
      rmsNorm(y.data(), xs.data(), ss.data(), c.rows, c.cols, eps);
      return weighted(y, dy);
    };
    checkFiniteDifferences(
        x, dx, [&](const auto &xs) { return rmsLoss(xs, scale); }, 1e-2, 2e-3,
        "rmsNorm dx");
    checkFiniteDifferences(
        scale, dscale, [&](const auto &ss) { return rmsLoss(x, ss); }, 1e-2,
        2e-3, "rmsNorm dscale");
  }
}

} // namespace
