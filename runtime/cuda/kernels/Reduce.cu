//===- Reduce.cu - reduce over any set of dims ------------------*- C++ -*-===//
//
// runtime/KernelApi.inc's reduce for the CUDA library. Launch: a block per
// output when the contiguous dim is reduced; else a block per 32 consecutive
// outputs and part of the reduced elements (columnParts: enough parts to
// fill the GPU), 16 threads summing each, combined in lane order, the parts
// then combined in order; a [rows, cols] matrix summed over its rows reads 8
// columns per thread with 16-byte loads (reduceColumnsKernel). The walk is
// planReduce's (Plans.cuh), built on runtime/KernelPlans.h's ReduceDims.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/Common.cuh"

#include <algorithm>

namespace fastllm::rt::cuda {

//===----------------------------------------------------------------------===//
// Plans
//===----------------------------------------------------------------------===//

detail::ReducePlan detail::planReduce(int rank, const int64_t *shape,
                                      const bool *reducedDims) {
  detail::checkRank(rank, "reduce");
  // Size-1 dims dropped and neighbours with the same role merged: the input
  // is contiguous, so such runs are single dims.
  const ::fastllm::rt::detail::ReduceDims dims =
      ::fastllm::rt::detail::planReduceDims(rank, shape, reducedDims);
  ReducePlan plan{};
  plan.keptCount = dims.keptCount;
  plan.redCount = dims.redCount;
  const int r = dims.rank;
  int64_t strides[kMaxRank];
  contiguousStrides(r, dims.dims, strides);
  for (int d = 0; d < r; ++d) {
    StridedIndex &walk = dims.reduced[d] ? plan.red : plan.kept;
    walk.shape[walk.rank] = dims.dims[d];
    walk.strides[walk.rank++] = strides[d];
  }
  plan.innerReduced = r > 0 && dims.reduced[r - 1];
  return plan;
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

namespace {

/// An accumulator as an output value: divided by meanCount for Mean (> 0).
template <typename T, typename Acc>
__device__ T finishReduce(Acc acc, int64_t meanCount) {
  return static_cast<T>(meanCount > 0 ? acc / meanCount : acc);
}

/// Reductions along the contiguous dim: a block per output, its threads
/// striding over the reduced elements (consecutive threads read consecutive
/// elements).
template <typename T, typename Acc, typename Combine>
__global__ void reduceContiguousKernel(T *out, const T *in,
                                       detail::ReducePlan plan, Acc init,
                                       Combine combine, int64_t meanCount) {
  for (int64_t o = blockIdx.x; o < plan.keptCount; o += gridDim.x) {
    const T *base = in + plan.kept.offset(o);
    Acc acc = init;
    for (int64_t r = threadIdx.x; r < plan.redCount; r += blockDim.x)
      acc = combine(acc, static_cast<Acc>(widen(base[plan.red.offset(r)])));
    acc = blockAllReduce(acc, combine);
    if (threadIdx.x == 0)
      out[o] = finishReduce<T>(acc, meanCount);
  }
}

/// Reductions that keep the contiguous dim: a kColumnTile x kColumnLanes
/// block per kColumnTile consecutive outputs (consecutive threadIdx.x read
/// consecutive elements) and part blockIdx.y of the reduced elements (parts
/// of partCount); the lanes of one output split the part and are combined
/// in lane order. With more than one part, each part's accumulators go to
/// parts [gridDim.y][keptCount] (combinePartsKernel finishes); else the
/// outputs to out.
template <typename T, typename Acc, typename Combine>
__global__ void reduceStridedKernel(T *out, Acc *parts, const T *in,
                                    detail::ReducePlan plan, Acc init,
                                    Combine combine, int64_t meanCount,
                                    int64_t partCount) {
  __shared__ Acc partial[kColumnLanes][kColumnTile];
  const int64_t first = int64_t(blockIdx.y) * partCount;
  const int64_t end = min(plan.redCount, first + partCount);
  for (int64_t o0 = int64_t(blockIdx.x) * kColumnTile; o0 < plan.keptCount;
       o0 += int64_t(gridDim.x) * kColumnTile) {
    const int64_t o = o0 + threadIdx.x;
    Acc acc = init;
    if (o < plan.keptCount) {
      const T *base = in + plan.kept.offset(o);
      for (int64_t r = first + threadIdx.y; r < end; r += blockDim.y)
        acc = combine(acc, static_cast<Acc>(widen(base[plan.red.offset(r)])));
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < plan.keptCount) {
      for (int y = 1; y < kColumnLanes; ++y)
        acc = combine(acc, partial[y][threadIdx.x]);
      if (parts)
        parts[blockIdx.y * plan.keptCount + o] = acc;
      else
        out[o] = finishReduce<T>(acc, meanCount);
    }
    __syncthreads();
  }
}

/// Columns per thread of reduceColumnsKernel: 16 bytes of 2-byte values.
constexpr int kColumnVector = 8;
/// Threads along the rows of one reduceColumnsKernel tile.
constexpr int kColumnVectorLanes = 8;

/// reduceStridedKernel for a [rows, cols] matrix reduced over its rows
/// (kept: one contiguous dim; reduced: one dim of stride `rowStride`),
/// cols and rowStride multiples of kColumnVector, `in` 16-byte aligned: a
/// 32 x kColumnVectorLanes block per 256 consecutive columns and part
/// blockIdx.y of the rows, each thread kColumnVector columns at a time
/// with 16-byte loads, its row lanes combined in lane order; outputs or
/// parts as reduceStridedKernel's.
template <typename T, typename Acc, typename Combine>
__global__ void
reduceColumnsKernel(T *out, Acc *parts, const T *in, int64_t rows, int64_t cols,
                    int64_t rowStride, Acc init, Combine combine,
                    int64_t meanCount, int64_t partCount) {
  constexpr int V = kColumnVector;
  __shared__ Acc partial[kColumnVectorLanes][32][V];
  const int64_t first = int64_t(blockIdx.y) * partCount;
  const int64_t end = min(rows, first + partCount);
  for (int64_t c0 = int64_t(blockIdx.x) * 32 * V; c0 < cols;
       c0 += int64_t(gridDim.x) * 32 * V) {
    const int64_t col = c0 + threadIdx.x * V;
    Acc acc[V];
    for (int e = 0; e < V; ++e)
      acc[e] = init;
    if (col < cols)
      for (int64_t r = first + threadIdx.y; r < end; r += blockDim.y) {
        alignas(16) T x[V];
        const uint4 *src =
            reinterpret_cast<const uint4 *>(in + r * rowStride + col);
        for (int b = 0; b < int(V * sizeof(T) / 16); ++b)
          reinterpret_cast<uint4 *>(x)[b] = src[b];
        for (int e = 0; e < V; ++e)
          acc[e] = combine(acc[e], static_cast<Acc>(widen(x[e])));
      }
    for (int e = 0; e < V; ++e)
      partial[threadIdx.y][threadIdx.x][e] = acc[e];
    __syncthreads();
    if (threadIdx.y == 0 && col < cols)
      for (int e = 0; e < V; ++e) {
        for (int y = 1; y < kColumnVectorLanes; ++y)
          acc[e] = combine(acc[e], partial[y][threadIdx.x][e]);
        if (parts)
          parts[blockIdx.y * cols + col + e] = acc[e];
        else
          out[col + e] = finishReduce<T>(acc[e], meanCount);
      }
    __syncthreads();
  }
}

/// Whether reduceColumnsKernel serves `plan` on `in`.
template <typename T>
bool reducesColumns(const detail::ReducePlan &plan, const T *in) {
  return !plan.innerReduced && plan.kept.rank == 1 &&
         plan.kept.strides[0] == 1 && plan.red.rank == 1 &&
         plan.keptCount % kColumnVector == 0 &&
         plan.red.strides[0] % kColumnVector == 0 &&
         (sizeof(T) == 2 || sizeof(T) == 4) &&
         reinterpret_cast<uintptr_t>(in) % 16 == 0;
}

template <typename T, typename Acc, typename Combine>
void launchReduce(T *out, const T *in, const detail::ReducePlan &plan, Acc init,
                  Combine combine, int64_t meanCount) {
  if (plan.innerReduced) {
    LaunchConfig launch = rowsFor(plan.keptCount);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   reduceContiguousKernel<T, Acc, Combine>)
    (out, in, plan, init, combine, meanCount);
  } else if (reducesColumns(plan, in)) {
    const ColumnGrid g =
        columnGrid(plan.keptCount, 32 * kColumnVector, plan.redCount);
    Scratch<Acc> parts(g.parts > 1 ? g.parts * plan.keptCount : 0);
    FASTLLM_LAUNCH(g.grid, dim3(32, kColumnVectorLanes), 0, stream(),
                   reduceColumnsKernel<T, Acc, Combine>)
    (out, parts.get(), in, plan.redCount, plan.keptCount, plan.red.strides[0],
     init, combine, meanCount, g.partRows);
    checkLaunch();
    combineParts(out, parts.get(), plan.keptCount, g.parts, combine, meanCount);
  } else {
    const ColumnGrid g = columnGrid(plan.keptCount, kColumnTile, plan.redCount);
    Scratch<Acc> parts(g.parts > 1 ? g.parts * plan.keptCount : 0);
    FASTLLM_LAUNCH(g.grid, dim3(kColumnTile, kColumnLanes), 0, stream(),
                   reduceStridedKernel<T, Acc, Combine>)
    (out, parts.get(), in, plan, init, combine, meanCount, g.partRows);
    checkLaunch();
    combineParts(out, parts.get(), plan.keptCount, g.parts, combine, meanCount);
  }
  checkLaunch();
}

} // namespace

template <typename T>
void reduce(T *out, const T *in, int rank, const int64_t *shape,
            const bool *reducedDims, ReduceKind kind) {
  const detail::ReducePlan plan = detail::planReduce(rank, shape, reducedDims);
  if (plan.keptCount == 0)
    return;
  // Max compares, and the empty results are made, in T's compute type (a bf16
  // max in float, its empty results those of float).
  using Value = ComputeType<T>;
  if (plan.redCount == 0) {
    Value empty = kind == ReduceKind::Max ? lowest<Value>() : Value(0);
    if (kind == ReduceKind::Mean && std::numeric_limits<Value>::has_quiet_NaN)
      empty = std::numeric_limits<Value>::quiet_NaN();
    return fill(out, plan.keptCount, empty);
  }
  // Only size-1 dims reduced: the output is the input.
  if (plan.red.rank == 0)
    return copy(out, in, plan.keptCount);
  if (kind == ReduceKind::Max)
    return launchReduce(out, in, plan, lowest<Value>(), MaxNan{}, 0);
  using Acc =
      std::conditional_t<std::is_floating_point_v<Value>, double, int64_t>;
  launchReduce(out, in, plan, Acc(0), Plus{},
               kind == ReduceKind::Mean ? plan.redCount : 0);
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_REDUCE_TYPES(FASTLLM_INSTANTIATE_REDUCE)
FASTLLM_INSTANTIATE_REDUCE(__nv_bfloat16)

} // namespace fastllm::rt::cuda
