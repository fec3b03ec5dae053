//===- Kernels.h - CPU kernels for generated training code ------*- C++ -*-===//
//
// The kernel library behind the CPU target: `fastllm-opt` emits one C++ call
// per op (or per fused chain of elementwise ops) with shapes known at compile
// time. Every buffer is row-major, contiguous and preallocated by the caller;
// an output never aliases an input unless a kernel says so.
//
// Threading is OpenMP only. OpenBLAS is kept single-threaded and matmul splits
// its work over the OpenMP team itself, so that two thread pools never spin
// against each other on a small machine. Every kernel computes each output
// element in an order fixed by the shapes alone, so results do not depend on
// the number of threads.
//
// Templates that take a caller's lambda (elementwise) or are trivial live
// here; the rest are defined in Kernels.cpp and explicitly instantiated for
// the element types listed beside each declaration.
//
// Generated code should be compiled like this library (-O2 or better,
// -fopenmp, -march=native -mprefer-vector-width=512): the fused elementwise
// loops are instantiated in its own translation unit and vectorize only as
// wide as its flags allow.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CPU_KERNELS_H
#define FASTLLM_RUNTIME_CPU_KERNELS_H

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "runtime/KernelMath.h"
#include "runtime/Philox.h"

namespace fastllm::rt::cpu {

//===----------------------------------------------------------------------===//
// Threading
//===----------------------------------------------------------------------===//

/// Below this many elements a kernel stays on the calling thread: waking the
/// OpenMP team costs microseconds, more than splitting such work saves.
inline constexpr int64_t kParallelGrain = 32768;

/// The largest rank the strided kernels accept.
using ::fastllm::rt::kMaxRank;

/// The number of threads worth using for a kernel touching `work` elements.
inline int numThreadsFor(int64_t work) {
#ifdef _OPENMP
  if (work < kParallelGrain || omp_in_parallel())
    return 1;
  return omp_get_max_threads();
#else
  (void)work;
  return 1;
#endif
}

/// Calls body(chunk) once for every chunk in [0, numChunks), spread over
/// `numThreads` OpenMP threads in contiguous static ranges.
template <typename Body>
inline void parallelChunks(int64_t numChunks, int numThreads, Body &&body) {
#ifdef _OPENMP
  if (numThreads > 1 && numChunks > 1) {
#pragma omp parallel for schedule(static) num_threads(numThreads)
    for (int64_t c = 0; c < numChunks; ++c)
      body(c);
    return;
  }
#else
  (void)numThreads;
#endif
  for (int64_t c = 0; c < numChunks; ++c)
    body(c);
}

/// Calls body(begin, end) on [0, n) cut into one contiguous range per thread
/// (a single call when `work` elements are too few to share).
template <typename Body>
inline void parallelFor(int64_t n, int64_t work, Body &&body) {
  if (n <= 0)
    return;
  int64_t threads = std::min<int64_t>(numThreadsFor(work), n);
  if (threads <= 1)
    return body(int64_t(0), n);
  parallelChunks(threads, static_cast<int>(threads), [&](int64_t c) {
    body(n * c / threads, n * (c + 1) / threads);
  });
}

// The scalar math of elementwise lambdas (fastExp, fastTanh, fastErf,
// sigmoid, silu, gelu, geluGrad) is runtime/KernelMath.h's, shared with the
// CUDA library.
using ::fastllm::rt::fastErf;
using ::fastllm::rt::fastExp;
using ::fastllm::rt::fastTanh;
using ::fastllm::rt::gelu;
using ::fastllm::rt::geluGrad;
using ::fastllm::rt::sigmoid;
using ::fastllm::rt::silu;

//===----------------------------------------------------------------------===//
// Elementwise with broadcasting
//===----------------------------------------------------------------------===//

/// One input of elementwise: `strides` (in elements) step through the
/// input for each dim of the output; 0 broadcasts the input along that dim.
template <typename T> struct In {
  const T *data;
  const int64_t *strides;
};

namespace detail {

/// Elements per innermost block in elementwise: small enough that a few
/// block buffers per operand stay in L1.
inline constexpr int64_t kBlock = 512;

using ::fastllm::rt::detail::collapseDims;

/// Presents one input of elementwise as a contiguous array per block, so that
/// the loop calling the lambda is a single unit-stride loop whatever the
/// broadcasting: unit-stride inputs are read in place, a broadcast value is
/// splatted into a buffer once per distinct value, and other strides are
/// gathered into the buffer.
template <typename T> class BlockSource {
public:
  BlockSource(const T *data, int64_t stride) : data(data), stride(stride) {}

  const T *block(int64_t offset, int64_t begin, int64_t len) {
    const T *p = data + offset;
    if (stride == 1)
      return p + begin;
    if (stride == 0) {
      if (p != splatted) {
        std::fill_n(buffer, kBlock, *p);
        splatted = p;
      }
      return buffer;
    }
    for (int64_t i = 0; i < len; ++i)
      buffer[i] = p[(begin + i) * stride];
    return buffer;
  }

private:
  const T *data;
  int64_t stride;
  const T *splatted = nullptr;
  alignas(64) T buffer[kBlock];
};

/// The hot loop: unit stride everywhere, so it vectorizes when `f` does. An
/// output equal to an input (in-place update) is fine; partial overlap is not.
template <typename Out, typename F, typename... T>
inline void applyBlock(Out *out, int64_t len, F &f, const T *...in) {
  for (int64_t i = 0; i < len; ++i)
    out[i] = static_cast<Out>(f(in[i]...));
}

/// Runs the blocks [begin, end) of a collapsed elementwise iteration: blocks
/// are numbered row by row, `blocksPerRow` per innermost row.
template <typename Out, typename F, size_t... I, typename... T>
void elementwiseBlocks(Out *out, F &f, int rank, const int64_t *shape,
                       const int64_t (*strides)[kMaxRank], int64_t blocksPerRow,
                       int64_t begin, int64_t end, std::index_sequence<I...>,
                       In<T>... ins) {
  const int64_t n = shape[rank - 1];
  std::tuple<BlockSource<T>...> sources{
      BlockSource<T>(ins.data, strides[I][rank - 1])...};
  int64_t row = begin / blocksPerRow, blk = begin % blocksPerRow;
  int64_t index[kMaxRank];
  int64_t offset[sizeof...(T) + 1] = {};
  for (int64_t d = rank - 2, rest = row; d >= 0; --d) {
    index[d] = rest % shape[d];
    rest /= shape[d];
    ((offset[I] += index[d] * strides[I][d]), ...);
  }
  for (int64_t u = begin; u < end; ++u) {
    int64_t first = blk * kBlock, len = std::min(kBlock, n - first);
    applyBlock(out + row * n + first, len, f,
               std::get<I>(sources).block(offset[I], first, len)...);
    if (++blk < blocksPerRow)
      continue;
    blk = 0;
    ++row;
    for (int d = rank - 2; d >= 0; --d) {
      ((offset[I] += strides[I][d]), ...);
      if (++index[d] < shape[d])
        break;
      ((offset[I] -= strides[I][d] * shape[d]), ...);
      index[d] = 0;
    }
  }
}

} // namespace detail

/// out[i] = f(in0[i·s0], in1[i·s1], ...) over the output's multi-index i,
/// for every unary/binary/select/compare/cast op and fused chains of them.
/// `out` is contiguous with `shape`; rank may be 0 (a scalar). `out` may be
/// one of the inputs when that input is contiguous with the output's shape.
/// `f` is called from several threads at once, so it must not keep state.
///
/// Dims that every operand walks contiguously (or broadcasts) are merged
/// first. Inputs with unit or zero stride along the merged innermost dim cost
/// nothing extra; any other input is gathered element by element, which is
/// slow for large strides: a genuinely transposed operand is better served
/// by `transpose`, which copies tiles.
template <typename Out, typename F, typename... T>
void elementwise(Out *out, int rank, const int64_t *shape, F f, In<T>... ins) {
  constexpr int kNumIn = sizeof...(T);
  assert(rank >= 0 && rank <= kMaxRank && "rank above kMaxRank");
  int64_t dims[kMaxRank];
  int64_t strides[kNumIn + 1][kMaxRank];
  const int64_t *inStrides[kNumIn + 1] = {ins.strides...};
  int64_t total = 1;
  for (int d = 0; d < rank; ++d) {
    dims[d] = shape[d];
    total *= shape[d];
    for (int k = 0; k < kNumIn; ++k)
      strides[k][d] = inStrides[k][d];
  }
  if (total == 0)
    return;
  int r = detail::collapseDims(rank, dims, kNumIn, strides);
  if (r == 0) {
    out[0] = static_cast<Out>(f(ins.data[0]...));
    return;
  }
  const int64_t blocksPerRow =
      (dims[r - 1] + detail::kBlock - 1) / detail::kBlock;
  const int64_t numBlocks = total / dims[r - 1] * blocksPerRow;
  parallelFor(numBlocks, total, [&](int64_t begin, int64_t end) {
    detail::elementwiseBlocks(out, f, r, dims, strides, blocksPerRow, begin,
                              end, std::index_sequence_for<T...>{}, ins...);
  });
}

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

/// Batched C = op(A) @ op(B), with C contiguous [batch..., m, n]. For each
/// batch multi-index idx (row-major over batchShape) the matrix of A starts at
/// a + Σ idx·aBatchStrides and is [m, k] ([k, m] when transA), row-major;
/// likewise B is [k, n] ([n, k] when transB). A zero batch stride broadcasts.
void matmul(float *c, const float *a, const float *b, int batchRank,
            const int64_t *batchShape, const int64_t *aBatchStrides,
            const int64_t *bBatchStrides, int64_t m, int64_t n, int64_t k,
            bool transA, bool transB);

/// acc += op(A) @ op(B): matmul's product (same arguments) added into acc,
/// a gradient buffer, in one GEMM.
void addMatmul(float *acc, const float *a, const float *b, int batchRank,
               const int64_t *batchShape, const int64_t *aBatchStrides,
               const int64_t *bBatchStrides, int64_t m, int64_t n, int64_t k,
               bool transA, bool transB);

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//
//
// Defined for T in float, double, bool, int8_t, uint8_t, int16_t, uint16_t,
// int32_t and int64_t; Idx in int32_t and int64_t.

/// out dim i = in dim perm[i].
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
/// out is [outer, Σ sizes, inner].
template <typename T>
void concat(T *out, int numInputs, const T *const *ins, const int64_t *sizes,
            int64_t outer, int64_t inner);

/// out[o][j][i] = in[o][idx[j]][i] with in [outer, dimSize, inner]; a
/// negative index counts from the end.
template <typename T, typename Idx>
void gather(T *out, const T *in, const Idx *idx, int64_t outer, int64_t dimSize,
            int64_t numIdx, int64_t inner);

/// The gradient of gather: din = 0, then din[o][idx[j]][i] += dout[o][j][i],
/// adding repeated indices in order of j. T is float or double.
template <typename T, typename Idx>
void gatherGrad(T *din, const T *dout, const Idx *idx, int64_t outer,
                int64_t dimSize, int64_t numIdx, int64_t inner);

template <typename T> void fill(T *out, int64_t n, T value) {
  parallelFor(n, n, [&](int64_t begin, int64_t end) {
    std::fill(out + begin, out + end, value);
  });
}

template <typename T> void copy(T *out, const T *in, int64_t n) {
  parallelFor(n, n, [&](int64_t begin, int64_t end) {
    std::memcpy(out + begin, in + begin, (end - begin) * sizeof(T));
  });
}

/// acc += x; accumulates parameter gradients.
template <typename T> void addInto(T *acc, const T *x, int64_t n) {
  parallelFor(n, n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      acc[i] += x[i];
  });
}

//===----------------------------------------------------------------------===//
// Dropout
//===----------------------------------------------------------------------===//

namespace detail {

/// Philox lanes computed together: philox4x32 (runtime/Philox.h) of kLanes
/// consecutive groups of one sample, written as the 4 * kLanes words of their
/// elements in order. Written lane by lane inside each round so that the
/// loops vectorize (32 x 32 -> 64-bit multiplies); the words are exactly
/// philox4x32's.
inline constexpr int64_t kDropoutLanes = 16;

inline void dropoutWordsBlock(uint32_t *words, uint64_t seed, int64_t step,
                              int64_t sample, uint32_t site,
                              int64_t firstGroup) {
  constexpr int64_t L = kDropoutLanes;
  uint32_t x0[L], x1[L], x2[L], x3[L];
  for (int64_t l = 0; l < L; ++l) {
    x0[l] = uint32_t(firstGroup + l);
    x1[l] = site;
    x2[l] = uint32_t(sample);
    x3[l] = uint32_t(step);
  }
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    for (int64_t l = 0; l < L; ++l) {
      uint64_t p0 = uint64_t(0xD2511F53u) * x0[l];
      uint64_t p1 = uint64_t(0xCD9E8D57u) * x2[l];
      uint32_t n0 = uint32_t(p1 >> 32) ^ x1[l] ^ k0;
      uint32_t n2 = uint32_t(p0 >> 32) ^ x3[l] ^ k1;
      x1[l] = uint32_t(p1);
      x3[l] = uint32_t(p0);
      x0[l] = n0;
      x2[l] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int64_t l = 0; l < L; ++l) {
    words[4 * l] = x0[l];
    words[4 * l + 1] = x1[l];
    words[4 * l + 2] = x2[l];
    words[4 * l + 3] = x3[l];
  }
}

} // namespace detail

/// out[i] = keep ? in[i] * scale : 0 over n elements, viewed as n / perSample
/// samples of perSample elements; row r is global sample firstSample + r.
/// keep is the Philox word of (seed, step, sample, site, index within the
/// sample) >= threshold (runtime/Philox.h's dropoutWords): a pure function of
/// the element's place, so the backward (the same call on the gradient)
/// regenerates the mask. `in` is one element read for all when
/// `splatInput`. Work is split in blocks of 64 elements of one sample (16
/// Philox calls, made together so that they vectorize).
template <typename T>
void dropout(T *out, const T *in, bool splatInput, int64_t n,
             int64_t perSample, uint32_t site, uint32_t threshold, float scale,
             uint64_t seed, int64_t step, int64_t firstSample) {
  if (n <= 0 || perSample <= 0)
    return;
  constexpr int64_t kBlock = 4 * detail::kDropoutLanes;
  const int64_t blocks = (perSample + kBlock - 1) / kBlock;
  parallelFor(n / perSample * blocks, n, [&](int64_t begin, int64_t end) {
    alignas(64) uint32_t words[kBlock];
    for (int64_t b = begin; b < end; ++b) {
      const int64_t sample = b / blocks, block = b % blocks;
      detail::dropoutWordsBlock(words, seed, step, firstSample + sample, site,
                                block * detail::kDropoutLanes);
      const int64_t base = sample * perSample + block * kBlock;
      const int64_t count = std::min(kBlock, perSample - block * kBlock);
      T *o = out + base;
      if (splatInput) {
        const T kept = T(in[0] * scale);
        for (int64_t e = 0; e < count; ++e)
          o[e] = words[e] >= threshold ? kept : T(0);
      } else {
        const T *x = in + base;
        for (int64_t e = 0; e < count; ++e)
          o[e] = words[e] >= threshold ? T(x[e] * scale) : T(0);
      }
    }
  });
}

//===----------------------------------------------------------------------===//
// Reductions, softmax, normalisation
//===----------------------------------------------------------------------===//

enum class ReduceKind { Sum, Mean, Max };

/// Reduces the dims flagged in `reducedDims`; out holds the kept dims in
/// order (keepdims or not, the memory is the same). Floats accumulate sums
/// in double, integers in int64_t; Max propagates NaN. Reducing an empty dim
/// gives 0 (Sum), NaN (Mean) or the lowest value (Max). T is float, double,
/// int32_t or int64_t.
template <typename T>
void reduce(T *out, const T *in, int rank, const int64_t *shape,
            const bool *reducedDims, ReduceKind kind);

/// Softmax (or log-softmax) of x viewed as [outer, n, inner] along n. Entries
/// of -inf get probability 0; a slice that is all -inf gives NaN, as in
/// PyTorch.
void softmax(float *y, const float *x, int64_t outer, int64_t n, int64_t inner,
             bool log);

/// Given y = softmax(x) (or log_softmax(x)) and dy, dx = y·(dy - Σ dy·y)
/// (or dy - e^y·Σ dy).
void softmaxGrad(float *dx, const float *y, const float *dy, int64_t outer,
                 int64_t n, int64_t inner, bool log);

/// y = (x - mean)/√(var + eps)·scale + bias over rows of `cols`, with the
/// biased variance as in PyTorch; bias may be null.
void layerNorm(float *y, const float *x, const float *scale, const float *bias,
               int64_t rows, int64_t cols, float eps);

/// The gradient of layerNorm; mean and variance are recomputed from x.
/// dscale and dbias (nullable) are overwritten with sums over rows.
void layerNormGrad(float *dx, float *dscale, float *dbias, const float *x,
                   const float *scale, const float *dy, int64_t rows,
                   int64_t cols, float eps);

/// y = x/√(mean(x²) + eps)·scale over rows of `cols`.
void rmsNorm(float *y, const float *x, const float *scale, int64_t rows,
             int64_t cols, float eps);

/// The gradient of rmsNorm; dscale is overwritten with its sum over rows.
void rmsNormGrad(float *dx, float *dscale, const float *x, const float *scale,
                 const float *dy, int64_t rows, int64_t cols, float eps);

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//
//
// Fused causal self-attention: the same values as the unfused chain
//   scores = (q @ kᵀ)·scale; scores.masked_fill(j > i, -inf);
//   p = softmax(scores, -1); out = p @ v
// and its autograd gradients, without the [t, t] scores in memory: each
// thread holds the scores of one block of query rows against the keys up to
// the diagonal, and blocks above the diagonal are never computed.

/// Causal attention over `batch` independent (batch x heads) problems:
/// O = softmax(scale * Q K^T, masked so that query i sees keys j <= i) V,
/// with q, k: [batch, t, d], v: [batch, t, dv], out: [batch, t, dv], and
/// lse: [batch, t] = the log-sum-exp of each masked, scaled score row (saved
/// for the backward). Never materialises more than a block of the t x t
/// scores per thread.
void causalAttention(float *out, float *lse, const float *q, const float *k,
                     const float *v, int64_t batch, int64_t t, int64_t d,
                     int64_t dv, float scale);

/// Gradients of causalAttention: dQ, dK: [batch, t, d], dV: [batch, t, dv]
/// (overwritten), from q, k, v, the forward's out and lse, and dout. With
/// D_i = Σ dout_i·out_i and P recomputed from q, k and lse: dV = Pᵀ dout,
/// dS = P∘(dout vᵀ - D), dQ = scale·dS k, dK = scale·dSᵀ q.
void causalAttentionGrad(float *dQ, float *dK, float *dV, const float *q,
                         const float *k, const float *v, const float *out,
                         const float *lse, const float *dout, int64_t batch,
                         int64_t t, int64_t d, int64_t dv, float scale);

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//
//
// The class dim is last: inputs are [rows, classes], targets [rows]. A target
// equal to ignoreIndex (when hasIgnore) contributes no loss and no gradient,
// and Mean divides by the number of other targets, as
// F.cross_entropy(ignore_index=...) does (NaN when there are none). Loss sums
// accumulate in double. Idx is int32_t or int64_t.

enum class Reduction { None, Sum, Mean };

/// loss is a scalar for Sum and Mean, [rows] for None.
template <typename Idx>
void crossEntropy(float *loss, const float *logits, const Idx *targets,
                  int64_t rows, int64_t classes, bool hasIgnore,
                  int64_t ignoreIndex, Reduction r);

/// dloss is a scalar for Sum and Mean, [rows] for None.
template <typename Idx>
void crossEntropyGrad(float *dlogits, const float *logits, const Idx *targets,
                      const float *dloss, int64_t rows, int64_t classes,
                      bool hasIgnore, int64_t ignoreIndex, Reduction r);

/// Negative log-likelihood of log-probabilities `input`.
template <typename Idx>
void nllLoss(float *loss, const float *input, const Idx *targets, int64_t rows,
             int64_t classes, bool hasIgnore, int64_t ignoreIndex, Reduction r);

template <typename Idx>
void nllLossGrad(float *dinput, const Idx *targets, const float *dloss,
                 int64_t rows, int64_t classes, bool hasIgnore,
                 int64_t ignoreIndex, Reduction r);

} // namespace fastllm::rt::cpu

#endif // FASTLLM_RUNTIME_CPU_KERNELS_H
