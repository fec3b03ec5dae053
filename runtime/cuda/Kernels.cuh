//===- Kernels.cuh - CUDA kernels for generated training code ---*- C++ -*-===//
//
// The CUDA library of the kernel contract both targets share: the functions
// of runtime/KernelApi.inc (included below; the CPU library,
// runtime/cpu/Kernels.h, declares the same) in fastllm::rt::cuda, so that
// `fastllm-opt` emits the same call sequence for both targets. What the CUDA
// library adds:
//
//  - Every data pointer is a device pointer (device, managed or __device__
//    memory). Shape, stride, permutation and flag arrays (`const int64_t
//    *shape` and the like) are host arrays, as generated code passes its local
//    arrays: their contents travel to the GPU by value, as kernel parameters.
//  - Every call enqueues its work on stream() and returns without waiting.
//    Results are ready once that stream has been synchronised.
//  - Generated functors are `__host__ __device__`; the scalar math
//    (runtime/KernelMath.h) is too, so the same expressions compile for the
//    CPU and the GPU.
//
// Results agree with the CPU kernels to float rounding: the same algorithms,
// the same shape plans (runtime/KernelPlans.h) and the same exp/tanh/erf
// approximations, with sums accumulated in double wherever the CPU kernels
// use double. Every kernel is deterministic (no floating-point atomics): a
// result depends on the shapes and the GPU only. gatherGrad adds repeated
// indices in index order, exactly as the CPU does.
//
// For mixed-precision steps the floating kernels (matmul, softmax, the
// norms, attention, the losses), reduce, the data movement, dropout, fill,
// copy and addInto also take T = __nv_bfloat16. bf16 is a storage type: a
// kernel loads each bf16 as a float, computes exactly as its float version
// does (in float, or double where that uses double) and rounds once, when it
// stores a T. What a signature spells float (losses, incoming loss gradients,
// attention's lse, eps, scale) stays float for both. Generated code passes
// __nv_bfloat16 pointers where it passes float pointers, with the same call
// text: T is deduced from the pointers. matmul multiplies float products in
// full fp32 (never TF32) and bf16 products on tensor cores, both with fp32
// accumulation, and rounds C to bf16 once.
//
// A few kernels need a small temporary (per-row statistics, per-row losses):
// they take it from the stream-ordered allocator (cudaMallocAsync) and give
// it back on the same stream. No kernel materialises the t x t attention
// scores. Attention's head dims are runtime values; its kernels abort with a
// message when d and dv need more shared memory than the GPU has: the
// backward takes d + dv up to about 600 on an H100, 420 on an A100.
//
// Errors: generated code has no error path, so a failing CUDA or cuBLASLt call
// prints its file, line and reason and aborts the process.
//
// elementwise (which takes a caller's functor), dropout and the trivial
// fill, copy and addInto are defined here; the rest are defined in
// runtime/cuda/kernels/, one source per op family (each kernel's launch shape
// is described there), and explicitly instantiated there for the element
// types runtime/KernelApi.inc lists plus __nv_bfloat16.
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
#include "runtime/KernelPlans.h"
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

/// T, where a parameter takes no part in deducing T (runtime/KernelPlans.h).
using ::fastllm::rt::detail::NoDeduce;

} // namespace detail

//===----------------------------------------------------------------------===//
// Launch shapes (pure host logic, tested on the host)
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

// The shape plans both libraries share (runtime/KernelPlans.h).
using ::fastllm::rt::detail::collapseDims;
using ::fastllm::rt::detail::ElementwiseLayout;
using ::fastllm::rt::detail::makeElementwiseLayout;
using ::fastllm::rt::detail::StridedIndex;

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

/// Each input's offset for flat output index i, from the collapsed
/// multi-index; the outermost dim needs no division.
template <int N>
__device__ void elementOffsets(const ElementwiseLayout<N> &layout, int64_t i,
                               int64_t (&offsets)[N > 0 ? N : 1]) {
  for (int k = 0; k < N; ++k)
    offsets[k] = 0;
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
}

/// out[i] = f(in0[offset0(i)], in1[offset1(i)], ...) for every flat output
/// index i, one per thread (grid-stride), at elementOffsets.
template <typename Out, typename F, int N, typename... T>
__global__ void elementwiseKernel(Out *out, F f, ElementwiseLayout<N> layout,
                                  const T *...ins) {
  for (int64_t i = globalThread(); i < layout.total; i += gridThreads()) {
    int64_t offsets[N > 0 ? N : 1];
    elementOffsets(layout, i, offsets);
    out[i] = static_cast<Out>(
        callAt(f, offsets, std::index_sequence_for<T...>{}, ins...));
  }
}

/// Elements per thread of the vectorised elementwise kernel: 16 bytes of a
/// 2-byte type, 32 of a 4-byte one.
inline constexpr int kElementwiseVector = 8;

/// Copies input `in`'s kElementwiseVector values from `offset` into `raw`:
/// the consecutive ones (16-byte loads), or the one at `offset` repeated
/// (`splat`).
template <typename T>
__device__ void loadVector(unsigned char *raw, const T *in, int64_t offset,
                           bool splat) {
  constexpr int V = kElementwiseVector;
  if (splat) {
    const T x = in[offset];
    for (int e = 0; e < V; ++e)
      reinterpret_cast<T *>(raw)[e] = x;
    return;
  }
  const uint4 *src = reinterpret_cast<const uint4 *>(in + offset);
  for (int b = 0; b < int(V * sizeof(T) / 16); ++b)
    reinterpret_cast<uint4 *>(raw)[b] = src[b];
}

/// f of element e of each input's loaded values.
template <typename F, size_t... I, typename... T>
__device__ auto callVector(F &f, unsigned char (*raw)[kElementwiseVector * 8],
                           int e, std::index_sequence<I...>, const T *...) {
  return f(reinterpret_cast<const T *>(raw[I])[e]...);
}

/// elementwiseKernel kElementwiseVector outputs per thread, for layouts
/// whose innermost dim is a multiple of it and read by every input either
/// as one broadcast value or contiguously (then from a 16-byte aligned
/// pointer with outer strides that are multiples of it), the output
/// aligned too (elementwiseVectorizes): 16-byte loads and stores, one index
/// computation per vector.
template <typename Out, typename F, int N, typename... T>
__global__ void elementwiseVectorKernel(Out *out, F f,
                                        ElementwiseLayout<N> layout,
                                        const T *...ins) {
  constexpr int V = kElementwiseVector;
  for (int64_t vec = globalThread(); vec < layout.total / V;
       vec += gridThreads()) {
    const int64_t i = vec * V;
    int64_t offsets[N > 0 ? N : 1];
    elementOffsets(layout, i, offsets);
    alignas(16) unsigned char raw[N > 0 ? N : 1][V * 8];
    int k = 0;
    ((loadVector(raw[k], ins, offsets[k],
                 layout.strides[k][layout.rank - 1] == 0),
      ++k),
     ...);
    alignas(16) Out values[V];
    for (int e = 0; e < V; ++e)
      values[e] = static_cast<Out>(
          callVector(f, raw, e, std::index_sequence_for<T...>{}, ins...));
    for (int b = 0; b < int(V * sizeof(Out) / 16); ++b)
      reinterpret_cast<uint4 *>(out + i)[b] =
          reinterpret_cast<const uint4 *>(values)[b];
  }
}

/// Whether elementwiseVectorKernel serves this layout (see there).
template <typename Out, int N, typename... T>
bool elementwiseVectorizes(const Out *out, const ElementwiseLayout<N> &layout,
                           const T *...ins) {
  constexpr int V = kElementwiseVector;
  if (sizeof(Out) < 2 || ((sizeof(T) < 2 || sizeof(T) > 8) || ...) ||
      layout.rank < 1 || layout.shape[layout.rank - 1] % V != 0 ||
      reinterpret_cast<uintptr_t>(out) % 16 != 0)
    return false;
  const uintptr_t addresses[N > 0 ? N : 1] = {
      reinterpret_cast<uintptr_t>(ins)...};
  for (int k = 0; k < N; ++k) {
    const int64_t inner = layout.strides[k][layout.rank - 1];
    if (inner == 0)
      continue; // one value per vector: any stride, any alignment
    if (inner != 1 || addresses[k] % 16 != 0)
      return false;
    for (int d = 0; d + 1 < layout.rank; ++d)
      if (layout.strides[k][d] % V != 0)
        return false;
  }
  return true;
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

// In, ReduceKind, Reduction and every kernel's declaration.
#include "runtime/KernelApi.inc"

//===----------------------------------------------------------------------===//
// Elementwise with broadcasting
//===----------------------------------------------------------------------===//

/// runtime/KernelApi.inc's elementwise on the GPU: `f` is a `__host__
/// __device__` (or `__device__`) functor, copied to the device, called once
/// per element. Launch: one thread per output element, grid-stride, over
/// the dims collapsed as on the CPU; or, where the layout allows
/// (elementwiseVectorizes), one per kElementwiseVector elements.
template <typename Out, typename F, typename... T>
void elementwise(Out *out, int rank, const int64_t *shape, F f, In<T>... ins) {
  constexpr int kNumIn = sizeof...(T);
  detail::checkRank(rank, "elementwise");
  const int64_t *strides[kNumIn > 0 ? kNumIn : 1] = {ins.strides...};
  auto layout = detail::makeElementwiseLayout<kNumIn>(rank, shape, strides);
  if (layout.total == 0)
    return;
  if (detail::elementwiseVectorizes(out, layout, ins.data...)) {
    detail::LaunchConfig launch =
        detail::gridFor(layout.total / detail::kElementwiseVector);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   detail::elementwiseVectorKernel<Out, F, kNumIn, T...>)
    (out, f, layout, ins.data...);
  } else {
    detail::LaunchConfig launch = detail::gridFor(layout.total);
    FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                   detail::elementwiseKernel<Out, F, kNumIn, T...>)
    (out, f, layout, ins.data...);
  }
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}

//===----------------------------------------------------------------------===//
// Fill, dropout, copy, addInto
//===----------------------------------------------------------------------===//

/// out[i] = value; `value` converts to T (`fill(bf16Buffer, n, 0.0f)`).
template <typename T> void fill(T *out, int64_t n, detail::NoDeduce<T> value) {
  if (n <= 0)
    return;
  detail::LaunchConfig launch = detail::gridFor(n);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                 detail::fillKernel<T>)
  (out, n, value);
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}

/// runtime/KernelApi.inc's dropout on the GPU: one thread per group of four
/// elements of one sample (one Philox call). T is float, double or
/// __nv_bfloat16 (computed in float, rounded once).
template <typename T>
void dropout(T *out, const T *in, bool splatInput, int64_t n, int64_t perSample,
             uint32_t site, uint32_t threshold, float scale, uint64_t seed,
             int64_t step, int64_t firstSample) {
  if (n <= 0 || perSample <= 0)
    return;
  const int64_t groups = (perSample + 3) / 4, total = n / perSample * groups;
  detail::LaunchConfig launch = detail::gridFor(total);
  FASTLLM_LAUNCH(launch.blocks, launch.threads, 0, stream(),
                 detail::dropoutKernel<T>)
  (out, in, splatInput, perSample, groups, total, site, threshold, scale, seed,
   step, firstSample);
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
                 detail::addIntoKernel<T, U>)
  (acc, x, n);
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}

} // namespace fastllm::rt::cuda

#endif // FASTLLM_RUNTIME_CUDA_KERNELS_CUH
