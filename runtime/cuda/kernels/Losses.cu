//===- Losses.cu - cross-entropy and negative log-likelihood ----*- C++ -*-===//
//
// runtime/KernelApi.inc's losses for the CUDA library: T, the logits' (or
// log-probabilities') type, is float or __nv_bfloat16; losses and incoming
// loss gradients are float. Launch: crossEntropy a block per row (one pass:
// an online max and sum of exponentials, 16-byte loads), then (Sum,
// Mean) one block summing the rows' losses in double; crossEntropyGrad
// (Mean) one block counting the targets, then a block per row; nllLoss a
// thread per row (None) or one block summing the rows (Sum, Mean);
// nllLossGrad (Mean) one block counting the targets, then a thread per
// element.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/Common.cuh"

namespace fastllm::rt::cuda {

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

namespace {

/// A running max m and Σ e^(x - m) over some of a row's values.
struct MaxSum {
  float m = -INFINITY, s = 0.f;
};

/// The (max, sum) of two parts of a row. NaN in a part's sum stays in the
/// result (a NaN value makes its part's sum NaN: see addValues).
__device__ MaxSum combineMaxSum(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY)
    return a; // both empty or all -inf: sums 0
  return {m, a.s * fastExp(a.m - m) + b.s * fastExp(b.m - m)};
}

/// Adds n values to a running (max, sum): one rescale for the n.
template <int N> __device__ MaxSum addValues(MaxSum a, const float (&x)[N]) {
  float m = a.m;
  for (int e = 0; e < N; ++e)
    m = fmaxf(m, x[e]);
  if (m == -INFINITY)
    return a;
  float s = a.s * fastExp(a.m - m);
  for (int e = 0; e < N; ++e)
    s += fastExp(x[e] - m); // NaN stays NaN
  return {m, s};
}

/// 16 bytes of T: the row kernels' loads and stores.
template <typename T> struct alignas(16) Vec16 {
  static constexpr int n = 16 / int(sizeof(T));
  T v[n];
};

/// Whether every row of [rows, classes] T from `p` starts 16-byte aligned
/// and is whole 16-byte vectors.
template <typename T> __device__ bool vectorRows(const T *p, int64_t classes) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 &&
         (classes * int64_t(sizeof(T))) % 16 == 0;
}

/// The row's (max, Σ e^(x - max)) over the block: each thread's share in
/// one pass (16-byte loads where the rows allow), combined in a fixed
/// order, so every thread gets the same result.
template <typename T>
__device__ MaxSum rowMaxSum(const T *xr, int64_t classes, bool vector) {
  MaxSum acc;
  if (vector) {
    using V = Vec16<T>;
    const V *xv = reinterpret_cast<const V *>(xr);
    for (int64_t i = threadIdx.x; i < classes / V::n; i += blockDim.x) {
      const V v = xv[i];
      float x[V::n];
      for (int e = 0; e < V::n; ++e)
        x[e] = widen(v.v[e]);
      acc = addValues(acc, x);
    }
  } else {
    for (int64_t i = threadIdx.x; i < classes; i += blockDim.x) {
      const float x[1] = {widen(xr[i])};
      acc = addValues(acc, x);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum other;
    other.m = __shfl_xor_sync(kFullMask, acc.m, offset);
    other.s = __shfl_xor_sync(kFullMask, acc.s, offset);
    acc = combineMaxSum(acc, other);
  }
  __shared__ MaxSum warps[32];
  __syncthreads(); // the previous row's readers are done with `warps`
  if (threadIdx.x % 32 == 0)
    warps[threadIdx.x / 32] = acc;
  __syncthreads();
  acc = warps[0];
  for (int w = 1; w < int(blockDim.x / 32); ++w)
    acc = combineMaxSum(acc, warps[w]);
  return acc;
}

/// Each row's cross-entropy, max + log Σ e^(x - max) - x[target], into
/// rowLoss (0 for ignored rows): a block per row, one pass over the row.
template <typename Idx, typename T, typename Out>
__global__ void crossEntropyRowsKernel(Out *rowLoss, const T *logits,
                                       const Idx *targets, int64_t rows,
                                       int64_t classes, bool hasIgnore,
                                       int64_t ignoreIndex) {
  const bool vector = vectorRows(logits, classes);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    if (isIgnored(targets[row], hasIgnore, ignoreIndex)) {
      if (threadIdx.x == 0)
        rowLoss[row] = Out(0);
      continue;
    }
    const int64_t target = checkedTarget(targets[row], classes);
    const T *xr = logits + row * classes;
    const MaxSum ms = rowMaxSum(xr, classes, vector);
    if (threadIdx.x == 0)
      rowLoss[row] = static_cast<Out>(double(ms.m) + log(double(ms.s)) -
                                      widen(xr[target]));
  }
}

/// A row's loss saved by crossEntropyRowsKernel.
struct SavedRowLoss {
  const double *perRow;
  __device__ double operator()(int64_t row) const { return perRow[row]; }
};

/// A row's negative log-likelihood.
template <typename Idx, typename T> struct NllRowLoss {
  const T *input;
  const Idx *targets;
  int64_t classes;
  __device__ double operator()(int64_t row) const {
    return -double(
        widen(input[row * classes + checkedTarget(targets[row], classes)]));
  }
};

/// loss[0] = Σ rowLoss(row) over the rows not ignored, in double, divided
/// by their number for Mean (0/0 = NaN when there are none): one block.
template <typename Idx, typename RowLoss>
__global__ void sumLossKernel(float *loss, RowLoss rowLoss, const Idx *targets,
                              int64_t rows, bool hasIgnore, int64_t ignoreIndex,
                              bool mean) {
  double sum = 0;
  int64_t count = 0;
  for (int64_t row = threadIdx.x; row < rows; row += blockDim.x) {
    if (isIgnored(targets[row], hasIgnore, ignoreIndex))
      continue;
    sum += rowLoss(row);
    ++count;
  }
  sum = blockAllReduce(sum, Plus());
  count = blockAllReduce(count, Plus());
  if (threadIdx.x == 0)
    loss[0] = static_cast<float>(mean ? sum / count : sum);
}

/// nllLoss with Reduction::None: a thread per row.
template <typename Idx, typename T>
__global__ void nllRowsKernel(float *loss, const T *input, const Idx *targets,
                              int64_t rows, int64_t classes, bool hasIgnore,
                              int64_t ignoreIndex) {
  NllRowLoss<Idx, T> rowLoss{input, targets, classes};
  for (int64_t row = globalThread(); row < rows; row += gridThreads())
    loss[row] = isIgnored(targets[row], hasIgnore, ignoreIndex)
                    ? 0.f
                    : static_cast<float>(rowLoss(row));
}

/// Where a loss gradient kernel finds each row's incoming gradient:
/// values[row] (None) or values[0] (Sum: dloss; Mean: meanGradKernel's).
struct RowGrad {
  const float *values;
  bool perRow;
  __device__ float of(int64_t row) const { return values[perRow ? row : 0]; }
};

/// grad[0] = dloss[0] / (the number of targets not ignored): one block.
template <typename Idx>
__global__ void meanGradKernel(float *grad, const float *dloss,
                               const Idx *targets, int64_t rows, bool hasIgnore,
                               int64_t ignoreIndex) {
  int64_t count = 0;
  for (int64_t row = threadIdx.x; row < rows; row += blockDim.x)
    count += !isIgnored(targets[row], hasIgnore, ignoreIndex);
  count = blockAllReduce(count, Plus());
  if (threadIdx.x == 0)
    grad[0] = static_cast<float>(double(dloss[0]) / count);
}

/// The RowGrad of reduction r; for Mean, launches meanGradKernel into
/// `meanGrad` (one float).
template <typename Idx>
RowGrad rowGradFor(const float *dloss, const Idx *targets, int64_t rows,
                   bool hasIgnore, int64_t ignoreIndex, Reduction r,
                   float *meanGrad) {
  if (r != Reduction::Mean)
    return {dloss, r == Reduction::None};
  FASTLLM_LAUNCH(1, kSingleBlockThreads, 0, stream(), meanGradKernel<Idx>)
  (meanGrad, dloss, targets, rows, hasIgnore, ignoreIndex);
  checkLaunch();
  return {meanGrad, false};
}

/// dlogits = g·softmax(logits) - g·onehot(target) per row (zero for ignored
/// rows), g the row's incoming gradient: a block per row, two passes (the
/// row's max and sum, then the gradient; 16-byte loads and stores where the
/// rows allow). Each element is e^(x - max)·(g / Σ), its exponential
/// computed again rather than stored and reloaded; the product is rounded
/// before g is subtracted at the target (__fmul_rn: no fused multiply-add),
/// as the CPU's two passes do.
template <typename Idx, typename T>
__global__ void crossEntropyGradKernel(T *dlogits, const T *logits,
                                       const Idx *targets, RowGrad grad,
                                       int64_t rows, int64_t classes,
                                       bool hasIgnore, int64_t ignoreIndex) {
  using V = Vec16<T>;
  const bool vector =
      vectorRows(logits, classes) && vectorRows(dlogits, classes);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    T *dr = dlogits + row * classes;
    const bool ignored = isIgnored(targets[row], hasIgnore, ignoreIndex);
    const T *xr = logits + row * classes;
    float m = 0.f, factor = 0.f, g = 0.f;
    int64_t target = -1;
    if (!ignored) {
      target = checkedTarget(targets[row], classes);
      g = grad.of(row);
      const MaxSum ms = rowMaxSum(xr, classes, vector);
      m = ms.m;
      factor = g / ms.s;
    }
    auto value = [&](float x, int64_t i) {
      if (ignored)
        return 0.f;
      const float p = __fmul_rn(fastExp(x - m), factor);
      return i == target ? p - g : p;
    };
    if (vector) {
      const V *xv = reinterpret_cast<const V *>(xr);
      V *dv = reinterpret_cast<V *>(dr);
      for (int64_t i = threadIdx.x; i < classes / V::n; i += blockDim.x) {
        const V v = xv[i];
        V out;
        for (int e = 0; e < V::n; ++e)
          out.v[e] = static_cast<T>(value(widen(v.v[e]), i * V::n + e));
        dv[i] = out;
      }
    } else {
      for (int64_t i = threadIdx.x; i < classes; i += blockDim.x)
        dr[i] = static_cast<T>(value(widen(xr[i]), i));
    }
  }
}

/// dinput = -g at each row's target, 0 elsewhere: a thread per element.
template <typename Idx, typename T>
__global__ void nllLossGradKernel(T *dinput, const Idx *targets, RowGrad grad,
                                  int64_t rows, int64_t classes, bool hasIgnore,
                                  int64_t ignoreIndex) {
  for (int64_t e = globalThread(); e < rows * classes; e += gridThreads()) {
    const int64_t row = e / classes, col = e - row * classes;
    const Idx target = targets[row];
    dinput[e] = static_cast<T>(!isIgnored(target, hasIgnore, ignoreIndex) &&
                                       checkedTarget(target, classes) == col
                                   ? -grad.of(row)
                                   : 0.f);
  }
}

} // namespace

template <typename Idx, typename T>
void crossEntropy(float *loss, const T *logits, const Idx *targets,
                  int64_t rows, int64_t classes, bool hasIgnore,
                  int64_t ignoreIndex, Reduction r) {
  const LaunchConfig launch = rowsFor(rows);
  if (r == Reduction::None) {
    if (rows == 0)
      return;
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   crossEntropyRowsKernel<Idx, T, float>)
    (loss, logits, targets, rows, classes, hasIgnore, ignoreIndex);
    return checkLaunch();
  }
  Scratch<double> perRow(rows);
  if (rows > 0) {
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   crossEntropyRowsKernel<Idx, T, double>)
    (perRow.get(), logits, targets, rows, classes, hasIgnore, ignoreIndex);
    checkLaunch();
  }
  FASTLLM_LAUNCH(1, kSingleBlockThreads, 0, stream(),
                 sumLossKernel<Idx, SavedRowLoss>)
  (loss, SavedRowLoss{perRow.get()}, targets, rows, hasIgnore, ignoreIndex,
   r == Reduction::Mean);
  checkLaunch();
}

template <typename Idx, typename T>
void crossEntropyGrad(T *dlogits, const T *logits, const Idx *targets,
                      const float *dloss, int64_t rows, int64_t classes,
                      bool hasIgnore, int64_t ignoreIndex, Reduction r) {
  if (rows == 0 || classes == 0)
    return;
  Scratch<float> meanGrad(r == Reduction::Mean ? 1 : 0);
  const RowGrad grad = rowGradFor(dloss, targets, rows, hasIgnore, ignoreIndex,
                                  r, meanGrad.get());
  const LaunchConfig launch = rowsFor(rows);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                 crossEntropyGradKernel<Idx, T>)
  (dlogits, logits, targets, grad, rows, classes, hasIgnore, ignoreIndex);
  checkLaunch();
}

template <typename Idx, typename T>
void nllLoss(float *loss, const T *input, const Idx *targets, int64_t rows,
             int64_t classes, bool hasIgnore, int64_t ignoreIndex,
             Reduction r) {
  if (r == Reduction::None) {
    if (rows == 0)
      return;
    const LaunchConfig launch = gridFor(rows);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   nllRowsKernel<Idx, T>)
    (loss, input, targets, rows, classes, hasIgnore, ignoreIndex);
    return checkLaunch();
  }
  FASTLLM_LAUNCH(1, kSingleBlockThreads, 0, stream(),
                 sumLossKernel<Idx, NllRowLoss<Idx, T>>)
  (loss, NllRowLoss<Idx, T>{input, targets, classes}, targets, rows, hasIgnore,
   ignoreIndex, r == Reduction::Mean);
  checkLaunch();
}

template <typename Idx, typename T>
void nllLossGrad(T *dinput, const Idx *targets, const float *dloss,
                 int64_t rows, int64_t classes, bool hasIgnore,
                 int64_t ignoreIndex, Reduction r) {
  if (rows == 0 || classes == 0)
    return;
  Scratch<float> meanGrad(r == Reduction::Mean ? 1 : 0);
  const RowGrad grad = rowGradFor(dloss, targets, rows, hasIgnore, ignoreIndex,
                                  r, meanGrad.get());
  const LaunchConfig launch = gridFor(rows * classes);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                 nllLossGradKernel<Idx, T>)
  (dinput, targets, grad, rows, classes, hasIgnore, ignoreIndex);
  checkLaunch();
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_FLOAT_TYPES(FASTLLM_INSTANTIATE_LOSSES)
FASTLLM_INSTANTIATE_LOSSES(__nv_bfloat16)

} // namespace fastllm::rt::cuda
