//===- Common.cuh - what the CUDA kernel sources share ----------*- C++ -*-===//
//
// Private to runtime/cuda/kernels/: the block reductions, the scratch memory
// of one call, and the names every family's source uses.
//
// Row kernels (softmax, norms, losses) give a row to a block: each thread
// accumulates a strided part of the row, then blockAllReduce combines the
// threads' values with warp shuffles and one pass over the warps, always in
// the same order. Where rows must be combined (parameter gradients, loss
// sums) the combination has a fixed shape too, so every result is a function
// of the shapes and is the same from run to run.
//
// The host code of each kernel only packs the host shape arrays into kernel
// parameters (runtime/KernelPlans.h's plans and Plans.cuh's) and launches;
// nothing in these sources synchronises with the GPU.
//
// The floating kernels are templates over the element type T (float or
// __nv_bfloat16) that do all their arithmetic on widen(x), a float: for
// T = float they are the float code exactly, and a bf16 result is rounded
// once, where it is stored. Values a kernel used to store and reload
// (softmax's exponentials) are recomputed instead, so that no intermediate
// passes through a bf16 buffer.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CUDA_KERNELS_COMMON_CUH
#define FASTLLM_RUNTIME_CUDA_KERNELS_COMMON_CUH

#include "runtime/KernelInstantiations.h"
#include "runtime/cuda/Kernels.cuh"
#include "runtime/cuda/kernels/Plans.cuh"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace fastllm::rt::cuda::detail {

// The shape rules and scalar helpers both libraries share.
using ::fastllm::rt::detail::checkedTarget;
using ::fastllm::rt::detail::contiguousStrides;
using ::fastllm::rt::detail::isIgnored;
using ::fastllm::rt::detail::lowest;
using ::fastllm::rt::detail::numElements;
using ::fastllm::rt::detail::sliceLayout;
using ::fastllm::rt::detail::wrapIndex;

/// Threads of the kernels that run as a single block (loss sums, counts).
inline constexpr int kSingleBlockThreads = 1024;

/// Columns per block, and threads per column, of the kernels that sum over
/// rows into columns (reduce along a non-contiguous dim, norm gradients).
inline constexpr int kColumnTile = 32;
inline constexpr int kColumnLanes = 16;

inline constexpr unsigned kFullMask = 0xffffffffu;

/// Threads per block of combinePartsKernel (columnParts' second phase,
/// Plans.cuh).
inline constexpr int kCombineThreads = 64;

/// out[o] = parts[0][o] ⊕ parts[1][o] ⊕ ... (parts [nParts][count]) in part
/// order, divided by meanCount when it is above 0. Launch it with
/// kCombineThreads per block: a few thousand outputs make more blocks.
template <typename T, typename Acc, typename Combine>
__global__ void combinePartsKernel(T *out, const Acc *parts, int64_t count,
                                   int64_t nParts, Combine combine,
                                   int64_t meanCount) {
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < count;
       o += int64_t(gridDim.x) * blockDim.x) {
    Acc acc = parts[o];
    int64_t p = 1;
    // Eight loads in flight, then their values in order.
    for (; p + 8 <= nParts; p += 8) {
      Acc x[8];
      for (int k = 0; k < 8; ++k)
        x[k] = parts[(p + k) * count + o];
      for (int k = 0; k < 8; ++k)
        acc = combine(acc, x[k]);
    }
    for (; p < nParts; ++p)
      acc = combine(acc, parts[p * count + o]);
    out[o] = static_cast<T>(meanCount > 0 ? acc / meanCount : acc);
  }
}

/// A column-sum launch: blocks of `tileCols` columns along x (at most
/// kMaxGridBlocks, grid-stride beyond), columnParts' parts of `partRows`
/// rows along y.
struct ColumnGrid {
  dim3 grid;
  int64_t parts, partRows;
};

inline ColumnGrid columnGrid(int64_t cols, int64_t tileCols, int64_t rows) {
  const int64_t tiles = (cols + tileCols - 1) / tileCols;
  const int64_t parts = columnParts(tiles, rows);
  return {dim3(unsigned(std::clamp<int64_t>(tiles, 1, kMaxGridBlocks)),
               unsigned(parts)),
          parts, (rows + parts - 1) / parts};
}

/// Device memory for the temporaries of one call, from the stream-ordered
/// allocator: allocated and freed in order on stream(), so nothing waits,
/// and the pool serves it again on later calls. Zero elements allocate
/// nothing.
template <typename T> class Scratch {
public:
  explicit Scratch(int64_t count) {
    if (count > 0)
      FASTLLM_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void **>(&ptr),
                                         size_t(count) * sizeof(T), stream()));
  }
  ~Scratch() {
    if (ptr)
      FASTLLM_CUDA_CHECK(cudaFreeAsync(ptr, stream()));
  }
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;

  T *get() const { return ptr; }

private:
  T *ptr = nullptr;
};

/// Aborts with CUDA's reason when the last launch failed.
inline void checkLaunch() { FASTLLM_CUDA_CHECK(cudaGetLastError()); }

/// The second phase of a column sum cut into `nParts` parts: out from
/// parts (combinePartsKernel); nothing when there was one part (the first
/// phase wrote out).
template <typename T, typename Acc, typename Combine>
void combineParts(T *out, const Acc *parts, int64_t count, int64_t nParts,
                  Combine combine, int64_t meanCount) {
  if (nParts <= 1)
    return;
  const LaunchConfig launch = gridFor(count, kCombineThreads);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                 combinePartsKernel<T, Acc, Combine>)
  (out, parts, count, nParts, combine, meanCount);
  checkLaunch();
}

struct Plus {
  template <typename T> __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

/// max(acc, x) that returns NaN once either is NaN, as torch.max does
/// (runtime/KernelMath.h's maxNan).
struct MaxNan {
  template <typename T> __device__ T operator()(T acc, T x) const {
    return ::fastllm::rt::detail::maxNan(acc, x);
  }
};

/// Combines `value` over the warp with a butterfly: every lane ends with the
/// same result (each step combines the same two values on both sides).
template <typename T, typename Combine>
__device__ T warpAllReduce(T value, Combine combine) {
  for (int offset = 16; offset > 0; offset /= 2)
    value = combine(value, __shfl_xor_sync(kFullMask, value, offset));
  return value;
}

/// Combines `value` over a one-dimensional block (a multiple of 32 threads)
/// and returns the result to every thread. Every thread must call it.
template <typename T, typename Combine>
__device__ T blockAllReduce(T value, Combine combine) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warpAllReduce(value, combine);
  __syncthreads(); // a previous call may still be reading `partial`
  if (lane == 0)
    partial[warp] = value;
  __syncthreads();
  value = partial[0];
  for (int w = 1; w < int(blockDim.x / 32); ++w)
    value = combine(value, partial[w]);
  return value;
}

} // namespace fastllm::rt::cuda::detail

namespace fastllm::rt::cuda {

// The kernel sources name these unqualified.
using detail::blockAllReduce;
using detail::checkedTarget;
using detail::checkLaunch;
using detail::ColumnGrid;
using detail::columnGrid;
using detail::columnParts;
using detail::combineParts;
using detail::ComputeType;
using detail::contiguousStrides;
using detail::globalThread;
using detail::gridFor;
using detail::gridThreads;
using detail::isIgnored;
using detail::kColumnLanes;
using detail::kColumnTile;
using detail::kCombineThreads;
using detail::kFullMask;
using detail::kSingleBlockThreads;
using detail::LaunchConfig;
using detail::lowest;
using detail::MaxNan;
using detail::numElements;
using detail::Plus;
using detail::rowsFor;
using detail::Scratch;
using detail::sliceLayout;
using detail::StridedIndex;
using detail::warpAllReduce;
using detail::widen;
using detail::wrapIndex;

} // namespace fastllm::rt::cuda

#endif // FASTLLM_RUNTIME_CUDA_KERNELS_COMMON_CUH
