//===- KernelPlans.h - the kernels' shared shape rules ----------*- C++ -*-===//
//
// The host shape arithmetic of the kernel contract (runtime/KernelApi.inc),
// defined once for the CPU library, the CUDA library and generated code:
// how an elementwise iteration collapses, how matmul's batch collapses, how
// transpose tiles, which dims reduce walks, where a slice starts, and the
// index rules of gather and the losses. A kernel of either library plans
// with these, so both targets walk the same collapsed iterations.
//
// The plans are plain data in fixed arrays of kMaxRank (the CUDA kernels take
// them as kernel parameters). The functions check nothing about the rank:
// each library refuses a rank above kMaxRank in its own way before planning.
// Members a device walks (StridedIndex::offset, the index rules) are host
// and device functions under nvcc.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_KERNELPLANS_H
#define FASTLLM_RUNTIME_KERNELPLANS_H

#include "runtime/KernelMath.h"
#include "runtime/ModelABI.h"

#include <cassert>
#include <cstdint>

namespace fastllm::rt::detail {

/// T, in a parameter that takes no part in deducing T (std::type_identity_t
/// of C++20): a `nullptr` or a float literal there converts to the T the
/// other arguments give.
template <typename T> struct TypeIdentity { using type = T; };
template <typename T> using NoDeduce = typename TypeIdentity<T>::type;

//===----------------------------------------------------------------------===//
// Shapes and strided walks
//===----------------------------------------------------------------------===//

/// Row-major strides of a contiguous tensor.
inline void contiguousStrides(int rank, const int64_t *shape,
                              int64_t *strides) {
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    strides[d] = s;
    s *= shape[d];
  }
}

inline int64_t numElements(int rank, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d)
    n *= shape[d];
  return n;
}

/// Drops the size-1 dims of `shape` and merges each dim into the one before
/// when every operand steps through the pair as through one dim (a
/// contiguous output always does). Updates shape and strides in place and
/// returns the new rank. Both kernel libraries use it, so both targets
/// see the same collapsed iteration.
inline int collapseDims(int rank, int64_t *shape, int numOperands,
                        int64_t (*strides)[kMaxRank]) {
  int r = 0;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] == 1)
      continue;
    bool merge = r > 0;
    for (int k = 0; merge && k < numOperands; ++k)
      merge = strides[k][r - 1] == strides[k][d] * shape[d];
    if (merge) {
      shape[r - 1] *= shape[d];
      for (int k = 0; k < numOperands; ++k)
        strides[k][r - 1] = strides[k][d];
      continue;
    }
    shape[r] = shape[d];
    for (int k = 0; k < numOperands; ++k)
      strides[k][r] = strides[k][d];
    ++r;
  }
  return r;
}

/// The offset, in one strided operand, of each flat row-major index over
/// `shape`: host shape arrays packed into a kernel parameter.
struct StridedIndex {
  int rank;
  int64_t shape[kMaxRank];
  int64_t strides[kMaxRank];

  /// `flat` must be below the product of the shape.
  FASTLLM_HOST_DEVICE int64_t offset(int64_t flat) const {
    int64_t off = 0;
    for (int d = rank - 1; d > 0; --d) {
      off += flat % shape[d] * strides[d];
      flat /= shape[d];
    }
    return rank > 0 ? off + flat * strides[0] : 0;
  }
};

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

/// The iteration of elementwise over N inputs, collapsed: a contiguous output
/// of `total` elements with the collapsed `shape`, and each input's strides
/// along it.
template <int N> struct ElementwiseLayout {
  int rank;
  int64_t total;
  int64_t shape[kMaxRank];
  int64_t strides[N > 0 ? N : 1][kMaxRank];
};

/// The layout of an output of `shape` (rank <= kMaxRank) over inputs with
/// `strides[k]` each.
template <int N>
ElementwiseLayout<N> makeElementwiseLayout(int rank, const int64_t *shape,
                                           const int64_t *const *strides) {
  ElementwiseLayout<N> layout{};
  layout.total = 1;
  for (int d = 0; d < rank; ++d) {
    layout.shape[d] = shape[d];
    layout.total *= shape[d];
    for (int k = 0; k < N; ++k)
      layout.strides[k][d] = strides[k][d];
  }
  layout.rank = collapseDims(rank, layout.shape, N, layout.strides);
  return layout;
}

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

/// Matmul's batch after collapsing: the batch dims that remain, A's
/// (strides[0]) and B's (strides[1]) batch strides along them, and the rows
/// m of each product. A stack of A matrices times one shared B is one
/// product of m times the stack's height rows, with no batch left.
struct MatmulBatch {
  int rank;
  int64_t m;
  int64_t dims[kMaxRank];
  int64_t strides[2][kMaxRank];
};

inline MatmulBatch planMatmulBatch(int batchRank, const int64_t *batchShape,
                                   const int64_t *aBatchStrides,
                                   const int64_t *bBatchStrides, int64_t m,
                                   int64_t k, bool transA) {
  MatmulBatch batch{};
  for (int d = 0; d < batchRank; ++d) {
    batch.dims[d] = batchShape[d];
    batch.strides[0][d] = aBatchStrides[d];
    batch.strides[1][d] = bBatchStrides[d];
  }
  batch.rank = collapseDims(batchRank, batch.dims, 2, batch.strides);
  batch.m = m;
  // A stack of A matrices times one shared B is a single taller product.
  if (batch.rank == 1 && batch.strides[1][0] == 0 &&
      batch.strides[0][0] == m * k && !transA) {
    batch.m = m * batch.dims[0];
    batch.rank = 0;
  }
  return batch;
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

/// How transpose moves its elements, after collapsing the output's dims.
/// When the input's contiguous dim stays last, rows move whole (an
/// elementwise copy over dims/inStrides). Otherwise it is copied in square
/// tiles of a side the library chooses that span the input's contiguous dim
/// q and the output's last dim, once per index of the other (`outer`) dims.
struct TransposePlan {
  int64_t total;
  bool tiled;
  int rank;
  int64_t dims[kMaxRank];
  int64_t inStrides[kMaxRank];
  // The tiled copy.
  StridedIndex outerIn, outerOut;
  int64_t qSize, lastSize, qOutStride, lastInStride;
  int64_t qTiles, lastTiles, numTiles;
};

/// Plans transpose (out dim i = in dim perm[i]) in tiles of `tile` x `tile`.
inline TransposePlan planTranspose(int rank, const int64_t *inShape,
                                   const int64_t *perm, int64_t tile) {
  TransposePlan plan{};
  int64_t inStrides[kMaxRank], strides[1][kMaxRank];
  contiguousStrides(rank, inShape, inStrides);
  plan.total = 1;
  for (int d = 0; d < rank; ++d) {
    plan.dims[d] = inShape[perm[d]];
    strides[0][d] = inStrides[perm[d]];
    plan.total *= plan.dims[d];
  }
  if (plan.total == 0)
    return plan;
  const int r = plan.rank = collapseDims(rank, plan.dims, 1, strides);
  for (int d = 0; d < r; ++d)
    plan.inStrides[d] = strides[0][d];
  // When the last dim stays last, whole rows move.
  if (r == 0 || plan.inStrides[r - 1] == 1)
    return plan;

  // Otherwise the input's contiguous dim q lands before the output's last.
  plan.tiled = true;
  int q = 0;
  while (plan.inStrides[q] != 1)
    ++q;
  int64_t outStrides[kMaxRank];
  contiguousStrides(r, plan.dims, outStrides);
  for (int d = 0; d < r - 1; ++d) {
    if (d == q)
      continue;
    int o = plan.outerIn.rank++;
    plan.outerOut.rank++;
    plan.outerIn.shape[o] = plan.outerOut.shape[o] = plan.dims[d];
    plan.outerIn.strides[o] = plan.inStrides[d];
    plan.outerOut.strides[o] = outStrides[d];
  }
  plan.qSize = plan.dims[q];
  plan.lastSize = plan.dims[r - 1];
  plan.qOutStride = outStrides[q];
  plan.lastInStride = plan.inStrides[r - 1];
  plan.qTiles = (plan.qSize + tile - 1) / tile;
  plan.lastTiles = (plan.lastSize + tile - 1) / tile;
  plan.numTiles =
      plan.total / (plan.qSize * plan.lastSize) * plan.qTiles * plan.lastTiles;
  return plan;
}

/// The strides of a slice, in elements of the input, into `strides`; returns
/// the offset of its first element.
inline int64_t sliceLayout(int rank, const int64_t *inShape,
                           const int64_t *start, const int64_t *stride,
                           int64_t *strides) {
  contiguousStrides(rank, inShape, strides);
  int64_t offset = 0;
  for (int d = 0; d < rank; ++d) {
    offset += start[d] * strides[d];
    strides[d] *= stride[d];
  }
  return offset;
}

/// A gather index as a row of a dim of `dimSize` rows: a negative index
/// counts from the end.
template <typename Idx>
FASTLLM_HOST_DEVICE int64_t wrapIndex(Idx index, int64_t dimSize) {
  int64_t i = index < 0 ? int64_t(index) + dimSize : int64_t(index);
  assert(i >= 0 && i < dimSize && "gather index out of range");
  return i;
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

/// reduce's contiguous input with its size-1 dims dropped and neighbours of
/// the same role (reduced or kept) merged: such runs are single dims, so
/// the roles alternate along `dims`. keptCount and redCount are the numbers
/// of outputs and of elements each reduces.
struct ReduceDims {
  int64_t keptCount, redCount;
  int rank;
  int64_t dims[kMaxRank];
  bool reduced[kMaxRank];
};

inline ReduceDims planReduceDims(int rank, const int64_t *shape,
                                 const bool *reducedDims) {
  ReduceDims r{};
  r.keptCount = r.redCount = 1;
  for (int d = 0; d < rank; ++d)
    (reducedDims[d] ? r.redCount : r.keptCount) *= shape[d];
  for (int d = 0; d < rank; ++d) {
    if (shape[d] == 1)
      continue;
    if (r.rank > 0 && r.reduced[r.rank - 1] == reducedDims[d]) {
      r.dims[r.rank - 1] *= shape[d];
      continue;
    }
    r.dims[r.rank] = shape[d];
    r.reduced[r.rank++] = reducedDims[d];
  }
  return r;
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

/// Whether a loss skips `target` (hasIgnore and target == ignoreIndex).
template <typename Idx>
FASTLLM_HOST_DEVICE bool isIgnored(Idx target, bool hasIgnore,
                                   int64_t ignoreIndex) {
  return hasIgnore && int64_t(target) == ignoreIndex;
}

/// A target that is not ignored, as a class index in [0, classes).
template <typename Idx>
FASTLLM_HOST_DEVICE int64_t checkedTarget(Idx target, int64_t classes) {
  assert(target >= 0 && int64_t(target) < classes && "target out of range");
  (void)classes;
  return int64_t(target);
}

} // namespace fastllm::rt::detail

#endif // FASTLLM_RUNTIME_KERNELPLANS_H
