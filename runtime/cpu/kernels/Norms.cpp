//===- Norms.cpp - layer and RMS normalisation ------------------*- C++ -*-===//
//
// runtime/KernelApi.inc's layerNorm, rmsNorm and their gradients for the
// CPU library (float): a row at a time, Σx and Σx² in double with laneSum.
// The gradients add each row's parameter contributions into per-chunk
// partial sums (rowChunks: a number of chunks fixed by the shapes), summed
// over chunks in order.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/kernels/Common.h"

#include <cmath>
#include <vector>

namespace fastllm::rt::cpu {

namespace {
/// Mean and 1/√(biased variance + eps) of one row, from one pass of Σx and
/// Σx² in double: the cancellation in E[x²] - mean² then costs far less than
/// float resolution unless |mean| exceeds the spread by ~10⁴.
std::pair<double, double> rowMoments(const float *x, int64_t n, float eps) {
  auto [sum, sumSq] = laneSum2<double>(
      n, [&](int64_t i) { return x[i]; },
      [&](int64_t i) { return double(x[i]) * x[i]; });
  double mean = sum / n;
  double var = std::max(sumSq / n - mean * mean, 0.0);
  return {mean, 1.0 / std::sqrt(var + eps)};
}

double rowRstd(const float *x, int64_t n, float eps) {
  double ms =
      laneSum<double>(n, [&](int64_t i) { return double(x[i]) * x[i]; }) / n;
  return 1.0 / std::sqrt(ms + eps);
}

/// Runs rowBody(row, partial) over all rows, where `partial` points to
/// `numSums` arrays of `cols` doubles that the rows of one chunk add into,
/// then stores the sums over chunks into `outs` (null entries skipped).
template <typename RowBody>
void rowsWithColumnSums(int64_t rows, int64_t cols, int numSums,
                        float *const *outs, RowBody rowBody) {
  const int64_t chunks = rowChunks(rows, cols);
  const int64_t stride = numSums * cols;
  std::vector<double> partial(chunks * stride, 0.0);
  parallelChunks(chunks, numThreadsFor(rows * cols), [&](int64_t c) {
    for (int64_t row = rows * c / chunks; row < rows * (c + 1) / chunks; ++row)
      rowBody(row, partial.data() + c * stride);
  });
  for (int k = 0; k < numSums; ++k) {
    if (!outs[k])
      continue;
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0;
      for (int64_t c = 0; c < chunks; ++c)
        sum += partial[c * stride + k * cols + j];
      outs[k][j] = static_cast<float>(sum);
    }
  }
}
} // namespace

template <typename T>
void layerNorm(T *y, const T *x, const T *scale,
               const detail::NoDeduce<T> *bias, int64_t rows, int64_t cols,
               float eps) {
  parallelFor(rows, rows * cols, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float *xr = x + row * cols;
      float *yr = y + row * cols;
      auto [mean, rstd] = rowMoments(xr, cols, eps);
      float m = static_cast<float>(mean), r = static_cast<float>(rstd);
      if (bias)
        for (int64_t i = 0; i < cols; ++i)
          yr[i] = (xr[i] - m) * r * scale[i] + bias[i];
      else
        for (int64_t i = 0; i < cols; ++i)
          yr[i] = (xr[i] - m) * r * scale[i];
    }
  });
}

template <typename T>
void layerNormGrad(T *dx, detail::NoDeduce<T> *dscale,
                   detail::NoDeduce<T> *dbias, const T *x, const T *scale,
                   const T *dy, int64_t rows, int64_t cols, float eps) {
  float *outs[] = {dscale, dbias};
  rowsWithColumnSums(rows, cols, 2, outs, [&](int64_t row, double *partial) {
    const float *xr = x + row * cols, *gr = dy + row * cols;
    float *dr = dx + row * cols;
    auto [mean, rstd] = rowMoments(xr, cols, eps);
    float m = static_cast<float>(mean), r = static_cast<float>(rstd);
    // dx = rstd·(g - mean(g) - x̂·mean(g·x̂)) with g = dy·scale.
    auto [sumG, sumGX] = laneSum2<double>(
        cols, [&](int64_t i) { return gr[i] * scale[i]; },
        [&](int64_t i) {
          return double(gr[i] * scale[i]) * ((xr[i] - m) * r);
        });
    float a = static_cast<float>(sumG / cols);
    float b = static_cast<float>(sumGX / cols);
    double *pScale = partial, *pBias = partial + cols;
    for (int64_t i = 0; i < cols; ++i) {
      float xhat = (xr[i] - m) * r;
      dr[i] = r * (gr[i] * scale[i] - a - xhat * b);
      pScale[i] += double(gr[i]) * xhat;
      pBias[i] += gr[i];
    }
  });
}

template <typename T>
void rmsNorm(T *y, const T *x, const T *scale, int64_t rows, int64_t cols,
             float eps) {
  parallelFor(rows, rows * cols, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float *xr = x + row * cols;
      float *yr = y + row * cols;
      float r = static_cast<float>(rowRstd(xr, cols, eps));
      for (int64_t i = 0; i < cols; ++i)
        yr[i] = xr[i] * r * scale[i];
    }
  });
}

template <typename T>
void rmsNormGrad(T *dx, detail::NoDeduce<T> *dscale, const T *x, const T *scale,
                 const T *dy, int64_t rows, int64_t cols, float eps) {
  float *outs[] = {dscale};
  rowsWithColumnSums(rows, cols, 1, outs, [&](int64_t row, double *partial) {
    const float *xr = x + row * cols, *gr = dy + row * cols;
    float *dr = dx + row * cols;
    float r = static_cast<float>(rowRstd(xr, cols, eps));
    // dx = rstd·(g - x̂·mean(g·x̂)) with g = dy·scale.
    double sumGX = laneSum<double>(cols, [&](int64_t i) {
      return double(gr[i] * scale[i]) * (xr[i] * r);
    });
    float b = static_cast<float>(sumGX / cols);
    for (int64_t i = 0; i < cols; ++i) {
      float xhat = xr[i] * r;
      dr[i] = r * (gr[i] * scale[i] - xhat * b);
      partial[i] += double(gr[i]) * xhat;
    }
  });
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_FLOAT_TYPES(FASTLLM_INSTANTIATE_NORMS)

} // namespace fastllm::rt::cpu
