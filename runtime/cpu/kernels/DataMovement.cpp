//===- DataMovement.cpp - transpose, slice, concat, gather ------*- C++ -*-===//
//
// runtime/KernelApi.inc's data movement for the CPU library: transpose,
// slice, sliceGrad, concat, gather and gatherGrad, for every element type of
// runtime/KernelInstantiations.h's FASTLLM_DATA_TYPES. transpose moving the
// last dim copies 64 x 64 tiles (runtime/KernelPlans.h's plan), so that
// reads and writes both use whole cache lines; otherwise it is, like slice,
// an elementwise copy.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/kernels/Common.h"

#include <cstring>
#include <vector>

namespace fastllm::rt::cpu {

namespace {
template <typename T> struct Identity {
  T operator()(T x) const { return x; }
};

/// Side of the square tiles of a transpose that moves the last dim.
constexpr int64_t kTile = 64;
} // namespace

template <typename T>
void transpose(T *out, const T *in, int rank, const int64_t *inShape,
               const int64_t *perm) {
  assert(rank >= 0 && rank <= kMaxRank && "rank above kMaxRank");
  const ::fastllm::rt::detail::TransposePlan plan =
      ::fastllm::rt::detail::planTranspose(rank, inShape, perm, kTile);
  if (plan.total == 0)
    return;
  // When the last dim stays last, whole rows move: a strided copy.
  if (!plan.tiled)
    return elementwise(out, plan.rank, plan.dims, Identity<T>(),
                       In<T>{in, plan.inStrides});

  // Otherwise the input's contiguous dim q lands somewhere before the
  // output's last dim: copy square tiles spanning q and the last dim, so that
  // reads and writes both use whole cache lines.
  const int64_t qSize = plan.qSize, lastSize = plan.lastSize;
  const int64_t qOutStride = plan.qOutStride, lastInStride = plan.lastInStride;
  const int64_t qTiles = plan.qTiles, lastTiles = plan.lastTiles;
  parallelFor(plan.numTiles, plan.total, [&](int64_t begin, int64_t end) {
    StridedWalk inWalk(plan.outerIn.rank, plan.outerIn.shape,
                       plan.outerIn.strides);
    StridedWalk outWalk(plan.outerOut.rank, plan.outerOut.shape,
                        plan.outerOut.strides);
    for (int64_t t = begin; t < end; ++t) {
      int64_t lastTile = t % lastTiles, qTile = t / lastTiles % qTiles;
      inWalk.seek(t / (lastTiles * qTiles));
      outWalk.seek(t / (lastTiles * qTiles));
      const T *src = in + inWalk.offset;
      T *dst = out + outWalk.offset;
      int64_t q0 = qTile * kTile, q1 = std::min(qSize, q0 + kTile);
      int64_t l0 = lastTile * kTile, l1 = std::min(lastSize, l0 + kTile);
      for (int64_t i = q0; i < q1; ++i)
        for (int64_t j = l0; j < l1; ++j)
          dst[i * qOutStride + j] = src[i + j * lastInStride];
    }
  });
}

template <typename T>
void slice(T *out, const T *in, int rank, const int64_t *inShape,
           const int64_t *start, const int64_t *stride,
           const int64_t *outShape) {
  int64_t strides[kMaxRank];
  int64_t offset = sliceLayout(rank, inShape, start, stride, strides);
  elementwise(out, rank, outShape, Identity<T>(), In<T>{in + offset, strides});
}

template <typename T>
void sliceGrad(T *din, const T *dout, int rank, const int64_t *inShape,
               const int64_t *start, const int64_t *stride,
               const int64_t *outShape) {
  fill(din, numElements(rank, inShape), T(0));
  int64_t dims[kMaxRank], strides[2][kMaxRank];
  int64_t offset = sliceLayout(rank, inShape, start, stride, strides[0]);
  contiguousStrides(rank, outShape, strides[1]);
  std::copy_n(outShape, rank, dims);
  int64_t total = numElements(rank, outShape);
  if (total == 0)
    return;
  int r = detail::collapseDims(rank, dims, 2, strides);
  if (r == 0) {
    din[offset] = dout[0];
    return;
  }
  const int64_t n = dims[r - 1], step = strides[0][r - 1];
  parallelFor(total / n, total, [&](int64_t begin, int64_t end) {
    StridedWalk walk(r - 1, dims, strides[0]);
    walk.seek(begin);
    for (int64_t row = begin; row < end; ++row, walk.next()) {
      T *dst = din + offset + walk.offset;
      const T *src = dout + row * n;
      for (int64_t i = 0; i < n; ++i)
        dst[i * step] = src[i];
    }
  });
}

template <typename T>
void concat(T *out, int numInputs, const T *const *ins, const int64_t *sizes,
            int64_t outer, int64_t inner) {
  std::vector<int64_t> first(numInputs + 1, 0);
  for (int i = 0; i < numInputs; ++i)
    first[i + 1] = first[i] + sizes[i];
  const int64_t outRow = first[numInputs] * inner;
  parallelFor(outer * numInputs, outer * outRow,
              [&](int64_t begin, int64_t end) {
                for (int64_t u = begin; u < end; ++u) {
                  int64_t o = u / numInputs, i = u % numInputs;
                  int64_t len = sizes[i] * inner;
                  if (len > 0) // an empty input may have no buffer
                    std::memcpy(out + o * outRow + first[i] * inner,
                                ins[i] + o * len, len * sizeof(T));
                }
              });
}
template <typename T, typename Idx>
void gather(T *out, const T *in, const Idx *idx, int64_t outer, int64_t dimSize,
            int64_t numIdx, int64_t inner) {
  parallelFor(outer * numIdx, outer * numIdx * inner,
              [&](int64_t begin, int64_t end) {
                int64_t o = begin / numIdx, j = begin % numIdx;
                for (int64_t u = begin; u < end; ++u) {
                  const T *src =
                      in + (o * dimSize + wrapIndex(idx[j], dimSize)) * inner;
                  if (inner == 1)
                    out[u] = *src;
                  else
                    std::memcpy(out + u * inner, src, inner * sizeof(T));
                  if (++j == numIdx) {
                    j = 0;
                    ++o;
                  }
                }
              });
}

template <typename T, typename Idx>
void gatherGrad(T *din, const T *dout, const Idx *idx, int64_t outer,
                int64_t dimSize, int64_t numIdx, int64_t inner) {
  // A task owns a band of columns of one outer slice and adds the rows of
  // dout into it in order of j: no two tasks write the same element, and
  // each element sees the same additions in the same order on any team.
  int threads = numThreadsFor(outer * (dimSize + numIdx) * inner);
  int64_t bands = outer >= threads ? 1 : (threads + outer - 1) / outer;
  bands = std::clamp<int64_t>(bands, 1, std::max<int64_t>(1, inner / 16));
  const int64_t width = (inner + bands - 1) / bands;
  parallelChunks(outer * bands, threads, [&](int64_t task) {
    int64_t o = task / bands;
    int64_t c0 = task % bands * width, c1 = std::min(inner, c0 + width);
    if (c0 >= c1)
      return;
    T *base = din + o * dimSize * inner;
    const T *grad = dout + o * numIdx * inner;
    for (int64_t i = 0; i < dimSize; ++i)
      std::fill(base + i * inner + c0, base + i * inner + c1, T(0));
    for (int64_t j = 0; j < numIdx; ++j) {
      T *dst = base + wrapIndex(idx[j], dimSize) * inner;
      const T *src = grad + j * inner;
      for (int64_t col = c0; col < c1; ++col)
        dst[col] += src[col];
    }
  });
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_DATA_TYPES(FASTLLM_INSTANTIATE_DATA_MOVEMENT)
FASTLLM_GRAD_TYPES(FASTLLM_INSTANTIATE_GATHER_GRAD)

} // namespace fastllm::rt::cpu
