//===- TestUtil.h - what the CPU kernel tests share -------------*- C++ -*-===//
//
// The CPU kernel library's tests (runtime/cpu/test/, one source per op
// family) compare every kernel with a naive reference written there from the
// math: plain loops over multi-indices in double precision, sharing no code
// with the kernels. Gradient kernels are also checked against central
// differences of the forward kernels. This header holds the references'
// index arithmetic, the random inputs, the comparisons and the finite
// differences they share, and the softmax reference the softmax and loss
// tests both use.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CPU_TEST_TESTUTIL_H
#define FASTLLM_RUNTIME_CPU_TEST_TESTUTIL_H

#include "runtime/cpu/Kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace fastllm::rt::cpu::test {

using Shape = std::vector<int64_t>;
inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr float kInfF = std::numeric_limits<float>::infinity();

inline int64_t numel(const Shape &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

inline Shape contiguous(const Shape &shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    s *= shape[d];
  }
  return strides;
}

inline Shape unravel(int64_t flat, const Shape &shape) {
  Shape index(shape.size());
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

inline int64_t dot(const Shape &index, const Shape &strides) {
  int64_t s = 0;
  for (size_t d = 0; d < index.size(); ++d)
    s += index[d] * strides[d];
  return s;
}

inline std::vector<float> randomFloats(int64_t n, unsigned seed,
                                       float lo = -2.f, float hi = 2.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(rng);
  return v;
}

/// |got - want| <= atol + rtol·|want| elementwise; NaN and ±inf must match.
template <typename G, typename W>
void expectAllClose(const G &got, const W &want, double rtol, double atol,
                    const std::string &what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = double(got[i]), w = double(want[i]);
    bool ok = std::isnan(w)   ? std::isnan(g)
              : std::isinf(w) ? g == w
                              : std::abs(g - w) <= atol + rtol * std::abs(w);
    if (!ok && failures++ < 8)
      ADD_FAILURE() << what << " element " << i << ": got " << g << ", want "
                    << w;
  }
  EXPECT_EQ(failures, 0) << what;
}

/// Softmax (or log-softmax) of x as [outer, n, inner] along n, in double.
inline std::vector<double> refSoftmax(const std::vector<float> &x,
                                      int64_t outer, int64_t n, int64_t inner,
                                      bool log) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      auto at = [&](int64_t j) { return (o * n + j) * inner + c; };
      double m = -kInf;
      for (int64_t j = 0; j < n; ++j)
        m = std::max(m, double(x[at(j)]));
      double s = 0;
      for (int64_t j = 0; j < n; ++j)
        s += std::exp(x[at(j)] - m);
      for (int64_t j = 0; j < n; ++j)
        y[at(j)] =
            log ? x[at(j)] - m - std::log(s) : std::exp(x[at(j)] - m) / s;
    }
  return y;
}

/// Σ w·f(x) in double: the scalar whose gradient the finite differences take.
inline double weighted(const std::vector<float> &y,
                       const std::vector<float> &w) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i)
    s += double(y[i]) * w[i];
  return s;
}

/// Central differences of x ↦ Σ w·forward(x) at a few elements of x.
inline void checkFiniteDifferences(
    std::vector<float> x, const std::vector<float> &grad,
    const std::function<double(const std::vector<float> &)> &objective,
    double h, double tol, const std::string &what) {
  for (size_t i : {size_t(0), x.size() / 3, x.size() / 2, x.size() - 1}) {
    float saved = x[i], hi = saved + float(h), lo = saved - float(h);
    x[i] = hi;
    double up = objective(x);
    x[i] = lo;
    double down = objective(x);
    x[i] = saved;
    double fd = (up - down) / (double(hi) - double(lo));
    EXPECT_NEAR(grad[i], fd, tol * (1 + std::abs(fd)))
        << what << " element " << i;
  }
}

} // namespace fastllm::rt::cpu::test

#endif // FASTLLM_RUNTIME_CPU_TEST_TESTUTIL_H
