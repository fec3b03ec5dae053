//===- Common.h - what the CPU kernel sources share -------------*- C++ -*-===//
//
// Private to runtime/cpu/kernels/: the row helpers of the row kernels, the
// strided walk, BLAS's setup, and the names every family's source uses.
//
// Row kernels (softmax, norms, losses) reduce with fixed-lane partial sums
// (laneSum) rather than a plain running sum: the lanes let the compiler
// vectorize without -ffast-math, and they fix the order of additions, so a
// result depends on the shapes only. Where rows must be combined (parameter
// gradients, loss sums) the rows are cut into chunks whose number depends on
// the shapes, never on the thread count.
//
// The floating kernels are templates over T, as runtime/KernelApi.inc
// declares them for both libraries; the CPU library instantiates them for
// float only, and their code computes in float.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CPU_KERNELS_COMMON_H
#define FASTLLM_RUNTIME_CPU_KERNELS_COMMON_H

#include "runtime/KernelInstantiations.h"
#include "runtime/cpu/Kernels.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

namespace fastllm::rt::cpu::detail {

// The shape rules and scalar helpers both libraries share.
using ::fastllm::rt::detail::checkedTarget;
using ::fastllm::rt::detail::contiguousStrides;
using ::fastllm::rt::detail::isIgnored;
using ::fastllm::rt::detail::lowest;
using ::fastllm::rt::detail::maxNan;
using ::fastllm::rt::detail::numElements;
using ::fastllm::rt::detail::sliceLayout;
using ::fastllm::rt::detail::wrapIndex;

inline constexpr int kLanes = 16;

/// Σ f(i) over [0, n) in kLanes interleaved partial sums, combined pairwise.
template <typename Acc, typename F> Acc laneSum(int64_t n, F f) {
  Acc lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l)
      lanes[l] += static_cast<Acc>(f(i + l));
  for (int l = 0; i < n; ++i, ++l)
    lanes[l] += static_cast<Acc>(f(i));
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l)
      lanes[l] += lanes[l + width];
  return lanes[0];
}

/// (Σ f(i), Σ g(i)) in one pass, as laneSum.
template <typename Acc, typename F, typename G>
std::pair<Acc, Acc> laneSum2(int64_t n, F f, G g) {
  Acc a[kLanes] = {}, b[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      a[l] += static_cast<Acc>(f(i + l));
      b[l] += static_cast<Acc>(g(i + l));
    }
  for (int l = 0; i < n; ++i, ++l) {
    a[l] += static_cast<Acc>(f(i));
    b[l] += static_cast<Acc>(g(i));
  }
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) {
      a[l] += a[l + width];
      b[l] += b[l + width];
    }
  return {a[0], b[0]};
}

/// max over [0, n) of x, NaN-propagating, in kLanes lanes.
template <typename T> T rowMax(const T *x, int64_t n) {
  T lanes[kLanes];
  std::fill_n(lanes, kLanes, lowest<T>());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l)
      lanes[l] = maxNan(lanes[l], x[i + l]);
  for (; i < n; ++i)
    lanes[0] = maxNan(lanes[0], x[i]);
  T m = lanes[0];
  for (int l = 1; l < kLanes; ++l)
    m = maxNan(m, lanes[l]);
  return m;
}

/// The max m of a row and Σ e^(x - m), reading the row once: it goes by
/// L1-sized chunks, and a chunk with a larger max rescales the running sum.
/// As in PyTorch, -inf entries add nothing, a row of only -inf gives a NaN
/// sum, and NaN propagates.
inline std::pair<float, float> rowMaxExpSum(const float *x, int64_t n) {
  constexpr int64_t kChunk = 2048;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m = kNegInf, sum = 0.f;
  for (int64_t i = 0; i < n; i += kChunk) {
    const float *chunk = x + i;
    int64_t len = std::min(kChunk, n - i);
    float chunkMax = rowMax(chunk, len);
    if (chunkMax == kNegInf)
      continue;
    if (chunkMax > m) {
      sum *= fastExp(m - chunkMax);
      m = chunkMax;
    }
    sum +=
        laneSum<float>(len, [&](int64_t j) { return fastExp(chunk[j] - m); });
  }
  if (m == kNegInf)
    sum = std::numeric_limits<float>::quiet_NaN();
  return {m, sum};
}

/// A row-major multi-index over `rank` dims and the matching offset into one
/// strided operand.
struct StridedWalk {
  StridedWalk(int rank, const int64_t *shape, const int64_t *strides)
      : rank(rank), shape(shape), strides(strides) {}

  void seek(int64_t flat) {
    offset = 0;
    for (int d = rank - 1; d >= 0; --d) {
      index[d] = flat % shape[d];
      flat /= shape[d];
      offset += index[d] * strides[d];
    }
  }

  void next() {
    for (int d = rank - 1; d >= 0; --d) {
      offset += strides[d];
      if (++index[d] < shape[d])
        return;
      offset -= strides[d] * shape[d];
      index[d] = 0;
    }
  }

  int rank;
  const int64_t *shape;
  const int64_t *strides;
  int64_t index[kMaxRank] = {};
  int64_t offset = 0;
};

/// The number of row chunks for kernels that sum per-row contributions into
/// one [cols] result: enough to share among threads, and a function of the
/// shape alone so that the sums do not depend on the thread count.
inline int64_t rowChunks(int64_t rows, int64_t cols) {
  return std::clamp<int64_t>(rows * cols / kParallelGrain, 1,
                             std::min<int64_t>(rows, 64));
}

/// Below this many flops a product (a batch of GEMMs, attention) stays on
/// one thread.
inline constexpr double kMinParallelFlops = 1 << 20;

/// Runs once before the first GEMM: OpenBLAS on one thread, with vector
/// kernels (Matmul.cpp).
void configureBlas();

} // namespace fastllm::rt::cpu::detail

namespace fastllm::rt::cpu {

// The kernel sources name these unqualified.
using detail::checkedTarget;
using detail::configureBlas;
using detail::contiguousStrides;
using detail::isIgnored;
using detail::kMinParallelFlops;
using detail::laneSum;
using detail::laneSum2;
using detail::lowest;
using detail::maxNan;
using detail::numElements;
using detail::rowChunks;
using detail::rowMax;
using detail::rowMaxExpSum;
using detail::sliceLayout;
using detail::StridedWalk;
using detail::wrapIndex;

} // namespace fastllm::rt::cpu

#endif // FASTLLM_RUNTIME_CPU_KERNELS_COMMON_H
