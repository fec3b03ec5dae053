//===- Losses.cu - cross-entropy and negative log-likelihood ----*- C++ -*-===//
//
// runtime/KernelApi.inc's losses for the CUDA library: T, the logits' (or
// log-probabilities') type, is float or __nv_bfloat16; losses and incoming
// loss gradients are float. Launch: crossEntropy a block per row, then (Sum,
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

/// Each row's cross-entropy, max + log Σ e^(x - max) - x[target], into
/// rowLoss (0 for ignored rows): a block per row.
template <typename Idx, typename T, typename Out>
__global__ void crossEntropyRowsKernel(Out *rowLoss, const T *logits,
                                       const Idx *targets, int64_t rows,
                                       int64_t classes, bool hasIgnore,
                                       int64_t ignoreIndex) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    if (isIgnored(targets[row], hasIgnore, ignoreIndex)) {
      if (threadIdx.x == 0)
        rowLoss[row] = Out(0);
      continue;
    }
    const int64_t target = checkedTarget(targets[row], classes);
    const T *xr = logits + row * classes;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < classes; i += blockDim.x)
      m = MaxNan()(m, widen(xr[i]));
    m = blockAllReduce(m, MaxNan());
    float local = 0.f;
    for (int64_t i = threadIdx.x; i < classes; i += blockDim.x)
      local += fastExp(widen(xr[i]) - m);
    const float sum = blockAllReduce(local, Plus());
    if (threadIdx.x == 0)
      rowLoss[row] =
          static_cast<Out>(double(m) + log(double(sum)) - widen(xr[target]));
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
/// rows), g the row's incoming gradient: a block per row. Each element is
/// e^(x - max)·(g / Σ), its exponential computed again rather than stored and
/// reloaded; the product is rounded before g is subtracted at the target
/// (__fmul_rn: no fused multiply-add), as the CPU's two passes do.
template <typename Idx, typename T>
__global__ void crossEntropyGradKernel(T *dlogits, const T *logits,
                                       const Idx *targets, RowGrad grad,
                                       int64_t rows, int64_t classes,
                                       bool hasIgnore, int64_t ignoreIndex) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    T *dr = dlogits + row * classes;
    if (isIgnored(targets[row], hasIgnore, ignoreIndex)) {
      for (int64_t i = threadIdx.x; i < classes; i += blockDim.x)
        dr[i] = static_cast<T>(0.f);
      continue;
    }
    const int64_t target = checkedTarget(targets[row], classes);
    const T *xr = logits + row * classes;
    const float g = grad.of(row);
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < classes; i += blockDim.x)
      m = MaxNan()(m, widen(xr[i]));
    m = blockAllReduce(m, MaxNan());
    float local = 0.f;
    for (int64_t i = threadIdx.x; i < classes; i += blockDim.x)
      local += fastExp(widen(xr[i]) - m);
    const float factor = g / blockAllReduce(local, Plus());
    for (int64_t i = threadIdx.x; i < classes; i += blockDim.x) {
      const float p = __fmul_rn(fastExp(widen(xr[i]) - m), factor);
      dr[i] = static_cast<T>(i == target ? p - g : p);
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
