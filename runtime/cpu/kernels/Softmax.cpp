//===- Softmax.cpp - softmax and log-softmax --------------------*- C++ -*-===//
//
// runtime/KernelApi.inc's softmax and softmaxGrad for the CPU library
// (float): rows along the last dim (inner = 1) one at a time with laneSum,
// other dims in bands of columns vectorized across the columns.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/kernels/Common.h"

#include <cmath>

namespace fastllm::rt::cpu {

namespace {
/// Columns processed together when softmax runs along a non-last dim.
constexpr int64_t kSoftmaxBand = 256;

/// Softmax along n of x[j·inner + i] for the band of columns i < len ≤
/// kSoftmaxBand, vectorized across the columns.
void softmaxBand(float *y, const float *x, int64_t n, int64_t inner,
                 int64_t len, bool log) {
  float m[kSoftmaxBand], s[kSoftmaxBand];
  std::fill_n(m, len, -std::numeric_limits<float>::infinity());
  std::fill_n(s, len, 0.f);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < len; ++i)
      m[i] = maxNan(m[i], x[j * inner + i]);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < len; ++i) {
      float e = fastExp(x[j * inner + i] - m[i]);
      s[i] += e;
      if (!log)
        y[j * inner + i] = e;
    }
  for (int64_t i = 0; i < len; ++i)
    s[i] = log ? std::log(s[i]) : 1.f / s[i];
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < len; ++i) {
      float &v = y[j * inner + i];
      v = log ? (x[j * inner + i] - m[i]) - s[i] : v * s[i];
    }
}

/// softmaxGrad for one band of columns, as softmaxBand.
void softmaxGradBand(float *dx, const float *y, const float *dy, int64_t n,
                     int64_t inner, int64_t len, bool log) {
  double s[kSoftmaxBand];
  std::fill_n(s, len, 0.0);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < len; ++i) {
      int64_t at = j * inner + i;
      s[i] += log ? double(dy[at]) : double(dy[at]) * y[at];
    }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < len; ++i) {
      int64_t at = j * inner + i;
      float si = static_cast<float>(s[i]);
      dx[at] = log ? dy[at] - fastExp(y[at]) * si : y[at] * (dy[at] - si);
    }
}

/// Runs band(offset, len) over every band of columns of [outer, n, inner].
template <typename Band>
void forEachBand(int64_t outer, int64_t n, int64_t inner, Band band) {
  const int64_t bands = (inner + kSoftmaxBand - 1) / kSoftmaxBand;
  parallelFor(outer * bands, outer * n * inner,
              [&](int64_t begin, int64_t end) {
                for (int64_t task = begin; task < end; ++task) {
                  int64_t o = task / bands, c0 = task % bands * kSoftmaxBand;
                  band(o * n * inner + c0, std::min(kSoftmaxBand, inner - c0));
                }
              });
}
} // namespace

template <typename T>
void softmax(T *y, const T *x, int64_t outer, int64_t n, int64_t inner,
             bool log) {
  if (inner > 1)
    return forEachBand(outer, n, inner, [&](int64_t offset, int64_t len) {
      softmaxBand(y + offset, x + offset, n, inner, len, log);
    });
  parallelFor(outer, outer * n, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float *xr = x + row * n;
      float *yr = y + row * n;
      if (log) {
        // (x - m) - log Σ: the first difference is exact near the max.
        auto [m, sum] = rowMaxExpSum(xr, n);
        float logSum = std::log(sum);
        for (int64_t i = 0; i < n; ++i)
          yr[i] = (xr[i] - m) - logSum;
        continue;
      }
      float m = rowMax(xr, n);
      float inv = 1.f / laneSum<float>(n, [&](int64_t i) {
                    return yr[i] = fastExp(xr[i] - m);
                  });
      for (int64_t i = 0; i < n; ++i)
        yr[i] *= inv;
    }
  });
}

template <typename T>
void softmaxGrad(T *dx, const T *y, const T *dy, int64_t outer, int64_t n,
                 int64_t inner, bool log) {
  if (inner > 1)
    return forEachBand(outer, n, inner, [&](int64_t offset, int64_t len) {
      softmaxGradBand(dx + offset, y + offset, dy + offset, n, inner, len, log);
    });
  parallelFor(outer, outer * n, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float *yr = y + row * n, *gr = dy + row * n;
      float *dr = dx + row * n;
      if (log) {
        float s = static_cast<float>(
            laneSum<double>(n, [&](int64_t i) { return gr[i]; }));
        for (int64_t i = 0; i < n; ++i)
          dr[i] = gr[i] - fastExp(yr[i]) * s;
      } else {
        float s = static_cast<float>(laneSum<double>(
            n, [&](int64_t i) { return double(gr[i]) * yr[i]; }));
        for (int64_t i = 0; i < n; ++i)
          dr[i] = yr[i] * (gr[i] - s);
      }
    }
  });
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_FLOAT_TYPES(FASTLLM_INSTANTIATE_SOFTMAX)

} // namespace fastllm::rt::cpu
