//===- Reduce.cpp - reduce over any set of dims -----------------*- C++ -*-===//
//
// runtime/KernelApi.inc's reduce for the CPU library, over
// runtime/KernelPlans.h's collapsed dims: a single output in fixed chunks
// combined in order, outputs that reduce contiguous runs, or (the innermost
// dim kept) whole rows of outputs accumulated at once, vectorized across
// columns.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/kernels/Common.h"

#include <type_traits>
#include <vector>

namespace fastllm::rt::cpu {

namespace {

/// Sum (and Mean): floats accumulate in double, integers in int64_t.
template <typename T> struct SumOp {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  static Acc init() { return 0; }
  static Acc combine(Acc acc, Acc x) { return acc + x; }
  static Acc row(const T *x, int64_t n) {
    return laneSum<Acc>(n, [&](int64_t i) { return x[i]; });
  }
};

template <typename T> struct MaxOp {
  using Acc = T;
  static Acc init() { return lowest<T>(); }
  static Acc combine(Acc acc, Acc x) { return maxNan(acc, x); }
  static Acc row(const T *x, int64_t n) { return rowMax(x, n); }
};

/// Elements per chunk when one output reduces a long contiguous run.
constexpr int64_t kReduceChunk = 16384;

/// The reduction over collapsed dims (no size-1 dims, neighbours differ in
/// `reduced`); `finish` turns an accumulator into an output value.
template <typename Op, typename T, typename Finish>
void reduceCollapsed(T *out, const T *in, int rank, const int64_t *dims,
                     const bool *reduced, Finish finish) {
  using Acc = typename Op::Acc;
  int64_t strides[kMaxRank];
  contiguousStrides(rank, dims, strides);
  int64_t keptDims[kMaxRank], keptStrides[kMaxRank];
  int64_t redDims[kMaxRank], redStrides[kMaxRank];
  int keptRank = 0, redRank = 0;
  // The innermost dim is handled by the loops below, not by the walks.
  for (int d = 0; d < rank - 1; ++d) {
    if (reduced[d]) {
      redDims[redRank] = dims[d];
      redStrides[redRank++] = strides[d];
    } else {
      keptDims[keptRank] = dims[d];
      keptStrides[keptRank++] = strides[d];
    }
  }
  const int64_t inner = dims[rank - 1];
  const int64_t total = numElements(rank, dims);
  const int64_t redOuter = numElements(redRank, redDims);
  const int64_t keptOuter = numElements(keptRank, keptDims);

  if (reduced[rank - 1] && keptOuter == 1 && redOuter == 1) {
    // Everything into one value: fixed chunks, combined in order.
    int64_t chunks = (inner + kReduceChunk - 1) / kReduceChunk;
    std::vector<Acc> partial(chunks);
    parallelChunks(chunks, numThreadsFor(total), [&](int64_t c) {
      int64_t first = c * kReduceChunk;
      partial[c] = Op::row(in + first, std::min(kReduceChunk, inner - first));
    });
    Acc acc = Op::init();
    for (Acc p : partial)
      acc = Op::combine(acc, p);
    out[0] = finish(acc);
    return;
  }

  if (reduced[rank - 1]) {
    // Each output reduces contiguous runs of `inner` elements.
    parallelFor(keptOuter, total, [&](int64_t begin, int64_t end) {
      StridedWalk kept(keptRank, keptDims, keptStrides);
      StridedWalk red(redRank, redDims, redStrides);
      kept.seek(begin);
      for (int64_t o = begin; o < end; ++o, kept.next()) {
        Acc acc = Op::init();
        red.seek(0);
        for (int64_t q = 0; q < redOuter; ++q, red.next())
          acc = Op::combine(acc, Op::row(in + kept.offset + red.offset, inner));
        out[o] = finish(acc);
      }
    });
    return;
  }

  // The innermost dim is kept: accumulate whole rows of outputs at once,
  // vectorized across columns, in bands of at most kBand columns.
  constexpr int64_t kBand = 1024;
  int threads = numThreadsFor(total);
  int64_t bands = (inner + kBand - 1) / kBand;
  if (keptOuter * bands < threads)
    bands = std::min<int64_t>((threads + keptOuter - 1) / keptOuter,
                              std::max<int64_t>(1, inner / 16));
  const int64_t width = (inner + bands - 1) / bands;
  parallelChunks(keptOuter * bands, threads, [&](int64_t task) {
    int64_t o = task / bands;
    int64_t c0 = task % bands * width, len = std::min(inner - c0, width);
    if (len <= 0)
      return;
    Acc acc[kBand];
    std::fill_n(acc, len, Op::init());
    StridedWalk kept(keptRank, keptDims, keptStrides);
    StridedWalk red(redRank, redDims, redStrides);
    kept.seek(o);
    for (int64_t q = 0; q < redOuter; ++q, red.next()) {
      const T *x = in + kept.offset + red.offset + c0;
      for (int64_t i = 0; i < len; ++i)
        acc[i] = Op::combine(acc[i], static_cast<Acc>(x[i]));
    }
    T *y = out + o * inner + c0;
    for (int64_t i = 0; i < len; ++i)
      y[i] = finish(acc[i]);
  });
}

} // namespace

template <typename T>
void reduce(T *out, const T *in, int rank, const int64_t *shape,
            const bool *reducedDims, ReduceKind kind) {
  assert(rank >= 0 && rank <= kMaxRank && "rank above kMaxRank");
  // Size-1 dims dropped and neighbours with the same role merged: both the
  // input and the output are contiguous, so such runs are single dims.
  const ::fastllm::rt::detail::ReduceDims plan =
      ::fastllm::rt::detail::planReduceDims(rank, shape, reducedDims);
  const int64_t keptCount = plan.keptCount, redCount = plan.redCount;
  if (keptCount == 0)
    return;
  if (redCount == 0) {
    T empty = kind == ReduceKind::Max ? lowest<T>() : T(0);
    if (kind == ReduceKind::Mean && std::numeric_limits<T>::has_quiet_NaN)
      empty = std::numeric_limits<T>::quiet_NaN();
    return fill(out, keptCount, empty);
  }
  const int r = plan.rank;
  const int64_t *dims = plan.dims;
  const bool *reduced = plan.reduced;
  if (r == 0 || (r == 1 && !reduced[0]))
    return copy(out, in, keptCount);

  if (kind == ReduceKind::Max)
    return reduceCollapsed<MaxOp<T>>(out, in, r, dims, reduced,
                                     [](T acc) { return acc; });
  using Acc = typename SumOp<T>::Acc;
  if (kind == ReduceKind::Sum)
    return reduceCollapsed<SumOp<T>>(
        out, in, r, dims, reduced, [](Acc acc) { return static_cast<T>(acc); });
  return reduceCollapsed<SumOp<T>>(
      out, in, r, dims, reduced,
      [redCount](Acc acc) { return static_cast<T>(acc / redCount); });
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_REDUCE_TYPES(FASTLLM_INSTANTIATE_REDUCE)

} // namespace fastllm::rt::cpu
