//===- Kernels.cu - CUDA kernels for generated training code --------------===//
//
// Row kernels (softmax, norms, losses) give a row to a block: each thread
// accumulates a strided part of the row, then blockAllReduce combines the
// threads' values with warp shuffles and one pass over the warps, always in
// the same order. Where rows must be combined (parameter gradients, loss
// sums) the combination has a fixed shape too, so every result is a function
// of the shapes and is the same from run to run.
//
// The host code of each kernel only packs the host shape arrays into kernel
// parameters (the plan* functions, declared in Kernels.cuh for the tests) and
// launches; nothing here synchronises with the GPU.
//
// The floating kernels are templates over the element type T (float or
// __nv_bfloat16) that do all their arithmetic on widen(x), a float: for
// T = float they are the float code exactly, and a bf16 result is rounded
// once, where it is stored. Values a kernel used to store and reload
// (softmax's exponentials) are recomputed instead, so that no intermediate
// passes through a bf16 buffer.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/Kernels.cuh"

#include <cublasLt.h>
#include <mma.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <limits>
#include <map>
#include <type_traits>

namespace fastllm::rt::cuda {

using detail::ComputeType;
using detail::globalThread;
using detail::gridFor;
using detail::gridThreads;
using detail::LaunchConfig;
using detail::rowsFor;
using detail::StridedIndex;
using detail::widen;
namespace wmma = nvcuda::wmma;

//===----------------------------------------------------------------------===//
// The stream
//===----------------------------------------------------------------------===//

namespace {
std::atomic<cudaStream_t> currentStream{nullptr};
} // namespace

cudaStream_t stream() { return currentStream.load(std::memory_order_relaxed); }

void setStream(cudaStream_t s) {
  currentStream.store(s, std::memory_order_relaxed);
}

namespace {

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

/// Threads of the kernels that run as a single block (loss sums, counts).
constexpr int kSingleBlockThreads = 1024;

/// Columns per block, and threads per column, of the kernels that sum over
/// rows into columns (reduce along a non-contiguous dim, norm gradients).
constexpr int kColumnTile = 32;
constexpr int kColumnLanes = 16;

constexpr unsigned kFullMask = 0xffffffffu;

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

struct Plus {
  template <typename T> __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

/// max(acc, x) that returns NaN once either is NaN, as torch.max does.
struct MaxNan {
  template <typename T> __device__ T operator()(T acc, T x) const {
    return (x > acc || x != x) ? x : acc;
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

template <typename T> T lowest() {
  return std::numeric_limits<T>::has_infinity
             ? -std::numeric_limits<T>::infinity()
             : std::numeric_limits<T>::lowest();
}

/// Row-major strides of a contiguous tensor.
void contiguousStrides(int rank, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    strides[d] = s;
    s *= shape[d];
  }
}

int64_t numElements(int rank, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d)
    n *= shape[d];
  return n;
}

void checkLaunch() { FASTLLM_CUDA_CHECK(cudaGetLastError()); }

} // namespace

//===----------------------------------------------------------------------===//
// Plans: host shapes to kernel parameters
//===----------------------------------------------------------------------===//

detail::MatmulPlan detail::planMatmul(int batchRank, const int64_t *batchShape,
                                      const int64_t *aBatchStrides,
                                      const int64_t *bBatchStrides, int64_t m,
                                      int64_t k, bool transA) {
  detail::checkRank(batchRank, "matmul");
  int64_t dims[kMaxRank], strides[2][kMaxRank];
  for (int d = 0; d < batchRank; ++d) {
    dims[d] = batchShape[d];
    strides[0][d] = aBatchStrides[d];
    strides[1][d] = bBatchStrides[d];
  }
  int rank = collapseDims(batchRank, dims, 2, strides);
  MatmulPlan plan{};
  plan.m = m;
  plan.count = 1;
  plan.calls = 1;
  // A stack of A matrices times one shared B is a single taller product.
  if (rank == 1 && strides[1][0] == 0 && strides[0][0] == m * k && !transA) {
    plan.m = m * dims[0];
    return plan;
  }
  if (rank == 0)
    return plan;
  // The innermost batch dim is the batch of one strided call; the outer
  // ones give each call its first matrices.
  plan.count = dims[rank - 1];
  plan.aStride = strides[0][rank - 1];
  plan.bStride = strides[1][rank - 1];
  plan.aFirst.rank = plan.bFirst.rank = rank - 1;
  for (int d = 0; d < rank - 1; ++d) {
    plan.aFirst.shape[d] = plan.bFirst.shape[d] = dims[d];
    plan.aFirst.strides[d] = strides[0][d];
    plan.bFirst.strides[d] = strides[1][d];
    plan.calls *= dims[d];
  }
  return plan;
}

detail::TransposePlan detail::planTranspose(int rank, const int64_t *inShape,
                                            const int64_t *perm) {
  detail::checkRank(rank, "transpose");
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
  std::copy_n(strides[0], r, plan.inStrides);
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
  plan.qTiles = (plan.qSize + kTransposeTile - 1) / kTransposeTile;
  plan.lastTiles = (plan.lastSize + kTransposeTile - 1) / kTransposeTile;
  plan.numTiles =
      plan.total / (plan.qSize * plan.lastSize) * plan.qTiles * plan.lastTiles;
  return plan;
}

detail::ReducePlan detail::planReduce(int rank, const int64_t *shape,
                                      const bool *reducedDims) {
  detail::checkRank(rank, "reduce");
  ReducePlan plan{};
  plan.keptCount = plan.redCount = 1;
  for (int d = 0; d < rank; ++d)
    (reducedDims[d] ? plan.redCount : plan.keptCount) *= shape[d];
  // Drop size-1 dims and merge neighbours with the same role: the input is
  // contiguous, so such runs are single dims.
  int64_t dims[kMaxRank];
  bool reduced[kMaxRank];
  int r = 0;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] == 1)
      continue;
    if (r > 0 && reduced[r - 1] == reducedDims[d]) {
      dims[r - 1] *= shape[d];
      continue;
    }
    dims[r] = shape[d];
    reduced[r++] = reducedDims[d];
  }
  int64_t strides[kMaxRank];
  contiguousStrides(r, dims, strides);
  for (int d = 0; d < r; ++d) {
    StridedIndex &walk = reduced[d] ? plan.red : plan.kept;
    walk.shape[walk.rank] = dims[d];
    walk.strides[walk.rank++] = strides[d];
  }
  plan.innerReduced = r > 0 && reduced[r - 1];
  return plan;
}

int64_t detail::gatherGradBands(int64_t outer, int64_t dimSize, int64_t inner) {
  // Enough threads to fill a large GPU; each further band costs every
  // thread one more scan of the indices.
  constexpr int64_t kWantedThreads = 1 << 16;
  constexpr int64_t kMaxBands = 64;
  int64_t columns = std::max<int64_t>(outer * inner, 1);
  int64_t bands = (kWantedThreads + columns - 1) / columns;
  return std::clamp<int64_t>(
      bands, 1, std::min(kMaxBands, std::max<int64_t>(dimSize, 1)));
}

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

detail::LtGemm detail::planLtGemm(const MatmulPlan &plan, int64_t n,
                                  int64_t k, bool transA, bool transB) {
  LtGemm gemm;
  gemm.rows = n;
  gemm.cols = plan.m;
  gemm.depth = k;
  gemm.count = plan.count;
  // B is row-major [k, n] ([n, k] when transB): column-major n x k (k x n).
  gemm.first = transB ? LtOperand{k, n, k, plan.bStride, true}
                      : LtOperand{n, k, n, plan.bStride, false};
  // A is row-major [m, k] ([k, m] when transA): column-major k x m (m x k).
  gemm.second = transA ? LtOperand{plan.m, k, plan.m, plan.aStride, true}
                       : LtOperand{k, plan.m, k, plan.aStride, false};
  return gemm;
}

namespace {

void checkCublas(cublasStatus_t status, const char *what, const char *file,
                 int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    detail::fail(file, line, what, cublasLtGetStatusString(status));
}

#define FASTLLM_CUBLAS_CHECK(expr)                                             \
  checkCublas((expr), #expr, __FILE__, __LINE__)

/// cuBLASLt's scratch memory for the GEMMs that want some (split-k), one
/// buffer for the process, allocated with the handle. 32 MiB is what NVIDIA
/// recommends for Hopper.
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

struct LtContext {
  cublasLtHandle_t handle;
  void *workspace;
};

/// The process's cuBLASLt handle and workspace, created on first use for the
/// current device. They are never freed: at exit that would race the CUDA
/// runtime's own teardown.
const LtContext &ltContext() {
  static const LtContext context = [] {
    LtContext c;
    FASTLLM_CUBLAS_CHECK(cublasLtCreate(&c.handle));
    FASTLLM_CUDA_CHECK(cudaMalloc(&c.workspace, kLtWorkspaceBytes));
    return c;
  }();
  return context;
}

/// The largest power of two (up to 256) dividing `p`'s address: what the
/// GEMM algorithm may assume of that operand.
uint32_t alignmentOf(const void *p) {
  uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align)
    align /= 2;
  return align;
}

/// One GEMM shape's cuBLASLt descriptors and the algorithm its heuristic
/// chose, made once per shape, type and operand alignments and kept for the
/// process (a training step runs the same GEMMs every time).
struct LtPlan {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t first, second, out;
  cublasLtMatmulAlgo_t algo;
};

cublasLtMatrixLayout_t ltLayout(cudaDataType_t type, int64_t rows,
                                int64_t cols, int64_t ld, int64_t count,
                                int64_t stride) {
  if (count > std::numeric_limits<int32_t>::max())
    detail::fail(__FILE__, __LINE__, "cuBLASLt batch",
                 "more than 2^31 - 1 products in one GEMM call");
  cublasLtMatrixLayout_t layout;
  FASTLLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld));
  const int32_t batch = int32_t(count);
  FASTLLM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
  FASTLLM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
      sizeof(stride)));
  return layout;
}

/// The plan of GEMM `g` on `type` operands with an `outType` product, the
/// operands (first, second, out) aligned to `align` bytes.
const LtPlan &ltPlan(cudaDataType_t type, cudaDataType_t outType,
                     const detail::LtGemm &g, const uint32_t align[3]) {
  using Key = std::array<int64_t, 15>;
  static std::map<Key, LtPlan> plans;
  const Key key = {type,        outType,         g.rows,         g.cols,
                   g.depth,     g.count,         g.first.ld,     g.first.stride,
                   g.first.trans, g.second.ld,   g.second.stride, g.second.trans,
                   align[0],    align[1],        align[2]};
  auto [it, inserted] = plans.try_emplace(key);
  LtPlan &plan = it->second;
  if (!inserted)
    return plan;
  // fp32 accumulation and scale for either type; fp32 operands are
  // multiplied in full fp32 (no TF32: that needs CUBLAS_COMPUTE_32F_FAST_TF32),
  // as on the CPU.
  FASTLLM_CUBLAS_CHECK(
      cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opFirst = g.first.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opSecond = g.second.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
      plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opFirst, sizeof(opFirst)));
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
      plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opSecond, sizeof(opSecond)));
  plan.first = ltLayout(type, g.first.rows, g.first.cols, g.first.ld, g.count,
                        g.first.stride);
  plan.second = ltLayout(type, g.second.rows, g.second.cols, g.second.ld,
                         g.count, g.second.stride);
  plan.out =
      ltLayout(outType, g.rows, g.cols, g.rows, g.count, g.rows * g.cols);

  cublasLtMatmulPreference_t preference;
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace = kLtWorkspaceBytes;
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
      sizeof(workspace)));
  const cublasLtMatmulPreferenceAttributes_t alignAttrs[3] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 3; ++i)
    FASTLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        preference, alignAttrs[i], &align[i], sizeof(align[i])));
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2],
      sizeof(align[2])));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(
      ltContext().handle, plan.desc, plan.first, plan.second, plan.out,
      plan.out, preference, 1, &result, &found));
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  if (found == 0) {
    char what[160];
    std::snprintf(what, sizeof what,
                  "cuBLASLt has no algorithm for a %s GEMM %lld x %lld x %lld "
                  "(batch %lld)",
                  type == CUDA_R_32F ? "fp32" : "bf16", (long long)g.cols,
                  (long long)g.rows, (long long)g.depth, (long long)g.count);
    detail::fail(__FILE__, __LINE__, what, "no heuristic result");
  }
  plan.algo = result.algo;
  return plan;
}

/// c = op(A)·op(B) + beta·c, c of type TOut (T, or float to accumulate).
template <typename T, typename TOut>
void gemm(TOut *c, const T *a, const T *b, int batchRank,
          const int64_t *batchShape, const int64_t *aBatchStrides,
          const int64_t *bBatchStrides, int64_t m, int64_t n, int64_t k,
          bool transA, bool transB, float beta) {
  int64_t batch = numElements(batchRank, batchShape);
  if (batch == 0 || m == 0 || n == 0)
    return;
  if (k == 0) {
    if (beta == 0.f)
      fill(c, batch * m * n, 0.f);
    return;
  }
  const detail::MatmulPlan plan = detail::planMatmul(
      batchRank, batchShape, aBatchStrides, bBatchStrides, m, k, transA);
  const detail::LtGemm gemm = detail::planLtGemm(plan, n, k, transA, transB);
  const LtContext &context = ltContext();
  const float alpha = 1.f;
  for (int64_t call = 0; call < plan.calls; ++call) {
    const T *first = b + plan.bFirst.offset(call);
    const T *second = a + plan.aFirst.offset(call);
    TOut *out = c + call * plan.count * plan.m * n;
    const uint32_t align[3] = {alignmentOf(first), alignmentOf(second),
                               alignmentOf(out)};
    const LtPlan &lt = ltPlan(detail::gemmDataType<T>(),
                              detail::gemmDataType<TOut>(), gemm, align);
    FASTLLM_CUBLAS_CHECK(cublasLtMatmul(
        context.handle, lt.desc, &alpha, first, lt.first, second, lt.second,
        &beta, out, lt.out, out, lt.out, &lt.algo, context.workspace,
        kLtWorkspaceBytes, stream()));
  }
}

} // namespace

template <typename T>
void matmul(T *c, const T *a, const T *b, int batchRank,
            const int64_t *batchShape, const int64_t *aBatchStrides,
            const int64_t *bBatchStrides, int64_t m, int64_t n, int64_t k,
            bool transA, bool transB) {
  gemm(c, a, b, batchRank, batchShape, aBatchStrides, bBatchStrides, m, n, k,
       transA, transB, 0.f);
}

template <typename T>
void addMatmul(float *acc, const T *a, const T *b, int batchRank,
               const int64_t *batchShape, const int64_t *aBatchStrides,
               const int64_t *bBatchStrides, int64_t m, int64_t n, int64_t k,
               bool transA, bool transB) {
  gemm(acc, a, b, batchRank, batchShape, aBatchStrides, bBatchStrides, m, n, k,
       transA, transB, 1.f);
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

template <typename Idx>
__device__ int64_t wrapIndex(Idx index, int64_t dimSize) {
  int64_t i = index < 0 ? int64_t(index) + dimSize : int64_t(index);
  assert(i >= 0 && i < dimSize && "gather index out of range");
  return i;
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

/// Adds dout into the zeroed table (gatherGrad's din, or its float sums for
/// a bf16 din): thread (o, band, col) owns column col of the table rows ≡
/// band (mod bands) of outer slice o, and walks all the indices in order of
/// j, adding the rows that land in its band. No two threads write one
/// element, and each element sees its additions in the CPU's order.
template <typename Acc, typename T, typename Idx>
__global__ void
gatherGradKernel(Acc *__restrict__ sums, const T *__restrict__ dout,
                 const Idx *__restrict__ idx, int64_t outer, int64_t dimSize,
                 int64_t numIdx, int64_t inner, int64_t bands) {
  for (int64_t u = globalThread(); u < outer * bands * inner;
       u += gridThreads()) {
    const int64_t col = u % inner, ob = u / inner;
    const int64_t band = ob % bands, o = ob / bands;
    Acc *table = sums + o * dimSize * inner + col;
    const T *grad = dout + o * numIdx * inner + col;
    for (int64_t j = 0; j < numIdx; ++j) {
      int64_t row = wrapIndex(idx[j], dimSize);
      if (row % bands == band)
        table[row * inner] += widen(grad[j * inner]);
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
  const int64_t bands = detail::gatherGradBands(outer, dimSize, inner);
  LaunchConfig launch = gridFor(outer * bands * inner);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                 gatherGradKernel<Acc, T, Idx>)(
      sums, dout, idx, outer, dimSize, numIdx, inner, bands);
  checkLaunch();
}

/// The strides and first offset of a slice, in elements of the input.
int64_t sliceLayout(int rank, const int64_t *inShape, const int64_t *start,
                    const int64_t *stride, int64_t *strides) {
  contiguousStrides(rank, inShape, strides);
  int64_t offset = 0;
  for (int d = 0; d < rank; ++d) {
    offset += start[d] * strides[d];
    strides[d] *= stride[d];
  }
  return offset;
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
  FASTLLM_LAUNCH(blocks, block, 0, stream(), transposeTilesKernel<T>)(
      out, in, plan);
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
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(), scatterKernel<T>)(
      din + offset, at, total, dout);
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
    if (len > 0 && outer > 0) { // an empty input may have no buffer
      LaunchConfig launch = gridFor(outer * len);
      FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                     copyRowsKernel<T>)(
          out + first, outRow, ins[i], outer, len);
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
                 gatherKernel<T, Idx>)(
      out, in, idx, total, dimSize, numIdx, inner);
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
/// consecutive elements); the lanes of one output split its reduced
/// elements and are combined in lane order.
template <typename T, typename Acc, typename Combine>
__global__ void reduceStridedKernel(T *out, const T *in,
                                    detail::ReducePlan plan, Acc init,
                                    Combine combine, int64_t meanCount) {
  __shared__ Acc partial[kColumnLanes][kColumnTile];
  for (int64_t o0 = int64_t(blockIdx.x) * kColumnTile; o0 < plan.keptCount;
       o0 += int64_t(gridDim.x) * kColumnTile) {
    const int64_t o = o0 + threadIdx.x;
    Acc acc = init;
    if (o < plan.keptCount) {
      const T *base = in + plan.kept.offset(o);
      for (int64_t r = threadIdx.y; r < plan.redCount; r += blockDim.y)
        acc = combine(acc, static_cast<Acc>(widen(base[plan.red.offset(r)])));
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < plan.keptCount) {
      for (int y = 1; y < kColumnLanes; ++y)
        acc = combine(acc, partial[y][threadIdx.x]);
      out[o] = finishReduce<T>(acc, meanCount);
    }
    __syncthreads();
  }
}

template <typename T, typename Acc, typename Combine>
void launchReduce(T *out, const T *in, const detail::ReducePlan &plan, Acc init,
                  Combine combine, int64_t meanCount) {
  if (plan.innerReduced) {
    LaunchConfig launch = rowsFor(plan.keptCount);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   reduceContiguousKernel<T, Acc, Combine>)(
        out, in, plan, init, combine, meanCount);
  } else {
    const unsigned blocks = static_cast<unsigned>(
        std::clamp<int64_t>((plan.keptCount + kColumnTile - 1) / kColumnTile, 1,
                            detail::kMaxGridBlocks));
    FASTLLM_LAUNCH(blocks, dim3(kColumnTile, kColumnLanes), 0, stream(),
                   reduceStridedKernel<T, Acc, Combine>)(
        out, in, plan, init, combine, meanCount);
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
// Softmax
//===----------------------------------------------------------------------===//

namespace {

/// Softmax of rows of n (inner == 1), a block per row: the row's max m, then
/// Σ e^(x - m), then y = e^(x - m) / Σ (the exponential computed again rather
/// than stored and reloaded) or (x - m) - log Σ. A row of only -inf has max
/// -inf and x - max = NaN: NaN throughout, as in PyTorch.
template <typename T>
__global__ void softmaxRowsKernel(T *y, const T *x, int64_t rows, int64_t n,
                                  bool log) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *xr = x + row * n;
    T *yr = y + row * n;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      m = MaxNan()(m, widen(xr[i]));
    m = blockAllReduce(m, MaxNan());
    float local = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      local += fastExp(widen(xr[i]) - m);
    const float sum = blockAllReduce(local, Plus());
    if (log) {
      // (x - m) - log Σ: the first difference is exact near the max.
      const float logSum = logf(sum);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = static_cast<T>((widen(xr[i]) - m) - logSum);
      continue;
    }
    const float inv = 1.f / sum;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      yr[i] = static_cast<T>(fastExp(widen(xr[i]) - m) * inv);
  }
}

/// Softmax along n of [outer, n, inner] with inner > 1: a thread per column
/// (o, i), walking n three times (max, sum, output) as softmaxRowsKernel;
/// neighbouring threads read neighbouring columns.
template <typename T>
__global__ void softmaxColumnsKernel(T *y, const T *x, int64_t outer, int64_t n,
                                     int64_t inner, bool log) {
  for (int64_t u = globalThread(); u < outer * inner; u += gridThreads()) {
    const int64_t base = u / inner * n * inner + u % inner;
    float m = -INFINITY;
    for (int64_t j = 0; j < n; ++j)
      m = MaxNan()(m, widen(x[base + j * inner]));
    float s = 0.f;
    for (int64_t j = 0; j < n; ++j)
      s += fastExp(widen(x[base + j * inner]) - m);
    s = log ? logf(s) : 1.f / s;
    for (int64_t j = 0; j < n; ++j) {
      const float shifted = widen(x[base + j * inner]) - m;
      y[base + j * inner] =
          static_cast<T>(log ? shifted - s : fastExp(shifted) * s);
    }
  }
}

/// softmaxGrad along rows of n (inner == 1), a block per row.
template <typename T>
__global__ void softmaxGradRowsKernel(T *dx, const T *y, const T *dy,
                                      int64_t rows, int64_t n, bool log) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *yr = y + row * n, *gr = dy + row * n;
    T *dr = dx + row * n;
    double local = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      local += log ? double(widen(gr[i])) : double(widen(gr[i])) * widen(yr[i]);
    const float s = static_cast<float>(blockAllReduce(local, Plus()));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      dr[i] = static_cast<T>(log ? widen(gr[i]) - fastExp(widen(yr[i])) * s
                                 : widen(yr[i]) * (widen(gr[i]) - s));
  }
}

/// softmaxGrad along n with inner > 1, a thread per column as
/// softmaxColumnsKernel.
template <typename T>
__global__ void softmaxGradColumnsKernel(T *dx, const T *y, const T *dy,
                                         int64_t outer, int64_t n,
                                         int64_t inner, bool log) {
  for (int64_t u = globalThread(); u < outer * inner; u += gridThreads()) {
    const int64_t base = u / inner * n * inner + u % inner;
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      int64_t at = base + j * inner;
      sum += log ? double(widen(dy[at])) : double(widen(dy[at])) * widen(y[at]);
    }
    const float s = static_cast<float>(sum);
    for (int64_t j = 0; j < n; ++j) {
      int64_t at = base + j * inner;
      dx[at] = static_cast<T>(log ? widen(dy[at]) - fastExp(widen(y[at])) * s
                                  : widen(y[at]) * (widen(dy[at]) - s));
    }
  }
}

} // namespace

template <typename T>
void softmax(T *y, const T *x, int64_t outer, int64_t n, int64_t inner,
             bool log) {
  if (outer == 0 || n == 0 || inner == 0)
    return;
  if (inner > 1) {
    LaunchConfig launch = gridFor(outer * inner);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   softmaxColumnsKernel<T>)(y, x, outer, n, inner, log);
  } else {
    LaunchConfig launch = rowsFor(outer);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   softmaxRowsKernel<T>)(y, x, outer, n, log);
  }
  checkLaunch();
}

template <typename T>
void softmaxGrad(T *dx, const T *y, const T *dy, int64_t outer, int64_t n,
                 int64_t inner, bool log) {
  if (outer == 0 || n == 0 || inner == 0)
    return;
  if (inner > 1) {
    LaunchConfig launch = gridFor(outer * inner);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   softmaxGradColumnsKernel<T>)(
        dx, y, dy, outer, n, inner, log);
  } else {
    LaunchConfig launch = rowsFor(outer);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   softmaxGradRowsKernel<T>)(dx, y, dy, outer, n, log);
  }
  checkLaunch();
}

//===----------------------------------------------------------------------===//
// Normalisation
//===----------------------------------------------------------------------===//

namespace {

/// The mean and 1/√(biased variance + eps) of one row, as floats, from one
/// pass of Σx and Σx² in double (as the CPU). Every thread of the block must
/// call it.
template <typename T>
__device__ float2 rowMoments(const T *x, int64_t n, float eps) {
  double sum = 0, sumSq = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    double v = widen(x[i]);
    sum += v;
    sumSq += v * v;
  }
  sum = blockAllReduce(sum, Plus());
  sumSq = blockAllReduce(sumSq, Plus());
  double mean = sum / n;
  double var = sumSq / n - mean * mean;
  var = var < 0.0 ? 0.0 : var; // std::max(var, 0.0): NaN stays NaN
  return make_float2(static_cast<float>(mean),
                     static_cast<float>(1.0 / sqrt(var + eps)));
}

/// 1/√(mean(x²) + eps) of one row, as rowMoments.
template <typename T>
__device__ float rowRstd(const T *x, int64_t n, float eps) {
  double sumSq = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    sumSq += double(widen(x[i])) * widen(x[i]);
  sumSq = blockAllReduce(sumSq, Plus());
  return static_cast<float>(1.0 / sqrt(sumSq / n + eps));
}

/// layerNorm, a block per row.
template <typename T>
__global__ void layerNormKernel(T *y, const T *x, const T *scale, const T *bias,
                                int64_t rows, int64_t cols, float eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *xr = x + row * cols;
    T *yr = y + row * cols;
    const float2 mr = rowMoments(xr, cols, eps);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      float v = (widen(xr[i]) - mr.x) * mr.y * widen(scale[i]);
      yr[i] = static_cast<T>(bias ? v + widen(bias[i]) : v);
    }
  }
}

/// dx of layerNorm, a block per row, also saving each row's (mean, rstd) for
/// normColumnSumsKernel: dx = rstd·(g - mean(g) - x̂·mean(g·x̂)), g = dy·scale.
template <typename T>
__global__ void layerNormGradRowsKernel(T *dx, float2 *stats, const T *x,
                                        const T *scale, const T *dy,
                                        int64_t rows, int64_t cols, float eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *xr = x + row * cols, *gr = dy + row * cols;
    T *dr = dx + row * cols;
    const float2 mr = rowMoments(xr, cols, eps);
    const float m = mr.x, r = mr.y;
    if (threadIdx.x == 0)
      stats[row] = mr;
    double sumG = 0, sumGX = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      float g = widen(gr[i]) * widen(scale[i]);
      sumG += g;
      sumGX += double(g) * ((widen(xr[i]) - m) * r);
    }
    const float a = static_cast<float>(blockAllReduce(sumG, Plus()) / cols);
    const float b = static_cast<float>(blockAllReduce(sumGX, Plus()) / cols);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      float xhat = (widen(xr[i]) - m) * r;
      dr[i] =
          static_cast<T>(r * (widen(gr[i]) * widen(scale[i]) - a - xhat * b));
    }
  }
}

/// rmsNorm, a block per row.
template <typename T>
__global__ void rmsNormKernel(T *y, const T *x, const T *scale, int64_t rows,
                              int64_t cols, float eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *xr = x + row * cols;
    T *yr = y + row * cols;
    const float r = rowRstd(xr, cols, eps);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
      yr[i] = static_cast<T>(widen(xr[i]) * r * widen(scale[i]));
  }
}

/// dx of rmsNorm, a block per row, saving (0, rstd) per row so that
/// normColumnSumsKernel's x̂ = (x - 0)·rstd is rmsNorm's x·rstd exactly:
/// dx = rstd·(g - x̂·mean(g·x̂)), g = dy·scale.
template <typename T>
__global__ void rmsNormGradRowsKernel(T *dx, float2 *stats, const T *x,
                                      const T *scale, const T *dy, int64_t rows,
                                      int64_t cols, float eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *xr = x + row * cols, *gr = dy + row * cols;
    T *dr = dx + row * cols;
    const float r = rowRstd(xr, cols, eps);
    if (threadIdx.x == 0)
      stats[row] = make_float2(0.f, r);
    double sumGX = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
      sumGX += double(widen(gr[i]) * widen(scale[i])) * (widen(xr[i]) * r);
    const float b = static_cast<float>(blockAllReduce(sumGX, Plus()) / cols);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      float xhat = widen(xr[i]) * r;
      dr[i] = static_cast<T>(r * (widen(gr[i]) * widen(scale[i]) - xhat * b));
    }
  }
}

/// dscale[j] = Σ_rows dy·x̂ and dbias[j] = Σ_rows dy (either nullable), with
/// x̂ = (x - mean)·rstd from the saved row stats: a kColumnTile x
/// kColumnLanes block per kColumnTile columns, the lanes of a column
/// splitting the rows and combined in lane order, all in double.
template <typename T>
__global__ void normColumnSumsKernel(T *dscale, T *dbias, const T *x,
                                     const T *dy, const float2 *stats,
                                     int64_t rows, int64_t cols) {
  __shared__ double partial[2][kColumnLanes][kColumnTile];
  for (int64_t c0 = int64_t(blockIdx.x) * kColumnTile; c0 < cols;
       c0 += int64_t(gridDim.x) * kColumnTile) {
    const int64_t col = c0 + threadIdx.x;
    double sumScale = 0, sumBias = 0;
    if (col < cols)
      for (int64_t row = threadIdx.y; row < rows; row += blockDim.y) {
        const float2 s = stats[row];
        const float g = widen(dy[row * cols + col]);
        const float xhat = (widen(x[row * cols + col]) - s.x) * s.y;
        sumScale += double(g) * xhat;
        sumBias += g;
      }
    partial[0][threadIdx.y][threadIdx.x] = sumScale;
    partial[1][threadIdx.y][threadIdx.x] = sumBias;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
      for (int y = 1; y < kColumnLanes; ++y) {
        sumScale += partial[0][y][threadIdx.x];
        sumBias += partial[1][y][threadIdx.x];
      }
      if (dscale)
        dscale[col] = static_cast<T>(sumScale);
      if (dbias)
        dbias[col] = static_cast<T>(sumBias);
    }
    __syncthreads();
  }
}

/// dscale and dbias are nullable: T comes from x.
template <typename T>
void launchNormColumnSums(detail::NoDeduce<T> *dscale,
                          detail::NoDeduce<T> *dbias, const T *x, const T *dy,
                          const float2 *stats, int64_t rows, int64_t cols) {
  if (!dscale && !dbias)
    return;
  const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>(
      (cols + kColumnTile - 1) / kColumnTile, 1, detail::kMaxGridBlocks));
  FASTLLM_LAUNCH(blocks, dim3(kColumnTile, kColumnLanes), 0, stream(),
                 normColumnSumsKernel<T>)(
      dscale, dbias, x, dy, stats, rows, cols);
  checkLaunch();
}

} // namespace

template <typename T>
void layerNorm(T *y, const T *x, const T *scale,
               const detail::NoDeduce<T> *bias, int64_t rows, int64_t cols,
               float eps) {
  if (rows == 0 || cols == 0)
    return;
  LaunchConfig launch = rowsFor(rows);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(), layerNormKernel<T>)(
      y, x, scale, bias, rows, cols, eps);
  checkLaunch();
}

template <typename T>
void layerNormGrad(T *dx, detail::NoDeduce<T> *dscale,
                   detail::NoDeduce<T> *dbias, const T *x, const T *scale,
                   const T *dy, int64_t rows, int64_t cols, float eps) {
  if (cols == 0)
    return;
  Scratch<float2> stats(rows);
  if (rows > 0) {
    LaunchConfig launch = rowsFor(rows);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   layerNormGradRowsKernel<T>)(
        dx, stats.get(), x, scale, dy, rows, cols, eps);
    checkLaunch();
  }
  launchNormColumnSums(dscale, dbias, x, dy, stats.get(), rows, cols);
}

template <typename T>
void rmsNorm(T *y, const T *x, const T *scale, int64_t rows, int64_t cols,
             float eps) {
  if (rows == 0 || cols == 0)
    return;
  LaunchConfig launch = rowsFor(rows);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(), rmsNormKernel<T>)(
      y, x, scale, rows, cols, eps);
  checkLaunch();
}

template <typename T>
void rmsNormGrad(T *dx, detail::NoDeduce<T> *dscale, const T *x, const T *scale,
                 const T *dy, int64_t rows, int64_t cols, float eps) {
  if (cols == 0)
    return;
  Scratch<float2> stats(rows);
  if (rows > 0) {
    LaunchConfig launch = rowsFor(rows);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   rmsNormGradRowsKernel<T>)(
        dx, stats.get(), x, scale, dy, rows, cols, eps);
    checkLaunch();
  }
  launchNormColumnSums(dscale, nullptr, x, dy, stats.get(), rows, cols);
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//
//
// All three kernels work on tiles of kAttnTile = 32 query rows and 32 keys,
// with 8 warps per block. A tile boundary of the queries is one of the keys,
// so every query row of a block sees at least the first key of every key
// tile the block visits: running maxima are finite after the first tile.
//
// Shared arrays that lanes read down a column (lane = row) have an odd
// leading dimension, so the 32 lanes hit 32 different banks; arrays read
// along a row, or by all lanes at one address, are unpadded.

namespace {

constexpr int kAttnTile = 32;
constexpr int kAttnWarps = 8;
constexpr int kAttnThreads = kAttnTile * kAttnWarps;
/// Query rows (forward, dQ) or keys (dK, dV) per warp.
constexpr int kAttnPerWarp = kAttnTile / kAttnWarps;

__host__ __device__ constexpr int64_t oddStride(int64_t n) { return n | 1; }

/// The forward's shared arrays, as offsets in floats: the block's queries
/// [32][d], a key tile [32][odd d] and value tile [32][dv], the unnormalised
/// outputs [32][dv], and each warp's probabilities of one row [8][32].
struct ForwardShared {
  int64_t q, k, v, o, p, total;
  __host__ __device__ ForwardShared(int64_t d, int64_t dv)
      : q(0), k(q + kAttnTile * d), v(k + kAttnTile * oddStride(d)),
        o(v + kAttnTile * dv), p(o + kAttnTile * dv), total(p + kAttnThreads) {}
};

/// The dQ kernel's: the block's queries [32][d] and output gradients
/// [32][dv], a key tile [32][odd d] and value tile [32][odd dv], the dQ
/// accumulators [32][d], and each warp's dS of one row [8][32].
struct QueryGradShared {
  int64_t q, dout, k, v, dq, ds, total;
  __host__ __device__ QueryGradShared(int64_t d, int64_t dv)
      : q(0), dout(q + kAttnTile * d), k(dout + kAttnTile * dv),
        v(k + kAttnTile * oddStride(d)), dq(v + kAttnTile * oddStride(dv)),
        ds(dq + kAttnTile * d), total(ds + kAttnThreads) {}
};

/// The dK/dV kernel's: the block's keys [32][d] and values [32][dv], a query
/// tile [32][odd d] with its output gradients [32][odd dv], lse [32] and
/// D [32], the dK and dV accumulators [32][d] and [32][dv], and each warp's
/// P and dS of one key [8][32] each.
struct KeyValueGradShared {
  int64_t k, v, q, dout, lse, dsum, dk, dv, p, ds, total;
  __host__ __device__ KeyValueGradShared(int64_t d, int64_t dvDim)
      : k(0), v(k + kAttnTile * d), q(v + kAttnTile * dvDim),
        dout(q + kAttnTile * oddStride(d)),
        lse(dout + kAttnTile * oddStride(dvDim)), dsum(lse + kAttnTile),
        dk(dsum + kAttnTile), dv(dk + kAttnTile * d), p(dv + kAttnTile * dvDim),
        ds(p + kAttnThreads), total(ds + kAttnThreads) {}
};

/// dst[r·ld + c] = src[(first + r)·cols + c] for the 32 rows from `first` of
/// the [t, cols] matrix src, zero past row t, as floats. The whole block
/// copies.
template <typename T>
__device__ void loadTile(float *dst, int64_t ld, const T *src, int64_t first,
                         int64_t t, int64_t cols) {
  for (int64_t e = threadIdx.x; e < kAttnTile * cols; e += blockDim.x) {
    int64_t r = e / cols, c = e - r * cols;
    dst[r * ld + c] = first + r < t ? widen(src[(first + r) * cols + c]) : 0.f;
  }
}

/// Σ a[c]·b[c] over c < n in double, split over the warp's lanes; every lane
/// gets the sum.
template <typename T>
__device__ float warpDot(const float *a, const T *b, int64_t n) {
  double acc = 0;
  for (int64_t c = threadIdx.x % 32; c < n; c += 32)
    acc += double(a[c]) * widen(b[c]);
  return static_cast<float>(warpAllReduce(acc, Plus()));
}

/// Σ a[x]·b[x] over x < n, by one thread.
__device__ float dot(const float *a, const float *b, int64_t n) {
  float acc = 0.f;
  for (int64_t x = 0; x < n; ++x)
    acc += a[x] * b[x];
  return acc;
}

/// The forward: block (problem b, query tile), heaviest tiles first. Warp w
/// owns rows 4w..4w+3 of the tile. For each key tile up to the diagonal,
/// lane l scores key l against a row, the warp updates the row's running max
/// m and sum l (rescaling the row's outputs by e^(m_old - m_new)), and each
/// lane adds Σ_keys p·v to its columns of the row's output.
template <typename T>
__global__ void __launch_bounds__(kAttnThreads)
    attentionForwardKernel(T *out, float *lse, const T *q, const T *k,
                           const T *v, int64_t t, int64_t d, int64_t dv,
                           float scale) {
  FASTLLM_DYNAMIC_SHARED(float, shared, 16);
  const ForwardShared at(d, dv);
  float *qs = shared + at.q, *ks = shared + at.k, *vs = shared + at.v;
  float *os = shared + at.o, *ps = shared + at.p;
  const int64_t tiles = (t + kAttnTile - 1) / kAttnTile;
  const int64_t b = blockIdx.x / tiles;
  const int64_t i0 = (tiles - 1 - blockIdx.x % tiles) * kAttnTile;
  const int64_t end = min(t, i0 + int64_t{kAttnTile});
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t ldk = oddStride(d);
  q += b * t * d;
  k += b * t * d;
  v += b * t * dv;
  out += b * t * dv;
  lse += b * t;

  loadTile(qs, d, q, i0, t, d);
  for (int64_t e = threadIdx.x; e < kAttnTile * dv; e += blockDim.x)
    os[e] = 0.f;
  float rowMax[kAttnPerWarp], rowSum[kAttnPerWarp];
  for (int rr = 0; rr < kAttnPerWarp; ++rr) {
    rowMax[rr] = -INFINITY;
    rowSum[rr] = 0.f;
  }
  float *pw = ps + warp * 32;
  for (int64_t j0 = 0; j0 < end; j0 += kAttnTile) {
    __syncthreads(); // every warp is done with the previous tile
    loadTile(ks, ldk, k, j0, t, d);
    loadTile(vs, dv, v, j0, t, dv);
    __syncthreads();
    for (int rr = 0; rr < kAttnPerWarp; ++rr) {
      const int r = warp * kAttnPerWarp + rr;
      const int64_t i = i0 + r;
      if (i >= t)
        break;
      const int64_t j = j0 + lane;
      const float s =
          j <= i ? dot(qs + r * d, ks + lane * ldk, d) * scale : -INFINITY;
      const float mOld = rowMax[rr];
      const float mNew = MaxNan()(mOld, warpAllReduce(s, MaxNan()));
      const float rescale = mOld == mNew ? 1.f : fastExp(mOld - mNew);
      const float p = fastExp(s - mNew); // masked: e^-inf = 0
      rowSum[rr] = rowSum[rr] * rescale + warpAllReduce(p, Plus());
      rowMax[rr] = mNew;
      pw[lane] = p;
      __syncwarp();
      const int keys = static_cast<int>(min(int64_t{kAttnTile}, i - j0 + 1));
      for (int64_t c = lane; c < dv; c += 32) {
        float acc = os[r * dv + c] * rescale;
        for (int jj = 0; jj < keys; ++jj)
          acc += pw[jj] * vs[jj * dv + c];
        os[r * dv + c] = acc;
      }
      __syncwarp();
    }
  }
  for (int rr = 0; rr < kAttnPerWarp; ++rr) {
    const int r = warp * kAttnPerWarp + rr;
    const int64_t i = i0 + r;
    if (i >= t)
      break;
    if (lane == 0)
      lse[i] = rowMax[rr] + logf(rowSum[rr]);
    const float inv = 1.f / rowSum[rr];
    for (int64_t c = lane; c < dv; c += 32)
      out[i * dv + c] = static_cast<T>(os[r * dv + c] * inv);
  }
}

/// dQ: block (problem b, query tile), heaviest first, warp w owning rows
/// 4w..4w+3. For each key tile up to the diagonal, lane l recomputes
/// p = e^(s - lse) and dS = p·(dout·v - D) for key l and a row, and each
/// lane adds Σ_keys dS·k to its columns of the row's dQ.
template <typename T>
__global__ void __launch_bounds__(kAttnThreads)
    attentionQueryGradKernel(T *dQ, const T *q, const T *k, const T *v,
                             const T *out, const float *lse, const T *dout,
                             int64_t t, int64_t d, int64_t dv, float scale) {
  FASTLLM_DYNAMIC_SHARED(float, shared, 16);
  const QueryGradShared at(d, dv);
  float *qs = shared + at.q, *dos = shared + at.dout, *ks = shared + at.k;
  float *vs = shared + at.v, *dqs = shared + at.dq, *dss = shared + at.ds;
  const int64_t tiles = (t + kAttnTile - 1) / kAttnTile;
  const int64_t b = blockIdx.x / tiles;
  const int64_t i0 = (tiles - 1 - blockIdx.x % tiles) * kAttnTile;
  const int64_t end = min(t, i0 + int64_t{kAttnTile});
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t ldk = oddStride(d), ldv = oddStride(dv);
  q += b * t * d;
  k += b * t * d;
  v += b * t * dv;
  out += b * t * dv;
  dout += b * t * dv;
  lse += b * t;
  dQ += b * t * d;

  loadTile(qs, d, q, i0, t, d);
  loadTile(dos, dv, dout, i0, t, dv);
  for (int64_t e = threadIdx.x; e < kAttnTile * d; e += blockDim.x)
    dqs[e] = 0.f;
  __syncthreads();
  float rowLse[kAttnPerWarp], rowD[kAttnPerWarp];
  for (int rr = 0; rr < kAttnPerWarp; ++rr) {
    const int r = warp * kAttnPerWarp + rr;
    const int64_t i = i0 + r;
    rowLse[rr] = i < t ? lse[i] : 0.f;
    rowD[rr] = i < t ? warpDot(dos + r * dv, out + i * dv, dv) : 0.f;
  }
  float *dsw = dss + warp * 32;
  for (int64_t j0 = 0; j0 < end; j0 += kAttnTile) {
    __syncthreads(); // every warp is done with the previous tile
    loadTile(ks, ldk, k, j0, t, d);
    loadTile(vs, ldv, v, j0, t, dv);
    __syncthreads();
    for (int rr = 0; rr < kAttnPerWarp; ++rr) {
      const int r = warp * kAttnPerWarp + rr;
      const int64_t i = i0 + r;
      if (i >= t)
        break;
      float ds = 0.f;
      if (j0 + lane <= i) {
        float s = dot(qs + r * d, ks + lane * ldk, d) * scale;
        float p = fastExp(s - rowLse[rr]);
        ds = p * (dot(dos + r * dv, vs + lane * ldv, dv) - rowD[rr]);
      }
      dsw[lane] = ds;
      __syncwarp();
      const int keys = static_cast<int>(min(int64_t{kAttnTile}, i - j0 + 1));
      for (int64_t x = lane; x < d; x += 32) {
        float acc = 0.f;
        for (int jj = 0; jj < keys; ++jj)
          acc += dsw[jj] * ks[jj * ldk + x];
        dqs[r * d + x] += acc;
      }
      __syncwarp();
    }
  }
  for (int rr = 0; rr < kAttnPerWarp; ++rr) {
    const int r = warp * kAttnPerWarp + rr;
    const int64_t i = i0 + r;
    if (i >= t)
      break;
    for (int64_t x = lane; x < d; x += 32)
      dQ[i * d + x] = static_cast<T>(scale * dqs[r * d + x]);
  }
}

/// dK and dV: block (problem b, key tile), heaviest (first) tiles first,
/// warp w owning keys 4w..4w+3. For each query tile from the diagonal down,
/// the warps first compute D = dout·out of the tile's rows; then, for each
/// of its keys, lane l recomputes p and dS for query row l, and each lane
/// adds Σ_rows p·dout to its columns of the key's dV and Σ_rows dS·q to its
/// columns of the key's dK.
template <typename T>
__global__ void __launch_bounds__(kAttnThreads)
    attentionKeyValueGradKernel(T *dK, T *dV, const T *q, const T *k,
                                const T *v, const T *out, const float *lse,
                                const T *dout, int64_t t, int64_t d, int64_t dv,
                                float scale) {
  FASTLLM_DYNAMIC_SHARED(float, shared, 16);
  const KeyValueGradShared at(d, dv);
  float *ks = shared + at.k, *vs = shared + at.v, *qs = shared + at.q;
  float *dos = shared + at.dout, *lses = shared + at.lse;
  float *dsums = shared + at.dsum, *dks = shared + at.dk;
  float *dvs = shared + at.dv;
  const int64_t tiles = (t + kAttnTile - 1) / kAttnTile;
  const int64_t b = blockIdx.x / tiles;
  const int64_t j0 = blockIdx.x % tiles * kAttnTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t ldq = oddStride(d), ldo = oddStride(dv);
  q += b * t * d;
  k += b * t * d;
  v += b * t * dv;
  out += b * t * dv;
  dout += b * t * dv;
  lse += b * t;
  dK += b * t * d;
  dV += b * t * dv;

  loadTile(ks, d, k, j0, t, d);
  loadTile(vs, dv, v, j0, t, dv);
  for (int64_t e = threadIdx.x; e < kAttnTile * d; e += blockDim.x)
    dks[e] = 0.f;
  for (int64_t e = threadIdx.x; e < kAttnTile * dv; e += blockDim.x)
    dvs[e] = 0.f;
  float *pw = shared + at.p + warp * 32, *dsw = shared + at.ds + warp * 32;
  for (int64_t i0 = j0; i0 < t; i0 += kAttnTile) {
    __syncthreads(); // every warp is done with the previous tile
    loadTile(qs, ldq, q, i0, t, d);
    loadTile(dos, ldo, dout, i0, t, dv);
    __syncthreads();
    for (int rr = 0; rr < kAttnPerWarp; ++rr) {
      const int r = warp * kAttnPerWarp + rr;
      const int64_t i = i0 + r;
      const float dsum = i < t ? warpDot(dos + r * ldo, out + i * dv, dv) : 0.f;
      if (lane == 0) {
        dsums[r] = dsum;
        lses[r] = i < t ? lse[i] : 0.f;
      }
    }
    __syncthreads();
    // Rows before the first key see none of the tile's keys, rows past t do
    // not exist: both get p = dS = 0 and are skipped in the sums.
    const int rows = static_cast<int>(min(int64_t{kAttnTile}, t - i0));
    for (int kk = 0; kk < kAttnPerWarp; ++kk) {
      const int jj = warp * kAttnPerWarp + kk;
      const int64_t j = j0 + jj;
      if (j >= t)
        break;
      const int64_t i = i0 + lane;
      float p = 0.f, ds = 0.f;
      if (j <= i && i < t) {
        float s = dot(qs + lane * ldq, ks + jj * d, d) * scale;
        p = fastExp(s - lses[lane]);
        ds = p * (dot(dos + lane * ldo, vs + jj * dv, dv) - dsums[lane]);
      }
      pw[lane] = p;
      dsw[lane] = ds;
      __syncwarp();
      const int first = static_cast<int>(max(int64_t{0}, j - i0));
      for (int64_t c = lane; c < dv; c += 32) {
        float acc = 0.f;
        for (int rI = first; rI < rows; ++rI)
          acc += pw[rI] * dos[rI * ldo + c];
        dvs[jj * dv + c] += acc;
      }
      for (int64_t x = lane; x < d; x += 32) {
        float acc = 0.f;
        for (int rI = first; rI < rows; ++rI)
          acc += dsw[rI] * qs[rI * ldq + x];
        dks[jj * d + x] += acc;
      }
      __syncwarp();
    }
  }
  for (int kk = 0; kk < kAttnPerWarp; ++kk) {
    const int jj = warp * kAttnPerWarp + kk;
    const int64_t j = j0 + jj;
    if (j >= t)
      break;
    for (int64_t x = lane; x < d; x += 32)
      dK[j * d + x] = static_cast<T>(scale * dks[jj * d + x]);
    for (int64_t c = lane; c < dv; c += 32)
      dV[j * dv + c] = static_cast<T>(dvs[jj * dv + c]);
  }
}

//===----------------------------------------------------------------------===//
// Tensor-core attention (bf16, head dims multiples of 16)
//===----------------------------------------------------------------------===//
//
// The same algorithm as the kernels above with the products on tensor cores
// (WMMA, bf16 16x16x16 with fp32 accumulators): blocks of 4 warps own 64
// rows, 16 per warp; tiles are 64 rows. Scores, dP and the output, dQ, dK
// and dV accumulators stay fp32 in shared memory; P and dS are rounded to
// bf16 for the products that read them (as FlashAttention does), the
// softmax statistics use the unrounded P. Two lanes serve one row in the
// elementwise parts: of a 64-wide score row, 32 columns each (pairColumn);
// of an output row, the even or the odd columns (pairSlot).

constexpr int kTcTile = 64;
constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;

using Bf16 = __nv_bfloat16;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::row_major>;
/// The transpose of a row-major [rows][ld] array read as matrix A.
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::row_major>;
/// The transpose of a row-major [rows][ld] array read as matrix B.
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

/// Shared arrays of the three kernels, as byte offsets (each a multiple of
/// 32 bytes, as WMMA loads need): bf16 tiles [64][d] or [64][dv], fp32
/// [64][64] scores (s) and dP, bf16 [64][64] P and dS, fp32 accumulators,
/// and per-row lse and D.
struct TcShared {
  int64_t q, k, v, dout, s, dp, p, ds, acc, acc2, lse, dsum, total;
  __host__ __device__ TcShared(detail::AttentionKernel kernel, int64_t d,
                               int64_t dv) {
    using K = detail::AttentionKernel;
    const bool grad = kernel != K::TcForward;
    const int64_t tileD = kTcTile * d * 2, tileV = kTcTile * dv * 2;
    const int64_t square = kTcTile * kTcTile;
    q = 0;
    k = q + tileD;
    v = k + tileD;
    dout = v + tileV;
    s = dout + (grad ? tileV : 0);
    dp = s + square * 4;
    p = dp + (grad ? square * 4 : 0);
    ds = p + (kernel != K::TcQueryGrad ? square * 2 : 0);
    acc = ds + (grad ? square * 2 : 0);
    // Forward: O [64][dv]; dQ: dQ [64][d]; dK/dV: dK [64][d], dV [64][dv].
    acc2 = acc + kTcTile * (kernel == K::TcForward ? dv : d) * 4;
    lse = acc2 + (kernel == K::TcKeyValueGrad ? kTcTile * dv * 4 : 0);
    dsum = lse + (grad ? kTcTile * 4 : 0);
    total = dsum + (grad ? kTcTile * 4 : 0);
  }
};

/// The column a lane pair's `half` visits at `step` of a 64-column row: each
/// half's 32 columns, started at a lane-dependent place so that the warp's
/// 32 lanes (16 rows 64 floats apart, all on the same bank otherwise) hit 32
/// different banks.
__device__ int pairColumn(int step, int half) {
  return half * 32 + (step + int(threadIdx.x % 32)) % 32;
}

/// The column of an n-wide row (n even) a lane pair's `half` visits at step
/// x < n / 2: the pair's even or odd columns, rotated by the pair so that
/// rows whose stride is a multiple of 32 floats spread over the banks.
__device__ int64_t pairSlot(int64_t x, int half, int64_t n) {
  return 2 * ((x + threadIdx.x % 32 / 2) % (n / 2)) + half;
}

/// dst[r·cols + c] = src[(first + r)·cols + c] for the 64 rows from `first`
/// of the bf16 [t, cols] matrix src (cols a multiple of 16, rows 32-byte
/// aligned), zero past row t; 16 bytes per thread and step.
__device__ void tcLoadTile(Bf16 *dst, const Bf16 *src, int64_t first,
                           int64_t t, int64_t cols) {
  const int64_t vecs = cols / 8; // uint4 per row
  uint4 *out = reinterpret_cast<uint4 *>(dst);
  const uint4 *in = reinterpret_cast<const uint4 *>(src);
  for (int64_t e = threadIdx.x; e < kTcTile * vecs; e += blockDim.x) {
    const int64_t r = e / vecs, c = e - r * vecs;
    out[e] = first + r < t ? in[(first + r) * vecs + c] : make_uint4(0, 0, 0, 0);
  }
}

/// dst[16 rows of the warp][64] = src[16 rows][0..n) · op(other)ᵀ over
/// 16-wide steps: the warp's scores (or dP) against a 64-row tile, stored
/// fp32 with leading dimension 64.
__device__ void tcRowsTimesTileT(float *dst, const Bf16 *rows, const Bf16 *tile,
                                 int64_t n) {
  for (int col = 0; col < kTcTile; col += 16) {
    FragC acc;
    wmma::fill_fragment(acc, 0.f);
    for (int64_t x = 0; x < n; x += 16) {
      FragA a;
      FragBT b;
      wmma::load_matrix_sync(a, rows + x, n);
      wmma::load_matrix_sync(b, tile + col * n + x, n);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(dst + col, acc, kTcTile, wmma::mem_row_major);
  }
}

/// acc[16][n] (fp32, leading dimension n) += lhs[16][64] · tile[64][n], lhs
/// bf16 with leading dimension 64 (read transposed: lhsᵀ of a [64][64]
/// array whose 16 columns from `lhs` are used).
template <typename Frag>
__device__ void tcAccumulate(float *acc, const Bf16 *lhs, const Bf16 *tile,
                             int64_t n) {
  for (int64_t col = 0; col < n; col += 16) {
    FragC c;
    wmma::load_matrix_sync(c, acc + col, n, wmma::mem_row_major);
    for (int x = 0; x < kTcTile; x += 16) {
      Frag a;
      FragB b;
      // Row-major lhs: rows of the warp, columns x..x+15. Transposed: the
      // [64][64] array's rows x..x+15, columns of the warp.
      if constexpr (std::is_same_v<Frag, FragA>)
        wmma::load_matrix_sync(a, lhs + x, kTcTile);
      else
        wmma::load_matrix_sync(a, lhs + x * kTcTile, kTcTile);
      wmma::load_matrix_sync(b, tile + x * n + col, n);
      wmma::mma_sync(c, a, b, c);
    }
    wmma::store_matrix_sync(acc + col, c, n, wmma::mem_row_major);
  }
}

/// D_i = Σ_c dout[i][c]·out[i][c] (double sums), lse_i, for the 64 rows of
/// the tile from i0 into shared dsum and lse: warp w takes rows 16w.. .
__device__ void tcRowStats(float *dsum, float *lses, const Bf16 *out,
                           const Bf16 *dout, const float *lse, int64_t i0,
                           int64_t t, int64_t dv) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int rr = 0; rr < 16; ++rr) {
    const int r = warp * 16 + rr;
    const int64_t i = i0 + r;
    double acc = 0;
    if (i < t)
      for (int64_t c = lane; c < dv; c += 32)
        acc += double(widen(dout[i * dv + c])) * widen(out[i * dv + c]);
    acc = warpAllReduce(acc, Plus());
    if (lane == 0) {
      dsum[r] = i < t ? static_cast<float>(acc) : 0.f;
      lses[r] = i < t ? lse[i] : 0.f;
    }
  }
}

/// P = e^(scale·s - lse) and dS = P∘(dP - D) of the row pair's half row
/// (queries i0 + r against keys j0..j0+63), zero where masked (j > i, or
/// past t), rounded to bf16 into p (when not null) and ds.
__device__ void tcProbsAndGrads(Bf16 *p, Bf16 *ds, const float *s,
                                const float *dp, const float *lses,
                                const float *dsum, int r, int half, int64_t i0,
                                int64_t j0, int64_t t, float scale) {
  const int64_t i = i0 + r;
  for (int step = 0; step < 32; ++step) {
    const int c = pairColumn(step, half);
    const int64_t j = j0 + c;
    float prob = 0.f, grad = 0.f;
    if (j <= i && i < t) { // j <= i < t: the key exists
      prob = fastExp(s[r * kTcTile + c] * scale - lses[r]);
      grad = prob * (dp[r * kTcTile + c] - dsum[r]);
    }
    if (p)
      p[r * kTcTile + c] = __float2bfloat16(prob);
    ds[r * kTcTile + c] = __float2bfloat16(grad);
  }
}

/// The forward (see causalAttention): block (problem b, 64-query tile),
/// heaviest first.
__global__ void __launch_bounds__(kTcThreads)
    attentionForwardTcKernel(Bf16 *out, float *lse, const Bf16 *q,
                             const Bf16 *k, const Bf16 *v, int64_t t,
                             int64_t d, int64_t dv, float scale) {
  FASTLLM_DYNAMIC_SHARED(unsigned char, tcShared, 128);
  const TcShared at(detail::AttentionKernel::TcForward, d, dv);
  Bf16 *qs = reinterpret_cast<Bf16 *>(tcShared + at.q);
  Bf16 *ks = reinterpret_cast<Bf16 *>(tcShared + at.k);
  Bf16 *vs = reinterpret_cast<Bf16 *>(tcShared + at.v);
  Bf16 *ps = reinterpret_cast<Bf16 *>(tcShared + at.p);
  float *ss = reinterpret_cast<float *>(tcShared + at.s);
  float *os = reinterpret_cast<float *>(tcShared + at.acc);
  const int64_t tiles = (t + kTcTile - 1) / kTcTile;
  const int64_t b = blockIdx.x / tiles;
  const int64_t i0 = (tiles - 1 - blockIdx.x % tiles) * kTcTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  q += b * t * d;
  k += b * t * d;
  v += b * t * dv;
  out += b * t * dv;
  lse += b * t;

  tcLoadTile(qs, q, i0, t, d);
  for (int64_t e = threadIdx.x; e < kTcTile * dv; e += blockDim.x)
    os[e] = 0.f;
  // The row this lane pair updates, and its half of the columns.
  const int r = warp * 16 + lane / 2, half = lane % 2;
  const int64_t i = i0 + r;
  float rowMax = -INFINITY, rowSum = 0.f;
  // Key tiles up to the diagonal one (j0 = i0). Every row sees key j0 of
  // each, so a tile's maximum is finite.
  for (int64_t j0 = 0; j0 <= i0; j0 += kTcTile) {
    __syncthreads(); // every warp is done with the previous tile
    tcLoadTile(ks, k, j0, t, d);
    tcLoadTile(vs, v, j0, t, dv);
    __syncthreads();
    tcRowsTimesTileT(ss + warp * 16 * kTcTile, qs + warp * 16 * d, ks, d);
    __syncwarp();
    float *srow = ss + r * kTcTile;
    float tileMax = -INFINITY;
    for (int step = 0; step < 32; ++step) {
      const int c = pairColumn(step, half);
      const int64_t j = j0 + c;
      const float sc = j <= i && j < t ? srow[c] * scale : -INFINITY;
      srow[c] = sc;
      tileMax = fmaxf(tileMax, sc);
    }
    tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 1));
    const float mNew = fmaxf(rowMax, tileMax);
    const float rescale = rowMax == mNew ? 1.f : fastExp(rowMax - mNew);
    float sum = 0.f;
    for (int step = 0; step < 32; ++step) {
      const int c = pairColumn(step, half);
      const float prob = fastExp(srow[c] - mNew); // masked: e^-inf = 0
      ps[r * kTcTile + c] = __float2bfloat16(prob);
      sum += prob;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    rowSum = rowSum * rescale + sum;
    rowMax = mNew;
    for (int64_t x = 0; x < dv / 2; ++x)
      os[r * dv + pairSlot(x, half, dv)] *= rescale;
    __syncwarp();
    tcAccumulate<FragA>(os + warp * 16 * dv, ps + warp * 16 * kTcTile, vs, dv);
    __syncwarp();
  }
  if (i >= t)
    return;
  if (half == 0)
    lse[i] = rowMax + logf(rowSum);
  const float inv = 1.f / rowSum;
  for (int64_t x = 0; x < dv / 2; ++x) {
    const int64_t c = pairSlot(x, half, dv);
    out[i * dv + c] = __float2bfloat16(os[r * dv + c] * inv);
  }
}

/// dQ: block (problem b, 64-query tile), heaviest first; key tiles up to
/// the diagonal. dQ_w += dS_w · K.
__global__ void __launch_bounds__(kTcThreads)
    attentionQueryGradTcKernel(Bf16 *dQ, const Bf16 *q, const Bf16 *k,
                               const Bf16 *v, const Bf16 *out,
                               const float *lse, const Bf16 *dout, int64_t t,
                               int64_t d, int64_t dv, float scale) {
  FASTLLM_DYNAMIC_SHARED(unsigned char, tcShared, 128);
  const TcShared at(detail::AttentionKernel::TcQueryGrad, d, dv);
  Bf16 *qs = reinterpret_cast<Bf16 *>(tcShared + at.q);
  Bf16 *ks = reinterpret_cast<Bf16 *>(tcShared + at.k);
  Bf16 *vs = reinterpret_cast<Bf16 *>(tcShared + at.v);
  Bf16 *dos = reinterpret_cast<Bf16 *>(tcShared + at.dout);
  Bf16 *dss = reinterpret_cast<Bf16 *>(tcShared + at.ds);
  float *ss = reinterpret_cast<float *>(tcShared + at.s);
  float *dps = reinterpret_cast<float *>(tcShared + at.dp);
  float *dqs = reinterpret_cast<float *>(tcShared + at.acc);
  float *lses = reinterpret_cast<float *>(tcShared + at.lse);
  float *dsums = reinterpret_cast<float *>(tcShared + at.dsum);
  const int64_t tiles = (t + kTcTile - 1) / kTcTile;
  const int64_t b = blockIdx.x / tiles;
  const int64_t i0 = (tiles - 1 - blockIdx.x % tiles) * kTcTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  q += b * t * d;
  k += b * t * d;
  v += b * t * dv;
  out += b * t * dv;
  dout += b * t * dv;
  lse += b * t;
  dQ += b * t * d;

  tcLoadTile(qs, q, i0, t, d);
  tcLoadTile(dos, dout, i0, t, dv);
  for (int64_t e = threadIdx.x; e < kTcTile * d; e += blockDim.x)
    dqs[e] = 0.f;
  tcRowStats(dsums, lses, out, dout, lse, i0, t, dv);
  const int r = warp * 16 + lane / 2, half = lane % 2;
  for (int64_t j0 = 0; j0 <= i0; j0 += kTcTile) {
    __syncthreads(); // every warp is done with the previous tile
    tcLoadTile(ks, k, j0, t, d);
    tcLoadTile(vs, v, j0, t, dv);
    __syncthreads();
    tcRowsTimesTileT(ss + warp * 16 * kTcTile, qs + warp * 16 * d, ks, d);
    tcRowsTimesTileT(dps + warp * 16 * kTcTile, dos + warp * 16 * dv, vs, dv);
    __syncwarp();
    tcProbsAndGrads(nullptr, dss, ss, dps, lses, dsums, r, half, i0, j0, t,
                    scale);
    __syncwarp();
    tcAccumulate<FragA>(dqs + warp * 16 * d, dss + warp * 16 * kTcTile, ks, d);
    __syncwarp();
  }
  const int64_t i = i0 + r;
  if (i >= t)
    return;
  for (int64_t x = 0; x < d / 2; ++x) {
    const int64_t c = pairSlot(x, half, d);
    dQ[i * d + c] = __float2bfloat16(scale * dqs[r * d + c]);
  }
}

/// dK and dV: block (problem b, 64-key tile), heaviest first; query tiles
/// from the diagonal down. Warps compute S, dP, P and dS for their 16 query
/// rows, then (after a block sync) dV_w += P_wᵀ·dO and dK_w += dS_wᵀ·Q for
/// their 16 keys.
__global__ void __launch_bounds__(kTcThreads)
    attentionKeyValueGradTcKernel(Bf16 *dK, Bf16 *dV, const Bf16 *q,
                                  const Bf16 *k, const Bf16 *v,
                                  const Bf16 *out, const float *lse,
                                  const Bf16 *dout, int64_t t, int64_t d,
                                  int64_t dv, float scale) {
  FASTLLM_DYNAMIC_SHARED(unsigned char, tcShared, 128);
  const TcShared at(detail::AttentionKernel::TcKeyValueGrad, d, dv);
  Bf16 *qs = reinterpret_cast<Bf16 *>(tcShared + at.q);
  Bf16 *ks = reinterpret_cast<Bf16 *>(tcShared + at.k);
  Bf16 *vs = reinterpret_cast<Bf16 *>(tcShared + at.v);
  Bf16 *dos = reinterpret_cast<Bf16 *>(tcShared + at.dout);
  Bf16 *ps = reinterpret_cast<Bf16 *>(tcShared + at.p);
  Bf16 *dss = reinterpret_cast<Bf16 *>(tcShared + at.ds);
  float *ss = reinterpret_cast<float *>(tcShared + at.s);
  float *dps = reinterpret_cast<float *>(tcShared + at.dp);
  float *dks = reinterpret_cast<float *>(tcShared + at.acc);
  float *dvs = reinterpret_cast<float *>(tcShared + at.acc2);
  float *lses = reinterpret_cast<float *>(tcShared + at.lse);
  float *dsums = reinterpret_cast<float *>(tcShared + at.dsum);
  const int64_t tiles = (t + kTcTile - 1) / kTcTile;
  const int64_t b = blockIdx.x / tiles;
  const int64_t j0 = blockIdx.x % tiles * kTcTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  q += b * t * d;
  k += b * t * d;
  v += b * t * dv;
  out += b * t * dv;
  dout += b * t * dv;
  lse += b * t;
  dK += b * t * d;
  dV += b * t * dv;

  tcLoadTile(ks, k, j0, t, d);
  tcLoadTile(vs, v, j0, t, dv);
  for (int64_t e = threadIdx.x; e < kTcTile * d; e += blockDim.x)
    dks[e] = 0.f;
  for (int64_t e = threadIdx.x; e < kTcTile * dv; e += blockDim.x)
    dvs[e] = 0.f;
  const int r = warp * 16 + lane / 2, half = lane % 2;
  for (int64_t i0 = j0; i0 < t; i0 += kTcTile) {
    __syncthreads(); // every warp is done with the previous tile
    tcLoadTile(qs, q, i0, t, d);
    tcLoadTile(dos, dout, i0, t, dv);
    tcRowStats(dsums, lses, out, dout, lse, i0, t, dv);
    __syncthreads();
    tcRowsTimesTileT(ss + warp * 16 * kTcTile, qs + warp * 16 * d, ks, d);
    tcRowsTimesTileT(dps + warp * 16 * kTcTile, dos + warp * 16 * dv, vs, dv);
    __syncwarp();
    tcProbsAndGrads(ps, dss, ss, dps, lses, dsums, r, half, i0, j0, t, scale);
    __syncthreads(); // the keys' warps read every query row's P and dS
    tcAccumulate<FragAT>(dvs + warp * 16 * dv, ps + warp * 16, dos, dv);
    tcAccumulate<FragAT>(dks + warp * 16 * d, dss + warp * 16, qs, d);
  }
  __syncwarp();
  const int64_t j = j0 + r;
  if (j >= t)
    return;
  for (int64_t x = 0; x < d / 2; ++x) {
    const int64_t c = pairSlot(x, half, d);
    dK[j * d + c] = __float2bfloat16(scale * dks[r * d + c]);
  }
  for (int64_t x = 0; x < dv / 2; ++x) {
    const int64_t c = pairSlot(x, half, dv);
    dV[j * dv + c] = __float2bfloat16(dvs[r * dv + c]);
  }
}

/// Blocks of a tensor-core launch over `batch` problems of `t` rows.
unsigned tcAttentionBlocks(int64_t batch, int64_t t) {
  int64_t blocks = batch * ((t + kTcTile - 1) / kTcTile);
  if (blocks > std::numeric_limits<int>::max())
    detail::fail(__FILE__, __LINE__, "attention launch",
                 "more than 2^31 - 1 tiles");
  return static_cast<unsigned>(blocks);
}

/// Lets `kernel` use `bytes` of dynamic shared memory, or aborts saying that
/// the head dims need more than the GPU has.
template <typename Kernel>
void reserveSharedMemory(Kernel *kernel, size_t bytes, const char *caller,
                         int64_t d, int64_t dv) {
  int device = 0, limit = 0;
  FASTLLM_CUDA_CHECK(cudaGetDevice(&device));
  FASTLLM_CUDA_CHECK(cudaDeviceGetAttribute(
      &limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > size_t(limit)) {
    char reason[160];
    std::snprintf(reason, sizeof(reason),
                  "head dims d=%lld, dv=%lld need %zu bytes of shared memory "
                  "per block; this GPU has %d",
                  (long long)d, (long long)dv, bytes, limit);
    detail::fail(__FILE__, __LINE__, caller, reason);
  }
  FASTLLM_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

/// Blocks of a launch over `batch` problems of `t` rows: one per tile.
unsigned attentionBlocks(int64_t batch, int64_t t) {
  int64_t blocks = batch * ((t + kAttnTile - 1) / kAttnTile);
  if (blocks > std::numeric_limits<int>::max())
    detail::fail(__FILE__, __LINE__, "attention launch",
                 "more than 2^31 - 1 tiles");
  return static_cast<unsigned>(blocks);
}

} // namespace

size_t detail::attentionSharedBytes(AttentionKernel kernel, int64_t d,
                                    int64_t dv) {
  int64_t floats = 0;
  switch (kernel) {
  case AttentionKernel::Forward:
    floats = ForwardShared(d, dv).total;
    break;
  case AttentionKernel::QueryGrad:
    floats = QueryGradShared(d, dv).total;
    break;
  case AttentionKernel::KeyValueGrad:
    floats = KeyValueGradShared(d, dv).total;
    break;
  case AttentionKernel::TcForward:
  case AttentionKernel::TcQueryGrad:
  case AttentionKernel::TcKeyValueGrad:
    return size_t(TcShared(kernel, d, dv).total);
  }
  return size_t(floats) * sizeof(float);
}

bool detail::tensorCoreAttentionShape(int64_t d, int64_t dv) {
  return d > 0 && dv > 0 && d % 16 == 0 && dv % 16 == 0;
}

namespace {

/// Whether the bf16 attention runs on tensor cores: head dims multiples of
/// 16, the pointers 16-byte aligned (tiles move in 16-byte pieces) and the
/// three kernels' shared memory within the GPU's limit.
bool useTensorCores(int64_t d, int64_t dv,
                    std::initializer_list<const void *> pointers) {
  if (!detail::tensorCoreAttentionShape(d, dv))
    return false;
  for (const void *p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16)
      return false;
  int device = 0, limit = 0;
  FASTLLM_CUDA_CHECK(cudaGetDevice(&device));
  FASTLLM_CUDA_CHECK(cudaDeviceGetAttribute(
      &limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  for (auto kernel :
       {detail::AttentionKernel::TcForward, detail::AttentionKernel::TcQueryGrad,
        detail::AttentionKernel::TcKeyValueGrad})
    if (detail::attentionSharedBytes(kernel, d, dv) > size_t(limit))
      return false;
  return true;
}

} // namespace

template <typename T>
void causalAttention(T *out, float *lse, const T *q, const T *k, const T *v,
                     int64_t batch, int64_t t, int64_t d, int64_t dv,
                     float scale) {
  if (batch == 0 || t == 0)
    return;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (useTensorCores(d, dv, {out, q, k, v})) {
      const size_t bytes = detail::attentionSharedBytes(
          detail::AttentionKernel::TcForward, d, dv);
      reserveSharedMemory(attentionForwardTcKernel, bytes, "causalAttention",
                          d, dv);
      FASTLLM_LAUNCH(tcAttentionBlocks(batch, t), kTcThreads, bytes, stream(),
                     attentionForwardTcKernel)(
          out, lse, q, k, v, t, d, dv, scale);
      checkLaunch();
      return;
    }
  }
  const size_t bytes =
      detail::attentionSharedBytes(detail::AttentionKernel::Forward, d, dv);
  reserveSharedMemory(attentionForwardKernel<T>, bytes, "causalAttention", d,
                      dv);
  FASTLLM_LAUNCH(attentionBlocks(batch, t), kAttnThreads, bytes, stream(),
                 attentionForwardKernel<T>)(out, lse, q, k, v, t, d, dv, scale);
  checkLaunch();
}

template <typename T>
void causalAttentionGrad(T *dQ, T *dK, T *dV, const T *q, const T *k,
                         const T *v, const T *out, const float *lse,
                         const T *dout, int64_t batch, int64_t t, int64_t d,
                         int64_t dv, float scale) {
  if (batch == 0 || t == 0)
    return;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (useTensorCores(d, dv, {dQ, dK, dV, q, k, v, out, dout})) {
      const unsigned blocks = tcAttentionBlocks(batch, t);
      const size_t kvBytes = detail::attentionSharedBytes(
          detail::AttentionKernel::TcKeyValueGrad, d, dv);
      reserveSharedMemory(attentionKeyValueGradTcKernel, kvBytes,
                          "causalAttentionGrad", d, dv);
      FASTLLM_LAUNCH(blocks, kTcThreads, kvBytes, stream(),
                     attentionKeyValueGradTcKernel)(
          dK, dV, q, k, v, out, lse, dout, t, d, dv, scale);
      checkLaunch();
      const size_t qBytes = detail::attentionSharedBytes(
          detail::AttentionKernel::TcQueryGrad, d, dv);
      reserveSharedMemory(attentionQueryGradTcKernel, qBytes,
                          "causalAttentionGrad", d, dv);
      FASTLLM_LAUNCH(blocks, kTcThreads, qBytes, stream(),
                     attentionQueryGradTcKernel)(
          dQ, q, k, v, out, lse, dout, t, d, dv, scale);
      checkLaunch();
      return;
    }
  }
  const unsigned blocks = attentionBlocks(batch, t);
  const size_t kvBytes = detail::attentionSharedBytes(
      detail::AttentionKernel::KeyValueGrad, d, dv);
  reserveSharedMemory(attentionKeyValueGradKernel<T>, kvBytes,
                      "causalAttentionGrad", d, dv);
  FASTLLM_LAUNCH(blocks, kAttnThreads, kvBytes, stream(),
                 attentionKeyValueGradKernel<T>)(
      dK, dV, q, k, v, out, lse, dout, t, d, dv, scale);
  checkLaunch();
  const size_t qBytes =
      detail::attentionSharedBytes(detail::AttentionKernel::QueryGrad, d, dv);
  reserveSharedMemory(attentionQueryGradKernel<T>, qBytes,
                      "causalAttentionGrad", d, dv);
  FASTLLM_LAUNCH(blocks, kAttnThreads, qBytes, stream(),
                 attentionQueryGradKernel<T>)(
      dQ, q, k, v, out, lse, dout, t, d, dv, scale);
  checkLaunch();
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

namespace {

template <typename Idx>
__device__ bool isIgnored(Idx target, bool hasIgnore, int64_t ignoreIndex) {
  return hasIgnore && int64_t(target) == ignoreIndex;
}

template <typename Idx>
__device__ int64_t checkedTarget(Idx target, int64_t classes) {
  assert(target >= 0 && int64_t(target) < classes && "target out of range");
  return int64_t(target);
}

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
  FASTLLM_LAUNCH(1, kSingleBlockThreads, 0, stream(), meanGradKernel<Idx>)(
      meanGrad, dloss, targets, rows, hasIgnore, ignoreIndex);
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
                   crossEntropyRowsKernel<Idx, T, float>)(
        loss, logits, targets, rows, classes, hasIgnore, ignoreIndex);
    return checkLaunch();
  }
  Scratch<double> perRow(rows);
  if (rows > 0) {
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   crossEntropyRowsKernel<Idx, T, double>)(
        perRow.get(), logits, targets, rows, classes, hasIgnore, ignoreIndex);
    checkLaunch();
  }
  FASTLLM_LAUNCH(1, kSingleBlockThreads, 0, stream(),
                 sumLossKernel<Idx, SavedRowLoss>)(
      loss, SavedRowLoss{perRow.get()}, targets, rows, hasIgnore, ignoreIndex, r
      == Reduction::Mean);
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
                 crossEntropyGradKernel<Idx, T>)(
      dlogits, logits, targets, grad, rows, classes, hasIgnore, ignoreIndex);
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
                   nllRowsKernel<Idx, T>)(
        loss, input, targets, rows, classes, hasIgnore, ignoreIndex);
    return checkLaunch();
  }
  FASTLLM_LAUNCH(1, kSingleBlockThreads, 0, stream(),
                 sumLossKernel<Idx, NllRowLoss<Idx, T>>)(
      loss, NllRowLoss<Idx, T>{input, targets, classes}, targets, rows,
      hasIgnore, ignoreIndex, r == Reduction::Mean);
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
                 nllLossGradKernel<Idx, T>)(
      dinput, targets, grad, rows, classes, hasIgnore, ignoreIndex);
  checkLaunch();
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

#include "runtime/KernelInstantiations.inc"

// What only the CUDA library has: the kernels above that the CPU library has
// in float alone, in float and bf16, and the bf16 versions of the shared
// templates (the CPU library has no bf16).

#define FASTLLM_FLOATING_KERNELS(T)                                            \
  template void matmul<T>(T *, const T *, const T *, int, const int64_t *,     \
                          const int64_t *, const int64_t *, int64_t, int64_t,  \
                          int64_t, bool, bool);                                \
  template void addMatmul<T>(float *, const T *, const T *, int,               \
                             const int64_t *, const int64_t *,                 \
                             const int64_t *, int64_t, int64_t, int64_t, bool, \
                             bool);                                            \
  template void softmax<T>(T *, const T *, int64_t, int64_t, int64_t, bool);   \
  template void softmaxGrad<T>(T *, const T *, const T *, int64_t, int64_t,    \
                               int64_t, bool);                                 \
  template void layerNorm<T>(T *, const T *, const T *, const T *, int64_t,    \
                             int64_t, float);                                  \
  template void layerNormGrad<T>(T *, T *, T *, const T *, const T *,          \
                                 const T *, int64_t, int64_t, float);          \
  template void rmsNorm<T>(T *, const T *, const T *, int64_t, int64_t,        \
                           float);                                             \
  template void rmsNormGrad<T>(T *, T *, const T *, const T *, const T *,      \
                               int64_t, int64_t, float);                       \
  template void causalAttention<T>(T *, float *, const T *, const T *,         \
                                   const T *, int64_t, int64_t, int64_t,       \
                                   int64_t, float);                            \
  template void causalAttentionGrad<T>(                                        \
      T *, T *, T *, const T *, const T *, const T *, const T *,               \
      const float *, const T *, int64_t, int64_t, int64_t, int64_t, float);
FASTLLM_FLOATING_KERNELS(float)
FASTLLM_FLOATING_KERNELS(__nv_bfloat16)
#undef FASTLLM_FLOATING_KERNELS

using bf16 = __nv_bfloat16;

template void transpose<bf16>(bf16 *, const bf16 *, int, const int64_t *,
                              const int64_t *);
template void slice<bf16>(bf16 *, const bf16 *, int, const int64_t *,
                          const int64_t *, const int64_t *, const int64_t *);
template void sliceGrad<bf16>(bf16 *, const bf16 *, int, const int64_t *,
                              const int64_t *, const int64_t *,
                              const int64_t *);
template void concat<bf16>(bf16 *, int, const bf16 *const *, const int64_t *,
                           int64_t, int64_t);
template void reduce<bf16>(bf16 *, const bf16 *, int, const int64_t *,
                           const bool *, ReduceKind);

#define FASTLLM_BF16_INDEXED(Idx)                                              \
  template void gather<bf16, Idx>(bf16 *, const bf16 *, const Idx *, int64_t,  \
                                  int64_t, int64_t, int64_t);                  \
  template void gatherGrad<bf16, Idx>(bf16 *, const bf16 *, const Idx *,       \
                                      int64_t, int64_t, int64_t, int64_t);     \
  template void crossEntropy<Idx, bf16>(float *, const bf16 *, const Idx *,    \
                                        int64_t, int64_t, bool, int64_t,       \
                                        Reduction);                            \
  template void crossEntropyGrad<Idx, bf16>(bf16 *, const bf16 *, const Idx *, \
                                            const float *, int64_t, int64_t,   \
                                            bool, int64_t, Reduction);         \
  template void nllLoss<Idx, bf16>(float *, const bf16 *, const Idx *,         \
                                   int64_t, int64_t, bool, int64_t,            \
                                   Reduction);                                 \
  template void nllLossGrad<Idx, bf16>(bf16 *, const Idx *, const float *,     \
                                       int64_t, int64_t, bool, int64_t,        \
                                       Reduction);
FASTLLM_BF16_INDEXED(int32_t)
FASTLLM_BF16_INDEXED(int64_t)
#undef FASTLLM_BF16_INDEXED

} // namespace fastllm::rt::cuda
