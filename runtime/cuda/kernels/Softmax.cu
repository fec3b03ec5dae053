//===- Softmax.cu - softmax and log-softmax ---------------------*- C++ -*-===//
//
// runtime/KernelApi.inc's softmax and softmaxGrad for the CUDA library, for
// T = float or __nv_bfloat16. Launch: a block per row when inner is 1
// (blockAllReduce combines the row's max and sums), else a thread per column
// (o, i) walking n. softmaxGrad's sums are in double.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/Common.cuh"

namespace fastllm::rt::cuda {

//===----------------------------------------------------------------------===//
// Softmax
//===----------------------------------------------------------------------===//

namespace {

/// Softmax of rows of n (inner == 1), a block per row: the row's max m, then
/// Σ e^(x - m), then y = e^(x - m) / Σ (the exponential computed again rather
/// than stored and reloaded) or (x - m) - log Σ. A row of only -inf has max
/// -inf and x - max = NaN: NaN throughout, as in PyTorch.
template <typename T>
__global__ void softmaxRowsKernel(T *y, const T *x, int64_t rows, int64_t n,
                                  bool log) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *xr = x + row * n;
    T *yr = y + row * n;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      m = MaxNan()(m, widen(xr[i]));
    m = blockAllReduce(m, MaxNan());
    float local = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      local += fastExp(widen(xr[i]) - m);
    const float sum = blockAllReduce(local, Plus());
    if (log) {
      // (x - m) - log Σ: the first difference is exact near the max.
      const float logSum = logf(sum);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = static_cast<T>((widen(xr[i]) - m) - logSum);
      continue;
    }
    const float inv = 1.f / sum;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      yr[i] = static_cast<T>(fastExp(widen(xr[i]) - m) * inv);
  }
}

/// Softmax along n of [outer, n, inner] with inner > 1: a thread per column
/// (o, i), walking n three times (max, sum, output) as softmaxRowsKernel;
/// neighbouring threads read neighbouring columns.
template <typename T>
__global__ void softmaxColumnsKernel(T *y, const T *x, int64_t outer, int64_t n,
                                     int64_t inner, bool log) {
  for (int64_t u = globalThread(); u < outer * inner; u += gridThreads()) {
    const int64_t base = u / inner * n * inner + u % inner;
    float m = -INFINITY;
    for (int64_t j = 0; j < n; ++j)
      m = MaxNan()(m, widen(x[base + j * inner]));
    float s = 0.f;
    for (int64_t j = 0; j < n; ++j)
      s += fastExp(widen(x[base + j * inner]) - m);
    s = log ? logf(s) : 1.f / s;
    for (int64_t j = 0; j < n; ++j) {
      const float shifted = widen(x[base + j * inner]) - m;
      y[base + j * inner] =
          static_cast<T>(log ? shifted - s : fastExp(shifted) * s);
    }
  }
}

/// softmaxGrad along rows of n (inner == 1), a block per row.
template <typename T>
__global__ void softmaxGradRowsKernel(T *dx, const T *y, const T *dy,
                                      int64_t rows, int64_t n, bool log) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *yr = y + row * n, *gr = dy + row * n;
    T *dr = dx + row * n;
    double local = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      local += log ? double(widen(gr[i])) : double(widen(gr[i])) * widen(yr[i]);
    const float s = static_cast<float>(blockAllReduce(local, Plus()));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      dr[i] = static_cast<T>(log ? widen(gr[i]) - fastExp(widen(yr[i])) * s
                                 : widen(yr[i]) * (widen(gr[i]) - s));
  }
}

/// softmaxGrad along n with inner > 1, a thread per column as
/// softmaxColumnsKernel.
template <typename T>
__global__ void softmaxGradColumnsKernel(T *dx, const T *y, const T *dy,
                                         int64_t outer, int64_t n,
                                         int64_t inner, bool log) {
  for (int64_t u = globalThread(); u < outer * inner; u += gridThreads()) {
    const int64_t base = u / inner * n * inner + u % inner;
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      int64_t at = base + j * inner;
      sum += log ? double(widen(dy[at])) : double(widen(dy[at])) * widen(y[at]);
    }
    const float s = static_cast<float>(sum);
    for (int64_t j = 0; j < n; ++j) {
      int64_t at = base + j * inner;
      dx[at] = static_cast<T>(log ? widen(dy[at]) - fastExp(widen(y[at])) * s
                                  : widen(y[at]) * (widen(dy[at]) - s));
    }
  }
}

} // namespace

template <typename T>
void softmax(T *y, const T *x, int64_t outer, int64_t n, int64_t inner,
             bool log) {
  if (outer == 0 || n == 0 || inner == 0)
    return;
  if (inner > 1) {
    LaunchConfig launch = gridFor(outer * inner);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   softmaxColumnsKernel<T>)
    (y, x, outer, n, inner, log);
  } else {
    LaunchConfig launch = rowsFor(outer);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   softmaxRowsKernel<T>)
    (y, x, outer, n, log);
  }
  checkLaunch();
}

template <typename T>
void softmaxGrad(T *dx, const T *y, const T *dy, int64_t outer, int64_t n,
                 int64_t inner, bool log) {
  if (outer == 0 || n == 0 || inner == 0)
    return;
  if (inner > 1) {
    LaunchConfig launch = gridFor(outer * inner);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   softmaxGradColumnsKernel<T>)
    (dx, y, dy, outer, n, inner, log);
  } else {
    LaunchConfig launch = rowsFor(outer);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   softmaxGradRowsKernel<T>)
    (dx, y, dy, outer, n, log);
  }
  checkLaunch();
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_FLOAT_TYPES(FASTLLM_INSTANTIATE_SOFTMAX)
FASTLLM_INSTANTIATE_SOFTMAX(__nv_bfloat16)

} // namespace fastllm::rt::cuda
