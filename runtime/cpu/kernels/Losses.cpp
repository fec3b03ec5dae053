//===- Losses.cpp - cross-entropy and negative log-likelihood ---*- C++ -*-===//
//
// runtime/KernelApi.inc's losses for the CPU library (float logits or
// log-probabilities): a row at a time, each row's loss in double; the sum
// over rows in row order.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/kernels/Common.h"

#include <cmath>
#include <vector>

namespace fastllm::rt::cpu {

namespace {

/// Writes per-row losses (as computed by rowLoss, 0 for ignored rows) to
/// `loss`, or their sum or mean over non-ignored rows. The sum runs in row
/// order in double. `rowWork` is the number of elements rowLoss reads.
template <typename Idx, typename RowLoss>
void reduceLoss(float *loss, const Idx *targets, int64_t rows, int64_t classes,
                int64_t rowWork, bool hasIgnore, int64_t ignoreIndex,
                Reduction r, RowLoss rowLoss) {
  std::vector<double> perRow(r == Reduction::None ? 0 : rows);
  parallelFor(rows, rows * rowWork, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      double v = isIgnored(targets[row], hasIgnore, ignoreIndex)
                     ? 0.0
                     : rowLoss(row, checkedTarget(targets[row], classes));
      if (r == Reduction::None)
        loss[row] = static_cast<float>(v);
      else
        perRow[row] = v;
    }
  });
  if (r == Reduction::None)
    return;
  double sum = 0;
  int64_t count = 0;
  for (int64_t row = 0; row < rows; ++row) {
    sum += perRow[row];
    count += !isIgnored(targets[row], hasIgnore, ignoreIndex);
  }
  // Mean over no targets is 0/0 = NaN, as in PyTorch.
  loss[0] = static_cast<float>(r == Reduction::Sum ? sum : sum / count);
}

/// The incoming gradient of each row's loss: dloss[row] for None, dloss[0]
/// for Sum, dloss[0] / (number of non-ignored targets) for Mean.
template <typename Idx>
auto rowGradScale(const float *dloss, const Idx *targets, int64_t rows,
                  bool hasIgnore, int64_t ignoreIndex, Reduction r) {
  float shared = dloss[0];
  if (r == Reduction::Mean) {
    int64_t count = 0;
    for (int64_t row = 0; row < rows; ++row)
      count += !isIgnored(targets[row], hasIgnore, ignoreIndex);
    shared = static_cast<float>(double(dloss[0]) / count);
  }
  return
      [=](int64_t row) { return r == Reduction::None ? dloss[row] : shared; };
}

} // namespace

template <typename Idx, typename T>
void crossEntropy(float *loss, const T *logits, const Idx *targets,
                  int64_t rows, int64_t classes, bool hasIgnore,
                  int64_t ignoreIndex, Reduction r) {
  reduceLoss(loss, targets, rows, classes, classes, hasIgnore, ignoreIndex, r,
             [&](int64_t row, int64_t t) {
               const float *xr = logits + row * classes;
               auto [m, sum] = rowMaxExpSum(xr, classes);
               return double(m) + std::log(double(sum)) - xr[t];
             });
}

template <typename Idx, typename T>
void crossEntropyGrad(T *dlogits, const T *logits, const Idx *targets,
                      const float *dloss, int64_t rows, int64_t classes,
                      bool hasIgnore, int64_t ignoreIndex, Reduction r) {
  auto scaleOf = rowGradScale(dloss, targets, rows, hasIgnore, ignoreIndex, r);
  parallelFor(rows, rows * classes, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      float *dr = dlogits + row * classes;
      if (isIgnored(targets[row], hasIgnore, ignoreIndex)) {
        std::fill_n(dr, classes, 0.f);
        continue;
      }
      int64_t t = checkedTarget(targets[row], classes);
      const float *xr = logits + row * classes;
      float g = scaleOf(row);
      float m = rowMax(xr, classes);
      float k = g / laneSum<float>(classes, [&](int64_t i) {
                  return dr[i] = fastExp(xr[i] - m);
                });
      for (int64_t i = 0; i < classes; ++i)
        dr[i] *= k;
      dr[t] -= g;
    }
  });
}

template <typename Idx, typename T>
void nllLoss(float *loss, const T *input, const Idx *targets, int64_t rows,
             int64_t classes, bool hasIgnore, int64_t ignoreIndex,
             Reduction r) {
  reduceLoss(loss, targets, rows, classes, /*rowWork=*/1, hasIgnore,
             ignoreIndex, r, [&](int64_t row, int64_t t) {
               return -double(input[row * classes + t]);
             });
}

template <typename Idx, typename T>
void nllLossGrad(T *dinput, const Idx *targets, const float *dloss,
                 int64_t rows, int64_t classes, bool hasIgnore,
                 int64_t ignoreIndex, Reduction r) {
  auto scaleOf = rowGradScale(dloss, targets, rows, hasIgnore, ignoreIndex, r);
  parallelFor(rows, rows * classes, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      float *dr = dinput + row * classes;
      std::fill_n(dr, classes, 0.f);
      if (!isIgnored(targets[row], hasIgnore, ignoreIndex))
        dr[checkedTarget(targets[row], classes)] = -scaleOf(row);
    }
  });
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_FLOAT_TYPES(FASTLLM_INSTANTIATE_LOSSES)

} // namespace fastllm::rt::cpu
