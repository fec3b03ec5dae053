//===- DataMovement.cu - transpose, slice, concat, gather -------*- C++ -*-===//
//
// runtime/KernelApi.inc's data movement for the CUDA library: transpose,
// slice, sliceGrad, concat, gather and gatherGrad, for every element type of
// runtime/KernelInstantiations.h's FASTLLM_DATA_TYPES and __nv_bfloat16.
//
// transpose moving the last dim copies 32 x 32 tiles through shared memory,
// so that reads and writes are both coalesced; otherwise, like slice, it is
// an elementwise copy. gatherGrad has no atomics: each element of din is
// owned by one thread, which adds its indices' rows in order of j; a bf16
// din is summed in float (a float temporary of din's size) and each element
// rounded once.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/Common.cuh"

#include <algorithm>

namespace fastllm::rt::cuda {

//===----------------------------------------------------------------------===//
// Plans
//===----------------------------------------------------------------------===//

detail::TransposePlan detail::planTranspose(int rank, const int64_t *inShape,
                                            const int64_t *perm) {
  detail::checkRank(rank, "transpose");
  return ::fastllm::rt::detail::planTranspose(rank, inShape, perm,
                                              kTransposeTile);
}

int64_t detail::gatherGradBands(int64_t outer, int64_t dimSize) {
  // About kWantedBlocks blocks in all; each scans the indices once.
  constexpr int64_t kWantedBlocks = 1024;
  const int64_t bands = (kWantedBlocks + std::max<int64_t>(outer, 1) - 1) /
                        std::max<int64_t>(outer, 1);
  return std::clamp<int64_t>(bands, 1, std::max<int64_t>(dimSize, 1));
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

namespace {

/// x unchanged: elementwise with it copies, converting to the output's type.
struct Identity {
  template <typename T> __host__ __device__ T operator()(T x) const {
    return x;
  }
};

/// Transposes the tiles of plan (see TransposePlan), one 32 x 32 tile per
/// block iteration with a 32 x 8 block: read with threadIdx.x along the
/// input's contiguous dim q, written with threadIdx.x along the output's
/// contiguous last dim, through shared memory padded against bank conflicts.
template <typename T>
__global__ void transposeTilesKernel(T *out, const T *in,
                                     detail::TransposePlan plan) {
  constexpr int kTile = detail::kTransposeTile;
  __shared__ T tile[kTile][kTile + 1]; // [last][q]
  for (int64_t t = blockIdx.x; t < plan.numTiles; t += gridDim.x) {
    const int64_t lastTile = t % plan.lastTiles;
    const int64_t qTile = t / plan.lastTiles % plan.qTiles;
    const int64_t outer = t / (plan.lastTiles * plan.qTiles);
    const T *src = in + plan.outerIn.offset(outer);
    T *dst = out + plan.outerOut.offset(outer);
    const int64_t q0 = qTile * kTile, l0 = lastTile * kTile;
    const int64_t qRead = q0 + threadIdx.x;
    for (int j = threadIdx.y; j < kTile; j += blockDim.y)
      if (qRead < plan.qSize && l0 + j < plan.lastSize)
        tile[j][threadIdx.x] = src[qRead + (l0 + j) * plan.lastInStride];
    __syncthreads();
    const int64_t lWrite = l0 + threadIdx.x;
    for (int i = threadIdx.y; i < kTile; i += blockDim.y)
      if (q0 + i < plan.qSize && lWrite < plan.lastSize)
        dst[(q0 + i) * plan.qOutStride + lWrite] = tile[threadIdx.x][i];
    __syncthreads();
  }
}

/// dst[at.offset(i)] = src[i] for i < total: a contiguous source written
/// into a strided destination, one element per thread.
template <typename T>
__global__ void scatterKernel(T *dst, StridedIndex at, int64_t total,
                              const T *src) {
  for (int64_t i = globalThread(); i < total; i += gridThreads())
    dst[at.offset(i)] = src[i];
}

/// dst[r·dstPitch + c] = src[r·len + c] for r < rows, c < len: one input of
/// concat into its columns of the output, one element per thread.
template <typename T>
__global__ void copyRowsKernel(T *dst, int64_t dstPitch, const T *src,
                               int64_t rows, int64_t len) {
  for (int64_t e = globalThread(); e < rows * len; e += gridThreads()) {
    int64_t r = e / len, c = e - r * len;
    dst[r * dstPitch + c] = src[e];
  }
}

/// copyRowsKernel in 16-byte chunks: dst and src rows of `chunks` chunks
/// each, dst rows `dstPitch` chunks apart, one chunk per thread.
__global__ void copyRowChunksKernel(uint4 *dst, int64_t dstPitch,
                                    const uint4 *src, int64_t rows,
                                    int64_t chunks) {
  for (int64_t e = globalThread(); e < rows * chunks; e += gridThreads()) {
    const int64_t r = e / chunks, c = e - r * chunks;
    dst[r * dstPitch + c] = src[e];
  }
}

/// out[o][j][i] = in[o][wrap(idx[j])][i], one output element per thread.
template <typename T, typename Idx>
__global__ void gatherKernel(T *out, const T *in, const Idx *idx, int64_t total,
                             int64_t dimSize, int64_t numIdx, int64_t inner) {
  for (int64_t u = globalThread(); u < total; u += gridThreads()) {
    int64_t i = u % inner, oj = u / inner;
    int64_t j = oj % numIdx, o = oj / numIdx;
    out[u] = in[(o * dimSize + wrapIndex(idx[j], dimSize)) * inner + i];
  }
}

constexpr int kGatherGradThreads = 256;

/// Adds dout into the zeroed table (gatherGrad's din, or its float sums for
/// a bf16 din): block (o, band) owns the table rows [band·dimSize/bands,
/// (band + 1)·dimSize/bands) of outer slice o, all their columns. It walks
/// the indices a block-width chunk at a time, keeps those that land in its
/// rows in order of j (a block-wide prefix sum), and adds each kept dout
/// row into its table row, thread t owning columns t, t + blockDim, ...: no
/// two blocks write one element, and each element sees its additions in
/// the CPU's order.
template <typename Acc, typename T, typename Idx>
__global__ void __launch_bounds__(kGatherGradThreads)
    gatherGradKernel(Acc *__restrict__ sums, const T *__restrict__ dout,
                     const Idx *__restrict__ idx, int64_t outer,
                     int64_t dimSize, int64_t numIdx, int64_t inner,
                     int64_t bands) {
  __shared__ int64_t keptRows[kGatherGradThreads], keptJ[kGatherGradThreads];
  __shared__ int warpKept[kGatherGradThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t ob = blockIdx.x; ob < outer * bands; ob += gridDim.x) {
    const int64_t o = ob / bands, band = ob % bands;
    const int64_t lo = band * dimSize / bands,
                  hi = (band + 1) * dimSize / bands;
    Acc *table = sums + o * dimSize * inner;
    const T *grad = dout + o * numIdx * inner;
    for (int64_t j0 = 0; j0 < numIdx; j0 += blockDim.x) {
      const int64_t j = j0 + threadIdx.x;
      const int64_t row = j < numIdx ? wrapIndex(idx[j], dimSize) : -1;
      const int keep = row >= lo && row < hi;
      // This lane's place among the warp's kept indices, then the warp's
      // among the block's.
      int before = keep;
      for (int d = 1; d < 32; d *= 2) {
        const int up = __shfl_up_sync(kFullMask, before, d);
        if (lane >= d)
          before += up;
      }
      if (lane == 31)
        warpKept[warp] = before;
      before -= keep;
      __syncthreads();
      int offset = 0, total = 0;
      for (int w = 0; w < int(blockDim.x / 32); ++w) {
        offset += w < warp ? warpKept[w] : 0;
        total += warpKept[w];
      }
      if (keep) {
        keptRows[offset + before] = row;
        keptJ[offset + before] = j;
      }
      __syncthreads();
      // The next chunk rewrites warpKept before its first barrier (every
      // thread read it before the second one here) and the kept lists only
      // after it (every thread is done with them by then).
      for (int e = 0; e < total; ++e) {
        Acc *dst = table + keptRows[e] * inner;
        const T *src = grad + keptJ[e] * inner;
        for (int64_t c = threadIdx.x; c < inner; c += blockDim.x)
          dst[c] += widen(src[c]);
      }
    }
  }
}

/// Zeroes the [outer, dimSize, inner] table `sums` and adds dout into it.
template <typename Acc, typename T, typename Idx>
void launchGatherGrad(Acc *sums, const T *dout, const Idx *idx, int64_t outer,
                      int64_t dimSize, int64_t numIdx, int64_t inner) {
  FASTLLM_CUDA_CHECK(cudaMemsetAsync(
      sums, 0, size_t(outer * dimSize * inner) * sizeof(Acc), stream()));
  if (numIdx == 0)
    return;
  const int64_t bands = detail::gatherGradBands(outer, dimSize);
  const unsigned blocks = static_cast<unsigned>(
      std::clamp<int64_t>(outer * bands, 1, detail::kMaxGridBlocks));
  FASTLLM_LAUNCH(blocks, kGatherGradThreads, 0, stream(),
                 gatherGradKernel<Acc, T, Idx>)
  (sums, dout, idx, outer, dimSize, numIdx, inner, bands);
  checkLaunch();
}

} // namespace

template <typename T>
void transpose(T *out, const T *in, int rank, const int64_t *inShape,
               const int64_t *perm) {
  const detail::TransposePlan plan = detail::planTranspose(rank, inShape, perm);
  if (plan.total == 0)
    return;
  if (!plan.tiled)
    return elementwise(out, plan.rank, plan.dims, Identity(),
                       In<T>{in, plan.inStrides});
  const dim3 block(detail::kTransposeTile, 8);
  const unsigned blocks = static_cast<unsigned>(
      std::min<int64_t>(plan.numTiles, detail::kMaxGridBlocks));
  FASTLLM_LAUNCH(blocks, block, 0, stream(), transposeTilesKernel<T>)
  (out, in, plan);
  checkLaunch();
}

template <typename T>
void slice(T *out, const T *in, int rank, const int64_t *inShape,
           const int64_t *start, const int64_t *stride,
           const int64_t *outShape) {
  detail::checkRank(rank, "slice");
  int64_t strides[kMaxRank];
  int64_t offset = sliceLayout(rank, inShape, start, stride, strides);
  elementwise(out, rank, outShape, Identity(), In<T>{in + offset, strides});
}

template <typename T>
void sliceGrad(T *din, const T *dout, int rank, const int64_t *inShape,
               const int64_t *start, const int64_t *stride,
               const int64_t *outShape) {
  detail::checkRank(rank, "sliceGrad");
  const int64_t inCount = numElements(rank, inShape);
  if (inCount == 0)
    return;
  FASTLLM_CUDA_CHECK(
      cudaMemsetAsync(din, 0, size_t(inCount) * sizeof(T), stream()));
  StridedIndex at{};
  const int64_t offset = sliceLayout(rank, inShape, start, stride, at.strides);
  std::copy_n(outShape, rank, at.shape);
  const int64_t total = numElements(rank, outShape);
  if (total == 0)
    return;
  // dout is contiguous, so collapsing for the strided side alone keeps its
  // flat index.
  at.rank = detail::collapseDims(rank, at.shape, 1, &at.strides);
  LaunchConfig launch = gridFor(total);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(), scatterKernel<T>)
  (din + offset, at, total, dout);
  checkLaunch();
}

template <typename T>
void concat(T *out, int numInputs, const T *const *ins, const int64_t *sizes,
            int64_t outer, int64_t inner) {
  int64_t outRow = 0;
  for (int i = 0; i < numInputs; ++i)
    outRow += sizes[i] * inner;
  int64_t first = 0;
  for (int i = 0; i < numInputs; ++i) {
    const int64_t len = sizes[i] * inner;
    const bool chunked = (len * sizeof(T)) % 16 == 0 &&
                         (outRow * sizeof(T)) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(out + first) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(ins[i]) % 16 == 0;
    if (len > 0 && outer > 0 && chunked) {
      const int64_t chunks = len * int64_t(sizeof(T)) / 16;
      LaunchConfig launch = gridFor(outer * chunks);
      FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                     copyRowChunksKernel)
      (reinterpret_cast<uint4 *>(out + first),
       outRow * int64_t(sizeof(T)) / 16,
       reinterpret_cast<const uint4 *>(ins[i]), outer, chunks);
      checkLaunch();
    } else if (len > 0 && outer > 0) { // an empty input may have no buffer
      LaunchConfig launch = gridFor(outer * len);
      FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                     copyRowsKernel<T>)
      (out + first, outRow, ins[i], outer, len);
      checkLaunch();
    }
    first += len;
  }
}

template <typename T, typename Idx>
void gather(T *out, const T *in, const Idx *idx, int64_t outer, int64_t dimSize,
            int64_t numIdx, int64_t inner) {
  const int64_t total = outer * numIdx * inner;
  if (total == 0)
    return;
  LaunchConfig launch = gridFor(total);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                 gatherKernel<T, Idx>)
  (out, in, idx, total, dimSize, numIdx, inner);
  checkLaunch();
}

template <typename T, typename Idx>
void gatherGrad(T *din, const T *dout, const Idx *idx, int64_t outer,
                int64_t dimSize, int64_t numIdx, int64_t inner) {
  const int64_t tableSize = outer * dimSize * inner;
  if (tableSize == 0)
    return;
  using Acc = ComputeType<T>;
  if constexpr (std::is_same_v<Acc, T>) {
    launchGatherGrad(din, dout, idx, outer, dimSize, numIdx, inner);
  } else {
    // bf16: the sums in float, rounded into din once they are complete.
    Scratch<Acc> sums(tableSize);
    launchGatherGrad(sums.get(), dout, idx, outer, dimSize, numIdx, inner);
    const int64_t unit[] = {1};
    elementwise(din, 1, &tableSize, Identity(), In<Acc>{sums.get(), unit});
  }
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_DATA_TYPES(FASTLLM_INSTANTIATE_DATA_MOVEMENT)
FASTLLM_INSTANTIATE_DATA_MOVEMENT(__nv_bfloat16)
FASTLLM_GRAD_TYPES(FASTLLM_INSTANTIATE_GATHER_GRAD)
FASTLLM_INSTANTIATE_GATHER_GRAD(__nv_bfloat16)

} // namespace fastllm::rt::cuda
