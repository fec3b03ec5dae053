//===- Kernels.h - CPU kernels for generated training code ------*- C++ -*-===//
//
// The kernel library behind the CPU target: `fastllm-opt` emits one C++ call
// per op (or per fused chain of elementwise ops) with shapes known at compile
// time. Its API is the kernel contract both targets share, declared once in
// runtime/KernelApi.inc (included below), with the scalar math of
// runtime/KernelMath.h and the shape rules of runtime/KernelPlans.h. Every
// pointer is a host pointer.
//
// Threading is OpenMP only. OpenBLAS is kept single-threaded and matmul splits
// its work over the OpenMP team itself, so that two thread pools never spin
// against each other on a small machine. Every kernel computes each output
// element in an order fixed by the shapes alone, so results do not depend on
// the number of threads.
//
// elementwise (which takes a caller's lambda), dropout, and the trivial
// fill, copy and addInto are defined here (their float instances are
// compiled once in the library, kernels/Elementwise.cpp, and extern here);
// the rest are defined in runtime/cpu/kernels/, one source per op family, and
// explicitly instantiated there for the element types runtime/KernelApi.inc
// lists (the floating kernels for float only).
//
// Generated code's functors should be compiled like this library (-O2 or
// better, -fopenmp, and the library's -march: `compile --target-cpu` picks
// the portable build or the native one): each functor's loop (applyBlock) is
// instantiated in its own translation unit and vectorizes only as wide as
// its flags allow.
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
#include "runtime/KernelPlans.h"
#include "runtime/Philox.h"

namespace fastllm::rt::cpu {

//===----------------------------------------------------------------------===//
// The CPU this library was built for
//===----------------------------------------------------------------------===//

/// The CPU level this library's code was compiled for: "portable" or
/// "native" (`compile --target-cpu`), with its -march in parentheses.
const char *kernelCpuTarget();
/// An instruction set this library's code may use that the running CPU
/// lacks (as __builtin_cpu_supports names it), or null when it has them all.
const char *missingCpuFeature();

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

namespace detail {
using ::fastllm::rt::detail::collapseDims;
using ::fastllm::rt::detail::makeElementwiseLayout;
using ::fastllm::rt::detail::NoDeduce;
} // namespace detail

// In, ReduceKind, Reduction and every kernel's declaration.
#include "runtime/KernelApi.inc"

//===----------------------------------------------------------------------===//
// Elementwise with broadcasting
//===----------------------------------------------------------------------===//

namespace detail {

/// Elements per innermost block in elementwise: small enough that a few
/// block buffers per operand stay in L1.
inline constexpr int64_t kBlock = 512;

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
/// This is the only code compiled per functor: the rest of elementwise
/// depends on the element types alone and calls it once per block through a
/// pointer, so that a generated step with many functors compiles quickly.
template <typename Out, typename F, typename... T>
void applyBlock(Out *out, int64_t len, const void *f, const T *...in) {
  const F &fn = *static_cast<const F *>(f);
  for (int64_t i = 0; i < len; ++i)
    out[i] = static_cast<Out>(fn(in[i]...));
}

/// applyBlock for one functor, as elementwiseRun calls it.
template <typename Out, typename... T>
using ApplyBlockFn = void (*)(Out *, int64_t, const void *, const T *...);

/// Runs the blocks [begin, end) of a collapsed elementwise iteration: blocks
/// are numbered row by row, `blocksPerRow` per innermost row.
template <typename Out, size_t... I, typename... T>
void elementwiseBlocks(Out *out, ApplyBlockFn<Out, T...> apply, const void *f,
                       int rank, const int64_t *shape,
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
    apply(out + row * n + first, len, f,
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

/// elementwise for every functor of these element types: the layout, the
/// threads and the blocks, calling `apply` (applyBlock<Out, F, T...>) on
/// `f`. Not inlined, so that each functor does not get a copy.
template <typename Out, typename... T>
[[gnu::noinline]] void elementwiseRun(Out *out, int rank, const int64_t *shape,
                                      ApplyBlockFn<Out, T...> apply,
                                      const void *f, In<T>... ins) {
  constexpr int kNumIn = sizeof...(T);
  assert(rank >= 0 && rank <= kMaxRank && "rank above kMaxRank");
  const int64_t *inStrides[kNumIn + 1] = {ins.strides...};
  const auto layout = makeElementwiseLayout<kNumIn>(rank, shape, inStrides);
  if (layout.total == 0)
    return;
  const int r = layout.rank;
  if (r == 0) {
    apply(out, 1, f, ins.data...);
    return;
  }
  const int64_t blocksPerRow = (layout.shape[r - 1] + kBlock - 1) / kBlock;
  const int64_t numBlocks = layout.total / layout.shape[r - 1] * blocksPerRow;
  parallelFor(numBlocks, layout.total, [&](int64_t begin, int64_t end) {
    elementwiseBlocks(out, apply, f, r, layout.shape, layout.strides,
                      blocksPerRow, begin, end, std::index_sequence_for<T...>{},
                      ins...);
  });
}

} // namespace detail

/// runtime/KernelApi.inc's elementwise on the CPU: `f` is called from
/// several threads at once. The collapsed iteration runs in blocks of
/// detail::kBlock innermost elements. Inputs with unit or zero stride along
/// the merged innermost dim cost nothing extra; any other input is gathered
/// element by element, which is slow for large strides: a genuinely
/// transposed operand is better served by `transpose`, which copies tiles.
template <typename Out, typename F, typename... T>
void elementwise(Out *out, int rank, const int64_t *shape, F f, In<T>... ins) {
  detail::elementwiseRun<Out, T...>(
      out, rank, shape, &detail::applyBlock<Out, F, T...>, &f, ins...);
}

//===----------------------------------------------------------------------===//
// Fill, copy, addInto
//===----------------------------------------------------------------------===//

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

/// runtime/KernelApi.inc's dropout on the CPU: work is split in blocks of
/// 64 elements of one sample (16 Philox calls, made together so that they
/// vectorize).
template <typename T>
void dropout(T *out, const T *in, bool splatInput, int64_t n, int64_t perSample,
             uint32_t site, uint32_t threshold, float scale, uint64_t seed,
             int64_t step, int64_t firstSample) {
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
// Instances the library holds
//===----------------------------------------------------------------------===//

// The float instances of the templates above are compiled once, in the
// library (kernels/Elementwise.cpp, with the flags generated code gets): a
// generated step then compiles only its functors' applyBlock, and a part of
// it compiled without optimisation (`compile` builds the step's calls at
// -O0) still calls optimised fill, copy, addInto and dropout.
#define FASTLLM_CPU_HEADER_INSTANCES(X)                                        \
  X(template void detail::elementwiseRun<float, float>(                        \
      float *, int, const int64_t *, detail::ApplyBlockFn<float, float>,       \
      const void *, In<float>))                                                \
  X(template void detail::elementwiseRun<float, float, float>(                 \
      float *, int, const int64_t *,                                           \
      detail::ApplyBlockFn<float, float, float>, const void *, In<float>,      \
      In<float>))                                                              \
  X(template void detail::elementwiseRun<float, float, float, float>(          \
      float *, int, const int64_t *,                                           \
      detail::ApplyBlockFn<float, float, float, float>, const void *,          \
      In<float>, In<float>, In<float>))                                        \
  X(template void detail::elementwiseRun<float, float, float, float, float>(   \
      float *, int, const int64_t *,                                           \
      detail::ApplyBlockFn<float, float, float, float, float>, const void *,   \
      In<float>, In<float>, In<float>, In<float>))                             \
  X(template void fill<float>(float *, int64_t, float))                        \
  X(template void copy<float>(float *, const float *, int64_t))                \
  X(template void addInto<float>(float *, const float *, int64_t))             \
  X(template void dropout<float>(float *, const float *, bool, int64_t,        \
                                 int64_t, uint32_t, uint32_t, float, uint64_t, \
                                 int64_t, int64_t))

#ifndef FASTLLM_CPU_DEFINE_HEADER_INSTANCES
#define FASTLLM_CPU_EXTERN_INSTANCE(...) extern __VA_ARGS__;
FASTLLM_CPU_HEADER_INSTANCES(FASTLLM_CPU_EXTERN_INSTANCE)
#undef FASTLLM_CPU_EXTERN_INSTANCE
#endif

} // namespace fastllm::rt::cpu

#endif // FASTLLM_RUNTIME_CPU_KERNELS_H
