//===- Kernels.cuh - CUDA kernels for generated training code ---*- C++ -*-===//
//
// The CUDA sibling of runtime/cpu/Kernels.h: the same functions, template
// parameters and argument lists in fastllm::rt::cuda, so that `fastllm-opt`
// emits the same call sequence for both targets. What differs:
//
//  - Every data pointer is a device pointer (device, managed or __device__
//    memory). Shape, stride, permutation and flag arrays (`const int64_t
//    *shape` and the like) are host arrays, as generated code passes its local
//    arrays: their contents travel to the GPU by value, as kernel parameters.
//  - Every call enqueues its work on stream() and returns without waiting.
//    Results are ready once that stream has been synchronised.
//  - Generated functors are `__host__ __device__`; the scalar math below is
//    too, so the same expressions compile for the CPU and the GPU.
//
// Results agree with the CPU kernels to float rounding: the same algorithms
// and the same exp/tanh/erf approximations, with sums accumulated in double
// wherever the CPU kernels use double. Every kernel is deterministic (no
// floating-point atomics): a result depends on the shapes and the GPU only.
// gatherGrad adds repeated indices in index order, exactly as the CPU does.
//
// For mixed-precision steps the floating kernels (matmul, softmax, the
// norms, attention, the losses), reduce, the data movement, fill, copy and
// addInto also take T = __nv_bfloat16. bf16 is a storage type: a kernel
// loads each bf16 as a float, computes exactly as its float version does (in
// float, or double where that uses double) and rounds once, when it stores a
// T. What a signature spells float (losses, incoming loss gradients,
// attention's lse, eps, scale) stays float for both. Generated code passes
// __nv_bfloat16 pointers where it passes float pointers, with the same call
// text: T is deduced from the pointers.
//
// A few kernels need a small temporary (per-row statistics, per-row losses):
// they take it from the stream-ordered allocator (cudaMallocAsync) and give
// it back on the same stream. No kernel materialises the t x t attention
// scores.
//
// Errors: generated code has no error path, so a failing CUDA or cuBLASLt call
// prints its file, line and reason and aborts the process.
//
// Templates that take a caller's functor (elementwise) and the trivial ones
// live here; the rest are defined in Kernels.cu and explicitly instantiated
// for the element types listed beside each declaration (the CPU library's,
// plus __nv_bfloat16).
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CUDA_KERNELS_CUH
#define FASTLLM_RUNTIME_CUDA_KERNELS_CUH

#include <cuda_runtime.h>

// cuda_bf16.h defines static host functions that a file need not call: no
// -Wunused-function about them in files that include this header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include <cuda_bf16.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "runtime/KernelMath.h"
#include "runtime/Philox.h"
#include "runtime/cuda/Launch.cuh"

namespace fastllm::rt::cuda {

//===----------------------------------------------------------------------===//
// Errors and the stream
//===----------------------------------------------------------------------===//

namespace detail {
/// Prints `where: what failed: reason` and aborts.
[[noreturn]] inline void fail(const char *file, int line, const char *what,
                              const char *reason) {
  std::fprintf(stderr, "%s:%d: error: %s failed: %s\n", file, line, what,
               reason);
  std::abort();
}

inline void checkCuda(cudaError_t err, const char *what, const char *file,
                      int line) {
  if (err != cudaSuccess)
    fail(file, line, what, cudaGetErrorString(err));
}
} // namespace detail

/// Aborts with the call, file, line and CUDA's reason when `expr` (a
/// cudaError_t) is not cudaSuccess.
#define FASTLLM_CUDA_CHECK(expr)                                               \
  ::fastllm::rt::cuda::detail::checkCuda((expr), #expr, __FILE__, __LINE__)

/// The stream every kernel of this library is enqueued on: one per process,
/// the legacy default stream (0) until setStream changes it.
cudaStream_t stream();
void setStream(cudaStream_t s);

/// The largest rank the strided kernels accept.
using ::fastllm::rt::kMaxRank;

namespace detail {
/// Aborts with `what` unless 0 <= rank <= kMaxRank: the kernels' parameters
/// hold shapes in fixed arrays of kMaxRank, so a larger rank is refused in
/// every build (not only where asserts are compiled in).
inline void checkRank(int rank, const char *what) {
  if (rank >= 0 && rank <= kMaxRank)
    return;
  char reason[80];
  std::snprintf(reason, sizeof(reason), "rank %d is outside 0..%d", rank,
                kMaxRank);
  fail(__FILE__, __LINE__, what, reason);
}
} // namespace detail

//===----------------------------------------------------------------------===//
// Scalar math for elementwise functors
//===----------------------------------------------------------------------===//
//
// runtime/KernelMath.h's, shared with the CPU library and written for host
// and device: the GPU computes what the CPU does, up to the contraction of
// a·b + c into one fused multiply-add.

using ::fastllm::rt::fastErf;
using ::fastllm::rt::fastExp;
using ::fastllm::rt::fastTanh;
using ::fastllm::rt::gelu;
using ::fastllm::rt::geluGrad;
using ::fastllm::rt::sigmoid;
using ::fastllm::rt::silu;

//===----------------------------------------------------------------------===//
// Element types
//===----------------------------------------------------------------------===//

namespace detail {

/// The type a kernel computes in for elements of type T: float for
/// __nv_bfloat16, T itself for the rest.
template <typename T> struct ComputeTypeOf { using type = T; };
template <> struct ComputeTypeOf<__nv_bfloat16> { using type = float; };
template <typename T> using ComputeType = typename ComputeTypeOf<T>::type;

/// x converted to the type it is computed in; a no-op but for bf16.
template <typename T> __host__ __device__ ComputeType<T> widen(T x) {
  return static_cast<ComputeType<T>>(x);
}

/// T, in a parameter that takes no part in deducing T (std::type_identity_t
/// of C++20): a `nullptr` or a float literal there converts to the T the
/// other arguments give.
template <typename T> struct TypeIdentity { using type = T; };
template <typename T> using NoDeduce = typename TypeIdentity<T>::type;

} // namespace detail

//===----------------------------------------------------------------------===//
// Launch shapes and kernel parameters (pure host logic, tested on the host)
//===----------------------------------------------------------------------===//

namespace detail {

/// Threads per block of the kernels that give each thread elements.
inline constexpr int kBlockThreads = 256;

/// Threads per block of the kernels that give each block a row.
inline constexpr int kRowThreads = 256;

/// The most blocks of a grid-stride launch: plenty to fill any GPU, and
/// within every limit of gridDim.x.
inline constexpr int64_t kMaxGridBlocks = 65536;

struct LaunchConfig {
  unsigned blocks;
  unsigned threads;
};

/// A grid-stride launch over `n` > 0 items, one per thread.
inline LaunchConfig gridFor(int64_t n, int threads = kBlockThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  return {static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxGridBlocks)),
          static_cast<unsigned>(threads)};
}

/// A grid-stride launch over `rows` > 0 rows, one per block.
inline LaunchConfig rowsFor(int64_t rows, int threads = kRowThreads) {
  return {static_cast<unsigned>(std::clamp<int64_t>(rows, 1, kMaxGridBlocks)),
          static_cast<unsigned>(threads)};
}

/// The offset, in one strided operand, of each flat row-major index over
/// `shape`: host shape arrays packed into a kernel parameter.
struct StridedIndex {
  int rank;
  int64_t shape[kMaxRank];
  int64_t strides[kMaxRank];

  /// `flat` must be below the product of the shape.
  __host__ __device__ int64_t offset(int64_t flat) const {
    int64_t off = 0;
    for (int d = rank - 1; d > 0; --d) {
      off += flat % shape[d] * strides[d];
      flat /= shape[d];
    }
    return rank > 0 ? off + flat * strides[0] : 0;
  }
};

using ::fastllm::rt::detail::collapseDims;

/// The iteration of elementwise over N inputs, collapsed: a contiguous output
/// of `total` elements with the collapsed `shape`, and each input's strides
/// along it.
template <int N> struct ElementwiseLayout {
  int rank;
  int64_t total;
  int64_t shape[kMaxRank];
  int64_t strides[N > 0 ? N : 1][kMaxRank];
};

template <int N>
ElementwiseLayout<N> makeElementwiseLayout(int rank, const int64_t *shape,
                                           const int64_t *const *strides) {
  checkRank(rank, "elementwise");
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

/// How matmul runs as strided-batched GEMMs: `calls` calls of `count`
/// products each. Product p of call c multiplies A at aFirst.offset(c) +
/// p·aStride by B at bFirst.offset(c) + p·bStride; its C is the next
/// contiguous [m, n] block. The batch dims are collapsed first, and a stack
/// of A matrices times one shared B becomes one product with a taller m.
struct MatmulPlan {
  int64_t m;
  int64_t count;
  int64_t aStride, bStride;
  int64_t calls;
  StridedIndex aFirst, bFirst;
};

/// One operand of a cuBLASLt GEMM as it lies in memory: a column-major
/// rows x cols matrix with leading dimension ld, the next matrix of the
/// batch `stride` elements further (0: the same one), read transposed or not.
struct LtOperand {
  int64_t rows, cols, ld, stride;
  bool trans;
};

/// The strided-batched GEMM a MatmulPlan call is in cuBLASLt's column-major
/// terms. A row-major [r, c] matrix read column-major is its [c, r]
/// transpose, so the row-major C = op(A)·op(B) is computed as the
/// column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's first operand is matmul's B
/// and its second matmul's A, each with its own transpose flag; the product
/// D (= Cᵀ) is rows x cols = n x plan.m, leading dimension n, `count` of them
/// each rows·cols elements after the last.
struct LtGemm {
  LtOperand first, second;
  int64_t rows, cols, depth;
  int64_t count;
};

/// The cuBLASLt GEMM of each call of `plan` (which only shifts the base
/// pointers between calls).
LtGemm planLtGemm(const MatmulPlan &plan, int64_t n, int64_t k, bool transA,
                  bool transB);

/// The CUDA data type of matmul's A, B and C for element type T. Both
/// multiply with fp32 accumulation (CUBLAS_COMPUTE_32F).
template <typename T> constexpr cudaDataType_t gemmDataType() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16>,
                "matmul multiplies float or __nv_bfloat16 matrices");
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

/// Plans matmul's batch; the batch, m, n and k are not empty.
MatmulPlan planMatmul(int batchRank, const int64_t *batchShape,
                      const int64_t *aBatchStrides,
                      const int64_t *bBatchStrides, int64_t m, int64_t k,
                      bool transA);

/// How transpose moves its elements, after collapsing the output's dims.
/// When the input's contiguous dim stays last, rows move whole (an
/// elementwise copy over dims/inStrides). Otherwise it is copied in square
/// tiles that span the input's contiguous dim q and the output's last dim,
/// one tile per block, once per index of the other (`outer`) dims.
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

/// Side of transpose's tiles: one warp per tile row.
inline constexpr int kTransposeTile = 32;

TransposePlan planTranspose(int rank, const int64_t *inShape,
                            const int64_t *perm);

/// How reduce walks its input: output o starts at kept.offset(o) and reduces
/// the elements at red.offset(r) from there, r < redCount. `innerReduced`
/// when the input's contiguous dim is among the reduced ones.
struct ReducePlan {
  int64_t keptCount, redCount;
  bool innerReduced;
  StridedIndex kept, red;
};

/// Plans reduce over the dims flagged in `reducedDims` (no dim empty).
ReducePlan planReduce(int rank, const int64_t *shape, const bool *reducedDims);

/// gatherGrad gives each thread one column of one outer slice and one band
/// of the table's rows (rows ≡ band mod bands): the number of bands that
/// makes enough threads, from the shapes alone.
int64_t gatherGradBands(int64_t outer, int64_t dimSize, int64_t inner);

/// The kernels of causalAttention and causalAttentionGrad.
/// The scalar kernels (any head dims, fp32 or bf16) and the tensor-core ones
/// (bf16, head dims multiples of 16; Tc*).
enum class AttentionKernel {
  Forward,
  QueryGrad,
  KeyValueGrad,
  TcForward,
  TcQueryGrad,
  TcKeyValueGrad
};

/// The dynamic shared memory `kernel` needs for head dims d and dv.
size_t attentionSharedBytes(AttentionKernel kernel, int64_t d, int64_t dv);

/// Whether head dims d and dv suit the tensor-core kernels (multiples of
/// 16); bf16 attention uses them then, when the pointers are 16-byte
/// aligned and the GPU has the shared memory they need.
bool tensorCoreAttentionShape(int64_t d, int64_t dv);

//===----------------------------------------------------------------------===//
// Device-side helpers of the templates below
//===----------------------------------------------------------------------===//

__device__ inline int64_t globalThread() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ inline int64_t gridThreads() {
  return int64_t(gridDim.x) * blockDim.x;
}

/// f(ins[0][offsets[0]], ins[1][offsets[1]], ...).
template <typename F, size_t... I, typename... T>
__device__ auto callAt(F &f, const int64_t *offsets, std::index_sequence<I...>,
                       const T *...ins) {
  return f(ins[offsets[I]]...);
}

/// out[i] = f(in0[offset0(i)], in1[offset1(i)], ...) for every flat output
/// index i, one per thread (grid-stride). The offsets come from the
/// collapsed multi-index; the outermost dim needs no division.
template <typename Out, typename F, int N, typename... T>
__global__ void elementwiseKernel(Out *out, F f, ElementwiseLayout<N> layout,
                                  const T *...ins) {
  for (int64_t i = globalThread(); i < layout.total; i += gridThreads()) {
    int64_t offsets[N > 0 ? N : 1] = {};
    int64_t rest = i;
    for (int d = layout.rank - 1; d > 0; --d) {
      int64_t index = rest % layout.shape[d];
      rest /= layout.shape[d];
      for (int k = 0; k < N; ++k)
        offsets[k] += index * layout.strides[k][d];
    }
    if (layout.rank > 0)
      for (int k = 0; k < N; ++k)
        offsets[k] += rest * layout.strides[k][0];
    out[i] = static_cast<Out>(
        callAt(f, offsets, std::index_sequence_for<T...>{}, ins...));
  }
}

/// One thread per group of four elements of one sample: see dropout.
template <typename T>
__global__ void dropoutKernel(T *out, const T *in, bool splatInput,
                              int64_t perSample, int64_t groups,
                              int64_t totalGroups, uint32_t site,
                              uint32_t threshold, float scale, uint64_t seed,
                              int64_t step, int64_t firstSample) {
  for (int64_t g = globalThread(); g < totalGroups; g += gridThreads()) {
    const int64_t sample = g / groups, group = g % groups;
    const Philox4x32 words =
        dropoutWords(seed, step, firstSample + sample, site, group);
    const int64_t base = sample * perSample + group * 4;
    const int64_t count = perSample - group * 4 < 4 ? perSample - group * 4 : 4;
    for (int k = 0; k < 4; ++k)
      if (k < count) {
        ComputeType<T> x = widen(in[splatInput ? 0 : base + k]);
        out[base + k] = static_cast<T>(
            words.v[k] >= threshold ? x * scale : ComputeType<T>(0));
      }
  }
}

template <typename T> __global__ void fillKernel(T *out, int64_t n, T value) {
  for (int64_t i = globalThread(); i < n; i += gridThreads())
    out[i] = value;
}

/// acc[i] += x[i], see addInto.
template <typename T, typename U>
__global__ void addIntoKernel(T *acc, const U *x, int64_t n) {
  using Sum = std::common_type_t<ComputeType<T>, ComputeType<U>>;
  for (int64_t i = globalThread(); i < n; i += gridThreads())
    acc[i] = static_cast<T>(static_cast<Sum>(widen(acc[i])) +
                            static_cast<Sum>(widen(x[i])));
}

} // namespace detail

//===----------------------------------------------------------------------===//
// Elementwise with broadcasting
//===----------------------------------------------------------------------===//

/// One input of elementwise: `data` on the device; `strides` (host, in
/// elements) step through the input for each dim of the output, 0 broadcasts
/// the input along that dim.
template <typename T> struct In {
  const T *data;
  const int64_t *strides;
};

/// out[i] = f(in0[i·s0], in1[i·s1], ...) over the output's multi-index i,
/// for every unary/binary/select/compare/cast op and fused chains of them.
/// `out` is contiguous with `shape`; rank may be 0 (a scalar). `out` may be
/// one of the inputs when that input is contiguous with the output's shape.
/// `f` is a `__host__ __device__` (or `__device__`) functor, copied to the
/// device, called once per element by one thread each.
///
/// Launch: one thread per output element, grid-stride, over the dims
/// collapsed as on the CPU.
template <typename Out, typename F, typename... T>
void elementwise(Out *out, int rank, const int64_t *shape, F f, In<T>... ins) {
  constexpr int kNumIn = sizeof...(T);
  const int64_t *strides[kNumIn > 0 ? kNumIn : 1] = {ins.strides...};
  auto layout = detail::makeElementwiseLayout<kNumIn>(rank, shape, strides);
  if (layout.total == 0)
    return;
  detail::LaunchConfig launch = detail::gridFor(layout.total);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                 detail::elementwiseKernel<Out, F, kNumIn, T...>)(
      out, f, layout, ins.data...);
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

/// Batched C = op(A) @ op(B), with C contiguous [batch..., m, n]. For each
/// batch multi-index idx (row-major over batchShape) the matrix of A starts at
/// a + Σ idx·aBatchStrides and is [m, k] ([k, m] when transA), row-major;
/// likewise B is [k, n] ([n, k] when transB). A zero batch stride broadcasts.
///
/// cuBLASLt on one process-wide handle, enqueued on stream(): one
/// strided-batched GEMM per index of the batch dims that do not collapse
/// into one (usually a single call). T is float or __nv_bfloat16, and both
/// accumulate in fp32 (CUBLAS_COMPUTE_32F): float products are full fp32
/// (never TF32); bf16 products run on tensor cores, and C is rounded to bf16
/// once.
template <typename T>
void matmul(T *c, const T *a, const T *b, int batchRank,
            const int64_t *batchShape, const int64_t *aBatchStrides,
            const int64_t *bBatchStrides, int64_t m, int64_t n, int64_t k,
            bool transA, bool transB);

/// acc += op(A) @ op(B) with matmul's arguments, acc fp32 (a gradient
/// buffer): the GEMM adds its fp32 product into acc (beta = 1), never
/// rounding it to T.
template <typename T>
void addMatmul(float *acc, const T *a, const T *b, int batchRank,
               const int64_t *batchShape, const int64_t *aBatchStrides,
               const int64_t *bBatchStrides, int64_t m, int64_t n, int64_t k,
               bool transA, bool transB);

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//
//
// Defined for T in float, double, __nv_bfloat16, bool, int8_t, uint8_t,
// int16_t, uint16_t, int32_t and int64_t; Idx in int32_t and int64_t.

/// out dim i = in dim perm[i]. Moving the last dim copies 32 x 32 tiles
/// through shared memory, so that reads and writes are both coalesced.
template <typename T>
void transpose(T *out, const T *in, int rank, const int64_t *inShape,
               const int64_t *perm);

/// out[i] = in[start + i·stride] per dim; `start` holds in-range first
/// indices and `stride` may be negative.
template <typename T>
void slice(T *out, const T *in, int rank, const int64_t *inShape,
           const int64_t *start, const int64_t *stride,
           const int64_t *outShape);

/// The gradient of slice: zeroes din ([inShape]) and writes dout at the slice.
template <typename T>
void sliceGrad(T *din, const T *dout, int rank, const int64_t *inShape,
               const int64_t *start, const int64_t *stride,
               const int64_t *outShape);

/// Concatenates along the middle dim: input i is [outer, sizes[i], inner],
/// out is [outer, Σ sizes, inner]. `ins` is a host array of device pointers.
template <typename T>
void concat(T *out, int numInputs, const T *const *ins, const int64_t *sizes,
            int64_t outer, int64_t inner);

/// out[o][j][i] = in[o][idx[j]][i] with in [outer, dimSize, inner]; a
/// negative index counts from the end.
template <typename T, typename Idx>
void gather(T *out, const T *in, const Idx *idx, int64_t outer, int64_t dimSize,
            int64_t numIdx, int64_t inner);

/// The gradient of gather: din = 0, then din[o][idx[j]][i] += dout[o][j][i],
/// adding repeated indices in order of j (no atomics: each element of din is
/// owned by one thread). T is float, double or __nv_bfloat16; bf16 sums in
/// float (a float temporary of din's size) and rounds each element once.
template <typename T, typename Idx>
void gatherGrad(T *din, const T *dout, const Idx *idx, int64_t outer,
                int64_t dimSize, int64_t numIdx, int64_t inner);

/// out[i] = value; `value` converts to T (`fill(bf16Buffer, n, 0.0f)`).
template <typename T> void fill(T *out, int64_t n, detail::NoDeduce<T> value) {
  if (n <= 0)
    return;
  detail::LaunchConfig launch = detail::gridFor(n);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                 detail::fillKernel<T>)(out, n, value);
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}

/// out[i] = keep ? in[i] * scale : 0, the mask keyed by (seed, step,
/// firstSample + i / perSample, site, i % perSample) as on the CPU
/// (runtime/Philox.h), so both targets draw the same masks. T is float,
/// double or __nv_bfloat16 (computed in float, rounded once).
template <typename T>
void dropout(T *out, const T *in, bool splatInput, int64_t n,
             int64_t perSample, uint32_t site, uint32_t threshold, float scale,
             uint64_t seed, int64_t step, int64_t firstSample) {
  if (n <= 0 || perSample <= 0)
    return;
  const int64_t groups = (perSample + 3) / 4, total = n / perSample * groups;
  detail::LaunchConfig launch = detail::gridFor(total);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                 detail::dropoutKernel<T>)(
      out, in, splatInput, perSample, groups, total, site, threshold, scale,
      seed, step, firstSample);
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}

/// A copy of n elements between any two device-accessible buffers.
template <typename T> void copy(T *out, const T *in, int64_t n) {
  if (n <= 0)
    return;
  FASTLLM_CUDA_CHECK(cudaMemcpyAsync(out, in, size_t(n) * sizeof(T),
                                     cudaMemcpyDefault, stream()));
}

/// acc += x; accumulates parameter gradients. x may have another element
/// type than acc (a bf16 gradient into a float one): the sum is taken in the
/// wider of their compute types (float for bf16) and rounded once to acc's.
template <typename T, typename U> void addInto(T *acc, const U *x, int64_t n) {
  if (n <= 0)
    return;
  detail::LaunchConfig launch = detail::gridFor(n);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                 detail::addIntoKernel<T, U>)(acc, x, n);
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}

//===----------------------------------------------------------------------===//
// Reductions, softmax, normalisation
//===----------------------------------------------------------------------===//
//
// A kernel that reduces a row gives the row to one block, which combines its
// threads' partial results with warp shuffles in a fixed order. Softmax and
// the norms take T = float or __nv_bfloat16 for every tensor.

enum class ReduceKind { Sum, Mean, Max };

/// Reduces the dims flagged in `reducedDims`; out holds the kept dims in
/// order (keepdims or not, the memory is the same). Floats accumulate sums
/// in double, integers in int64_t; Max propagates NaN. Reducing an empty dim
/// gives 0 (Sum), NaN (Mean) or the lowest value (Max). T is float, double,
/// __nv_bfloat16, int32_t or int64_t.
///
/// Launch: a block per output when the contiguous dim is reduced; else a
/// block per 32 consecutive outputs, 16 threads summing each.
template <typename T>
void reduce(T *out, const T *in, int rank, const int64_t *shape,
            const bool *reducedDims, ReduceKind kind);

/// Softmax (or log-softmax) of x viewed as [outer, n, inner] along n. Entries
/// of -inf get probability 0; a slice that is all -inf gives NaN, as in
/// PyTorch. Launch: a block per row when inner is 1, else a thread per
/// column (o, i) walking n.
template <typename T>
void softmax(T *y, const T *x, int64_t outer, int64_t n, int64_t inner,
             bool log);

/// Given y = softmax(x) (or log_softmax(x)) and dy, dx = y·(dy - Σ dy·y)
/// (or dy - e^y·Σ dy), the sums in double. Launch as softmax.
template <typename T>
void softmaxGrad(T *dx, const T *y, const T *dy, int64_t outer, int64_t n,
                 int64_t inner, bool log);

/// y = (x - mean)/√(var + eps)·scale + bias over rows of `cols`, with the
/// biased variance as in PyTorch; bias may be null. Launch: a block per row;
/// Σx and Σx² in double.
template <typename T>
void layerNorm(T *y, const T *x, const T *scale,
               const detail::NoDeduce<T> *bias, int64_t rows, int64_t cols,
               float eps);

/// The gradient of layerNorm; mean and variance are recomputed from x.
/// dscale and dbias (nullable) are overwritten with sums over rows. Launch: a
/// block per row for dx (saving each row's mean and 1/std), then a block per
/// 32 columns for dscale and dbias, summing in double in a fixed order.
template <typename T>
void layerNormGrad(T *dx, detail::NoDeduce<T> *dscale,
                   detail::NoDeduce<T> *dbias, const T *x, const T *scale,
                   const T *dy, int64_t rows, int64_t cols, float eps);

/// y = x/√(mean(x²) + eps)·scale over rows of `cols`. Launch: a block per row.
template <typename T>
void rmsNorm(T *y, const T *x, const T *scale, int64_t rows, int64_t cols,
             float eps);

/// The gradient of rmsNorm; dscale (nullable) is overwritten with its sum
/// over rows. Launch as layerNormGrad.
template <typename T>
void rmsNormGrad(T *dx, detail::NoDeduce<T> *dscale, const T *x, const T *scale,
                 const T *dy, int64_t rows, int64_t cols, float eps);

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//
//
// Fused causal self-attention, flash-attention style in fp32 (q, k, v, out
// and their gradients in T = float or __nv_bfloat16, staged as floats in
// shared memory; lse in float): the same values as the unfused chain
//   scores = (q @ kᵀ)·scale; scores.masked_fill(j > i, -inf);
//   p = softmax(scores, -1); out = p @ v
// and its autograd gradients, computed tile by tile (32 queries x 32 keys)
// in shared memory; the t x t scores never exist in memory, and tiles above
// the diagonal are never visited. Head dims are runtime values; the kernels
// abort with a message when d and dv need more shared memory than the GPU
// has: the backward takes d + dv up to about 600 on an H100, 420 on an A100.

/// Causal attention over `batch` independent (batch x heads) problems:
/// O = softmax(scale * Q K^T, masked so that query i sees keys j <= i) V,
/// with q, k: [batch, t, d], v: [batch, t, dv], out: [batch, t, dv], and
/// lse: [batch, t] = the log-sum-exp of each masked, scaled score row (saved
/// for the backward). Launch: a block of 8 warps per 32 query rows, each
/// warp keeping a running max and sum (online softmax) for 4 rows while it
/// walks the key tiles up to the diagonal. bf16 with head dims multiples of
/// 16 (tensorCoreAttentionShape) runs on tensor cores instead: 4 warps per
/// 64 query rows, Q·Kᵀ and P·V as WMMA products with P rounded to bf16.
template <typename T>
void causalAttention(T *out, float *lse, const T *q, const T *k, const T *v,
                     int64_t batch, int64_t t, int64_t d, int64_t dv,
                     float scale);

/// Gradients of causalAttention: dQ, dK: [batch, t, d], dV: [batch, t, dv]
/// (overwritten), from q, k, v, the forward's out and lse, and dout. With
/// D_i = Σ dout_i·out_i and P recomputed from q, k and lse: dV = Pᵀ dout,
/// dS = P∘(dout vᵀ - D), dQ = scale·dS k, dK = scale·dSᵀ q. Launch: one
/// kernel with a block per 32 key rows (dK, dV) walking the query tiles from
/// the diagonal down, then one with a block per 32 query rows (dQ) walking
/// the key tiles up to the diagonal; no atomics. The tensor-core version
/// (as for the forward) has the same two kernels over 64-row tiles, its
/// products on WMMA with P and dS rounded to bf16.
template <typename T>
void causalAttentionGrad(T *dQ, T *dK, T *dV, const T *q, const T *k,
                         const T *v, const T *out, const float *lse,
                         const T *dout, int64_t batch, int64_t t, int64_t d,
                         int64_t dv, float scale);

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//
//
// The class dim is last: inputs are [rows, classes], targets [rows]. A target
// equal to ignoreIndex (when hasIgnore) contributes no loss and no gradient,
// and Mean divides by the number of other targets, as
// F.cross_entropy(ignore_index=...) does (NaN when there are none). Loss sums
// accumulate in double. Idx is int32_t or int64_t, and comes first so that
// generated code names it alone (`crossEntropy<int64_t>(...)`); T, the type
// of the logits or log-probabilities and of their gradient, is float or
// __nv_bfloat16 and is deduced. `loss` and `dloss` are float device pointers
// for either T.

enum class Reduction { None, Sum, Mean };

/// loss is a scalar for Sum and Mean, [rows] for None. Launch: a block per
/// row, then (Sum, Mean) one block summing the rows' losses.
template <typename Idx, typename T>
void crossEntropy(float *loss, const T *logits, const Idx *targets,
                  int64_t rows, int64_t classes, bool hasIgnore,
                  int64_t ignoreIndex, Reduction r);

/// dloss is a scalar for Sum and Mean, [rows] for None. Launch: (Mean) one
/// block counting the targets, then a block per row.
template <typename Idx, typename T>
void crossEntropyGrad(T *dlogits, const T *logits, const Idx *targets,
                      const float *dloss, int64_t rows, int64_t classes,
                      bool hasIgnore, int64_t ignoreIndex, Reduction r);

/// Negative log-likelihood of log-probabilities `input`. Launch: a thread
/// per row (None), or one block summing the rows (Sum, Mean).
template <typename Idx, typename T>
void nllLoss(float *loss, const T *input, const Idx *targets, int64_t rows,
             int64_t classes, bool hasIgnore, int64_t ignoreIndex, Reduction r);

/// Launch: (Mean) one block counting the targets, then a thread per element.
template <typename Idx, typename T>
void nllLossGrad(T *dinput, const Idx *targets, const float *dloss,
                 int64_t rows, int64_t classes, bool hasIgnore,
                 int64_t ignoreIndex, Reduction r);

} // namespace fastllm::rt::cuda

#endif // FASTLLM_RUNTIME_CUDA_KERNELS_CUH
