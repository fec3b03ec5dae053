//===- Norms.cu - layer and RMS normalisation -------------------*- C++ -*-===//
//
// runtime/KernelApi.inc's layerNorm, rmsNorm and their gradients for the
// CUDA library, for T = float or __nv_bfloat16. Launch: the forwards a block
// per row, Σx and Σx² in double (a warp per row, 8 elements at a time, when
// the rows are multiples of 8 elements and the buffers aligned: warpRows).
// The gradients a block (or warp) per row for dx,
// saving each row's mean and 1/std in a Scratch, then a block per 32
// columns for dscale and dbias, summing in double in a fixed order.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/Common.cuh"

#include <algorithm>

namespace fastllm::rt::cuda {

//===----------------------------------------------------------------------===//
// Normalisation
//===----------------------------------------------------------------------===//

namespace {

/// The mean and 1/√(biased variance + eps) of one row, as floats, from one
/// pass of Σx and Σx² in double (as the CPU). Every thread of the block must
/// call it.
template <typename T>
__device__ float2 rowMoments(const T *x, int64_t n, float eps) {
  double sum = 0, sumSq = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    double v = widen(x[i]);
    sum += v;
    sumSq += v * v;
  }
  sum = blockAllReduce(sum, Plus());
  sumSq = blockAllReduce(sumSq, Plus());
  double mean = sum / n;
  double var = sumSq / n - mean * mean;
  var = var < 0.0 ? 0.0 : var; // std::max(var, 0.0): NaN stays NaN
  return make_float2(static_cast<float>(mean),
                     static_cast<float>(1.0 / sqrt(var + eps)));
}

/// 1/√(mean(x²) + eps) of one row, as rowMoments.
template <typename T>
__device__ float rowRstd(const T *x, int64_t n, float eps) {
  double sumSq = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    sumSq += double(widen(x[i])) * widen(x[i]);
  sumSq = blockAllReduce(sumSq, Plus());
  return static_cast<float>(1.0 / sqrt(sumSq / n + eps));
}

/// layerNorm, a block per row.
template <typename T>
__global__ void layerNormKernel(T *y, const T *x, const T *scale, const T *bias,
                                int64_t rows, int64_t cols, float eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *xr = x + row * cols;
    T *yr = y + row * cols;
    const float2 mr = rowMoments(xr, cols, eps);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      float v = (widen(xr[i]) - mr.x) * mr.y * widen(scale[i]);
      yr[i] = static_cast<T>(bias ? v + widen(bias[i]) : v);
    }
  }
}

/// dx of layerNorm, a block per row, also saving each row's (mean, rstd) for
/// normColumnSumsKernel: dx = rstd·(g - mean(g) - x̂·mean(g·x̂)), g = dy·scale.
template <typename T>
__global__ void layerNormGradRowsKernel(T *dx, float2 *stats, const T *x,
                                        const T *scale, const T *dy,
                                        int64_t rows, int64_t cols, float eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *xr = x + row * cols, *gr = dy + row * cols;
    T *dr = dx + row * cols;
    const float2 mr = rowMoments(xr, cols, eps);
    const float m = mr.x, r = mr.y;
    if (threadIdx.x == 0)
      stats[row] = mr;
    double sumG = 0, sumGX = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      float g = widen(gr[i]) * widen(scale[i]);
      sumG += g;
      sumGX += double(g) * ((widen(xr[i]) - m) * r);
    }
    const float a = static_cast<float>(blockAllReduce(sumG, Plus()) / cols);
    const float b = static_cast<float>(blockAllReduce(sumGX, Plus()) / cols);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      float xhat = (widen(xr[i]) - m) * r;
      dr[i] =
          static_cast<T>(r * (widen(gr[i]) * widen(scale[i]) - a - xhat * b));
    }
  }
}

/// rmsNorm, a block per row.
template <typename T>
__global__ void rmsNormKernel(T *y, const T *x, const T *scale, int64_t rows,
                              int64_t cols, float eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *xr = x + row * cols;
    T *yr = y + row * cols;
    const float r = rowRstd(xr, cols, eps);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
      yr[i] = static_cast<T>(widen(xr[i]) * r * widen(scale[i]));
  }
}

/// dx of rmsNorm, a block per row, saving (0, rstd) per row so that
/// normColumnSumsKernel's x̂ = (x - 0)·rstd is rmsNorm's x·rstd exactly:
/// dx = rstd·(g - x̂·mean(g·x̂)), g = dy·scale.
template <typename T>
__global__ void rmsNormGradRowsKernel(T *dx, float2 *stats, const T *x,
                                      const T *scale, const T *dy, int64_t rows,
                                      int64_t cols, float eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *xr = x + row * cols, *gr = dy + row * cols;
    T *dr = dx + row * cols;
    const float r = rowRstd(xr, cols, eps);
    if (threadIdx.x == 0)
      stats[row] = make_float2(0.f, r);
    double sumGX = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
      sumGX += double(widen(gr[i]) * widen(scale[i])) * (widen(xr[i]) * r);
    const float b = static_cast<float>(blockAllReduce(sumGX, Plus()) / cols);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      float xhat = widen(xr[i]) * r;
      dr[i] = static_cast<T>(r * (widen(gr[i]) * widen(scale[i]) - xhat * b));
    }
  }
}

//===----------------------------------------------------------------------===//
// A warp per row, 8 elements at a time (rows of 8k elements, aligned)
//===----------------------------------------------------------------------===//

/// Elements a lane moves at once: 16 bytes of bf16, 32 of float.
constexpr int kNormVector = 8;
constexpr int kNormWarpThreads = 256; ///< 8 rows per block

/// Whether the warp kernels serve rows of `cols` elements of these buffers
/// (nullable ones are skipped): cols a multiple of kNormVector, every
/// buffer 16-byte aligned.
template <typename T>
bool warpRows(int64_t cols, std::initializer_list<const T *> buffers) {
  if (cols % kNormVector != 0)
    return false;
  for (const T *p : buffers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      return false;
  return true;
}

template <typename T>
__device__ void loadRow8(float (&v)[kNormVector], const T *p) {
  alignas(16) T raw[kNormVector];
  for (int b = 0; b < int(kNormVector * sizeof(T) / 16); ++b)
    reinterpret_cast<uint4 *>(raw)[b] = reinterpret_cast<const uint4 *>(p)[b];
  for (int e = 0; e < kNormVector; ++e)
    v[e] = widen(raw[e]);
}

template <typename T>
__device__ void storeRow8(T *p, const float (&v)[kNormVector]) {
  alignas(16) T raw[kNormVector];
  for (int e = 0; e < kNormVector; ++e)
    raw[e] = static_cast<T>(v[e]);
  for (int b = 0; b < int(kNormVector * sizeof(T) / 16); ++b)
    reinterpret_cast<uint4 *>(p)[b] = reinterpret_cast<const uint4 *>(raw)[b];
}

/// The warp's row and the stride to its next one.
__device__ inline int64_t warpRow() {
  return (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
}
__device__ inline int64_t warpRowStride() {
  return int64_t(gridDim.x) * blockDim.x / 32;
}

/// rowMoments (as doubles: sum and sum of squares, or only the latter) of
/// one row by a warp.
template <typename T>
__device__ float2 warpRowMoments(const T *x, int64_t cols, float eps,
                                 bool centred) {
  double sum = 0, sumSq = 0;
  for (int64_t c = threadIdx.x % 32 * kNormVector; c < cols;
       c += 32 * kNormVector) {
    float v[kNormVector];
    loadRow8(v, x + c);
    for (int e = 0; e < kNormVector; ++e) {
      sum += v[e];
      sumSq += double(v[e]) * v[e];
    }
  }
  sum = warpAllReduce(sum, Plus());
  sumSq = warpAllReduce(sumSq, Plus());
  if (!centred)
    return make_float2(0.f, static_cast<float>(1.0 / sqrt(sumSq / cols + eps)));
  const double mean = sum / cols;
  double var = sumSq / cols - mean * mean;
  var = var < 0.0 ? 0.0 : var;
  return make_float2(static_cast<float>(mean),
                     static_cast<float>(1.0 / sqrt(var + eps)));
}

/// layerNorm (centred, with bias when not null) or rmsNorm (not centred,
/// no bias), a warp per row: y = (x - mean)·rstd·scale (+ bias).
template <typename T>
__global__ void __launch_bounds__(kNormWarpThreads)
    normWarpKernel(T *y, const T *x, const T *scale, const T *bias,
                   int64_t rows, int64_t cols, float eps, bool centred) {
  for (int64_t row = warpRow(); row < rows; row += warpRowStride()) {
    const T *xr = x + row * cols;
    T *yr = y + row * cols;
    const float2 mr = warpRowMoments(xr, cols, eps, centred);
    for (int64_t c = threadIdx.x % 32 * kNormVector; c < cols;
         c += 32 * kNormVector) {
      float v[kNormVector], sc[kNormVector], b[kNormVector] = {};
      loadRow8(v, xr + c);
      loadRow8(sc, scale + c);
      if (bias)
        loadRow8(b, bias + c);
      for (int e = 0; e < kNormVector; ++e) {
        // The block kernels' expressions, operation for operation.
        const float n =
            centred ? (v[e] - mr.x) * mr.y * sc[e] : v[e] * mr.y * sc[e];
        v[e] = bias ? n + b[e] : n;
      }
      storeRow8(yr + c, v);
    }
  }
}

/// dx of layerNorm (centred) or rmsNorm, a warp per row, saving each row's
/// (mean, rstd) as the block kernels do.
template <typename T>
__global__ void __launch_bounds__(kNormWarpThreads)
    normGradRowsWarpKernel(T *dx, float2 *stats, const T *x, const T *scale,
                           const T *dy, int64_t rows, int64_t cols, float eps,
                           bool centred) {
  for (int64_t row = warpRow(); row < rows; row += warpRowStride()) {
    const T *xr = x + row * cols, *gr = dy + row * cols;
    T *dr = dx + row * cols;
    const float2 mr = warpRowMoments(xr, cols, eps, centred);
    const float m = mr.x, r = mr.y;
    if (threadIdx.x % 32 == 0)
      stats[row] = mr;
    double sumG = 0, sumGX = 0;
    for (int64_t c = threadIdx.x % 32 * kNormVector; c < cols;
         c += 32 * kNormVector) {
      float v[kNormVector], sc[kNormVector], d[kNormVector];
      loadRow8(v, xr + c);
      loadRow8(sc, scale + c);
      loadRow8(d, gr + c);
      for (int e = 0; e < kNormVector; ++e) {
        const float g = d[e] * sc[e];
        sumG += g;
        sumGX += double(g) * ((v[e] - m) * r);
      }
    }
    const float a =
        centred ? static_cast<float>(warpAllReduce(sumG, Plus()) / cols) : 0.f;
    const float b = static_cast<float>(warpAllReduce(sumGX, Plus()) / cols);
    for (int64_t c = threadIdx.x % 32 * kNormVector; c < cols;
         c += 32 * kNormVector) {
      float v[kNormVector], sc[kNormVector], d[kNormVector];
      loadRow8(v, xr + c);
      loadRow8(sc, scale + c);
      loadRow8(d, gr + c);
      for (int e = 0; e < kNormVector; ++e) {
        const float xhat = (v[e] - m) * r;
        v[e] = centred ? r * (d[e] * sc[e] - a - xhat * b)
                       : r * (d[e] * sc[e] - xhat * b);
      }
      storeRow8(dr + c, v);
    }
  }
}

/// A launch of a warp per row.
LaunchConfig warpRowsFor(int64_t rows) {
  const int64_t perBlock = kNormWarpThreads / 32;
  return {static_cast<unsigned>(std::clamp<int64_t>(
              (rows + perBlock - 1) / perBlock, 1, detail::kMaxGridBlocks)),
          unsigned(kNormWarpThreads)};
}

/// dscale[j] = Σ_rows dy·x̂ and dbias[j] = Σ_rows dy (either nullable), with
/// x̂ = (x - mean)·rstd from the saved row stats: a kColumnTile x
/// kColumnLanes block per kColumnTile columns and part blockIdx.y of the
/// rows (partRows each), the lanes of a column splitting the part and
/// combined in lane order, all in double. With more than one part, the
/// sums go to parts [2][gridDim.y][cols] (dscale's, then dbias's) for
/// combinePartsKernel.
template <typename T>
__global__ void normColumnSumsKernel(T *dscale, T *dbias, double *parts,
                                     const T *x, const T *dy,
                                     const float2 *stats, int64_t rows,
                                     int64_t cols, int64_t partRows) {
  __shared__ double partial[2][kColumnLanes][kColumnTile];
  const int64_t first = int64_t(blockIdx.y) * partRows;
  const int64_t end = min(rows, first + partRows);
  for (int64_t c0 = int64_t(blockIdx.x) * kColumnTile; c0 < cols;
       c0 += int64_t(gridDim.x) * kColumnTile) {
    const int64_t col = c0 + threadIdx.x;
    double sumScale = 0, sumBias = 0;
    if (col < cols)
      for (int64_t row = first + threadIdx.y; row < end; row += blockDim.y) {
        const float2 s = stats[row];
        const float g = widen(dy[row * cols + col]);
        const float xhat = (widen(x[row * cols + col]) - s.x) * s.y;
        sumScale += double(g) * xhat;
        sumBias += g;
      }
    partial[0][threadIdx.y][threadIdx.x] = sumScale;
    partial[1][threadIdx.y][threadIdx.x] = sumBias;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
      for (int y = 1; y < kColumnLanes; ++y) {
        sumScale += partial[0][y][threadIdx.x];
        sumBias += partial[1][y][threadIdx.x];
      }
      if (parts) {
        parts[blockIdx.y * cols + col] = sumScale;
        parts[(gridDim.y + blockIdx.y) * cols + col] = sumBias;
      } else {
        if (dscale)
          dscale[col] = static_cast<T>(sumScale);
        if (dbias)
          dbias[col] = static_cast<T>(sumBias);
      }
    }
    __syncthreads();
  }
}

/// dscale and dbias are nullable: T comes from x.
template <typename T>
void launchNormColumnSums(detail::NoDeduce<T> *dscale,
                          detail::NoDeduce<T> *dbias, const T *x, const T *dy,
                          const float2 *stats, int64_t rows, int64_t cols) {
  if (!dscale && !dbias)
    return;
  const ColumnGrid g = columnGrid(cols, kColumnTile, rows);
  Scratch<double> parts(g.parts > 1 ? 2 * g.parts * cols : 0);
  FASTLLM_LAUNCH(g.grid, dim3(kColumnTile, kColumnLanes), 0, stream(),
                 normColumnSumsKernel<T>)
  (dscale, dbias, parts.get(), x, dy, stats, rows, cols, g.partRows);
  checkLaunch();
  if (dscale)
    combineParts(dscale, parts.get(), cols, g.parts, Plus(), 0);
  if (dbias)
    combineParts(dbias, parts.get() + g.parts * cols, cols, g.parts, Plus(), 0);
}

} // namespace

template <typename T>
void layerNorm(T *y, const T *x, const T *scale,
               const detail::NoDeduce<T> *bias, int64_t rows, int64_t cols,
               float eps) {
  if (rows == 0 || cols == 0)
    return;
  if (warpRows<T>(cols, {y, x, scale, bias})) {
    LaunchConfig launch = warpRowsFor(rows);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   normWarpKernel<T>)
    (y, x, scale, bias, rows, cols, eps, true);
    return checkLaunch();
  }
  LaunchConfig launch = rowsFor(rows);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(), layerNormKernel<T>)
  (y, x, scale, bias, rows, cols, eps);
  checkLaunch();
}

template <typename T>
void layerNormGrad(T *dx, detail::NoDeduce<T> *dscale,
                   detail::NoDeduce<T> *dbias, const T *x, const T *scale,
                   const T *dy, int64_t rows, int64_t cols, float eps) {
  if (cols == 0)
    return;
  Scratch<float2> stats(rows);
  if (rows > 0 && warpRows<T>(cols, {dx, x, scale, dy})) {
    LaunchConfig launch = warpRowsFor(rows);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   normGradRowsWarpKernel<T>)
    (dx, stats.get(), x, scale, dy, rows, cols, eps, true);
    checkLaunch();
  } else if (rows > 0) {
    LaunchConfig launch = rowsFor(rows);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   layerNormGradRowsKernel<T>)
    (dx, stats.get(), x, scale, dy, rows, cols, eps);
    checkLaunch();
  }
  launchNormColumnSums(dscale, dbias, x, dy, stats.get(), rows, cols);
}

template <typename T>
void rmsNorm(T *y, const T *x, const T *scale, int64_t rows, int64_t cols,
             float eps) {
  if (rows == 0 || cols == 0)
    return;
  if (warpRows<T>(cols, {y, x, scale})) {
    LaunchConfig launch = warpRowsFor(rows);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   normWarpKernel<T>)
    (y, x, scale, nullptr, rows, cols, eps, false);
    return checkLaunch();
  }
  LaunchConfig launch = rowsFor(rows);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(), rmsNormKernel<T>)
  (y, x, scale, rows, cols, eps);
  checkLaunch();
}

template <typename T>
void rmsNormGrad(T *dx, detail::NoDeduce<T> *dscale, const T *x, const T *scale,
                 const T *dy, int64_t rows, int64_t cols, float eps) {
  if (cols == 0)
    return;
  Scratch<float2> stats(rows);
  if (rows > 0 && warpRows<T>(cols, {dx, x, scale, dy})) {
    LaunchConfig launch = warpRowsFor(rows);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   normGradRowsWarpKernel<T>)
    (dx, stats.get(), x, scale, dy, rows, cols, eps, false);
    checkLaunch();
  } else if (rows > 0) {
    LaunchConfig launch = rowsFor(rows);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   rmsNormGradRowsKernel<T>)
    (dx, stats.get(), x, scale, dy, rows, cols, eps);
    checkLaunch();
  }
  launchNormColumnSums(dscale, nullptr, x, dy, stats.get(), rows, cols);
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_FLOAT_TYPES(FASTLLM_INSTANTIATE_NORMS)
FASTLLM_INSTANTIATE_NORMS(__nv_bfloat16)

} // namespace fastllm::rt::cuda
