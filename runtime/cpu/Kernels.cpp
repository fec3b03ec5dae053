//===- Kernels.cpp - CPU kernels for generated training code --------------===//
//
// Row kernels (softmax, norms, losses) reduce with fixed-lane partial sums
// (laneSum) rather than a plain running sum: the lanes let the compiler
// vectorize without -ffast-math, and they fix the order of additions, so a
// result depends on the shapes only. Where rows must be combined (parameter
// gradients, loss sums) the rows are cut into chunks whose number depends on
// the shapes, never on the thread count.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/Kernels.h"

#include <cblas.h>

#include <cstdlib>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>

// OpenBLAS's kernel selection for DYNAMIC_ARCH builds; weak, so that another
// OpenBLAS build (or BLAS) still links. See configureBlas.
extern "C" {
__attribute__((weak)) void gotoblas_dynamic_init(void);
__attribute__((weak)) void gotoblas_dynamic_quit(void);
}

namespace fastllm::rt::cpu {
namespace {

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

constexpr int kLanes = 16;

/// Σ f(i) over [0, n) in kLanes interleaved partial sums, combined pairwise.
template <typename Acc, typename F> Acc laneSum(int64_t n, F f) {
  Acc lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l)
      lanes[l] += static_cast<Acc>(f(i + l));
  for (int l = 0; i < n; ++i, ++l)
    lanes[l] += static_cast<Acc>(f(i));
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l)
      lanes[l] += lanes[l + width];
  return lanes[0];
}

/// (Σ f(i), Σ g(i)) in one pass, as laneSum.
template <typename Acc, typename F, typename G>
std::pair<Acc, Acc> laneSum2(int64_t n, F f, G g) {
  Acc a[kLanes] = {}, b[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      a[l] += static_cast<Acc>(f(i + l));
      b[l] += static_cast<Acc>(g(i + l));
    }
  for (int l = 0; i < n; ++i, ++l) {
    a[l] += static_cast<Acc>(f(i));
    b[l] += static_cast<Acc>(g(i));
  }
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) {
      a[l] += a[l + width];
      b[l] += b[l + width];
    }
  return {a[0], b[0]};
}

/// max(a, b) that returns NaN once either is NaN, as torch.max does.
template <typename T> T maxNan(T acc, T x) {
  return (x > acc || x != x) ? x : acc;
}

template <typename T> T lowest() {
  return std::numeric_limits<T>::has_infinity
             ? -std::numeric_limits<T>::infinity()
             : std::numeric_limits<T>::lowest();
}

/// max over [0, n) of x, NaN-propagating, in kLanes lanes.
template <typename T> T rowMax(const T *x, int64_t n) {
  T lanes[kLanes];
  std::fill_n(lanes, kLanes, lowest<T>());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l)
      lanes[l] = maxNan(lanes[l], x[i + l]);
  for (; i < n; ++i)
    lanes[0] = maxNan(lanes[0], x[i]);
  T m = lanes[0];
  for (int l = 1; l < kLanes; ++l)
    m = maxNan(m, lanes[l]);
  return m;
}

/// The max m of a row and Σ e^(x - m), reading the row once: it goes by
/// L1-sized chunks, and a chunk with a larger max rescales the running sum.
/// As in PyTorch, -inf entries add nothing, a row of only -inf gives a NaN
/// sum, and NaN propagates.
std::pair<float, float> rowMaxExpSum(const float *x, int64_t n) {
  constexpr int64_t kChunk = 2048;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m = kNegInf, sum = 0.f;
  for (int64_t i = 0; i < n; i += kChunk) {
    const float *chunk = x + i;
    int64_t len = std::min(kChunk, n - i);
    float chunkMax = rowMax(chunk, len);
    if (chunkMax == kNegInf)
      continue;
    if (chunkMax > m) {
      sum *= fastExp(m - chunkMax);
      m = chunkMax;
    }
    sum +=
        laneSum<float>(len, [&](int64_t j) { return fastExp(chunk[j] - m); });
  }
  if (m == kNegInf)
    sum = std::numeric_limits<float>::quiet_NaN();
  return {m, sum};
}

/// A row-major multi-index over `rank` dims and the matching offset into one
/// strided operand.
struct StridedWalk {
  StridedWalk(int rank, const int64_t *shape, const int64_t *strides)
      : rank(rank), shape(shape), strides(strides) {}

  void seek(int64_t flat) {
    offset = 0;
    for (int d = rank - 1; d >= 0; --d) {
      index[d] = flat % shape[d];
      flat /= shape[d];
      offset += index[d] * strides[d];
    }
  }

  void next() {
    for (int d = rank - 1; d >= 0; --d) {
      offset += strides[d];
      if (++index[d] < shape[d])
        return;
      offset -= strides[d] * shape[d];
      index[d] = 0;
    }
  }

  int rank;
  const int64_t *shape;
  const int64_t *strides;
  int64_t index[kMaxRank] = {};
  int64_t offset = 0;
};

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

/// The number of row chunks for kernels that sum per-row contributions into
/// one [cols] result: enough to share among threads, and a function of the
/// shape alone so that the sums do not depend on the thread count.
int64_t rowChunks(int64_t rows, int64_t cols) {
  return std::clamp<int64_t>(rows * cols / kParallelGrain, 1,
                             std::min<int64_t>(rows, 64));
}

//===----------------------------------------------------------------------===//
// BLAS setup
//===----------------------------------------------------------------------===//

/// Runs once before the first GEMM. OpenBLAS stays on one thread (matmul
/// splits work over the OpenMP team instead). And Debian's OpenBLAS 0.3.21
/// does not recognise recent Xeons: its DYNAMIC_ARCH build then falls back to
/// the SSE3 "Prescott" kernels, about five times slower than its AVX-512 ones
/// on this kind of machine. When that happened and the user chose no core
/// with OPENBLAS_CORETYPE, pick one from the CPU's features and rerun
/// OpenBLAS's own selection, which reads that variable.
void configureBlas() {
  static const bool configured = [] {
    const char *core = openblas_get_corename();
    if (std::getenv("OPENBLAS_CORETYPE") || !core ||
        std::strcmp(core, "Prescott") != 0 || !gotoblas_dynamic_init ||
        !gotoblas_dynamic_quit)
      return true;
    __builtin_cpu_init();
    const char *better = nullptr;
    if (__builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
      better = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      better = "Haswell";
    if (better) {
      setenv("OPENBLAS_CORETYPE", better, 0);
      gotoblas_dynamic_quit();
      gotoblas_dynamic_init();
      unsetenv("OPENBLAS_CORETYPE");
    }
    return true;
  }();
  (void)configured;
  if (openblas_get_num_threads() != 1)
    openblas_set_num_threads(1);
}

} // namespace

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

/// Below this many flops a batched product stays on one thread.
static constexpr double kMinParallelFlops = 1 << 20;
/// The most rows (or columns) of C one single-threaded GEMM computes: large
/// enough that BLAS runs near its peak and packs the other operand rarely
/// (once per kGemmBand rows), small enough to give every thread work.
static constexpr int64_t kGemmBand = 256;

/// C = op(A)·op(B) + beta·C (beta 0 or 1).
static void gemm(float *c, const float *a, const float *b, int batchRank,
                 const int64_t *batchShape, const int64_t *aBatchStrides,
                 const int64_t *bBatchStrides, int64_t m, int64_t n, int64_t k,
                 bool transA, bool transB, float beta) {
  assert(batchRank >= 0 && batchRank <= kMaxRank && "rank above kMaxRank");
  int64_t dims[kMaxRank], strides[2][kMaxRank];
  for (int d = 0; d < batchRank; ++d) {
    dims[d] = batchShape[d];
    strides[0][d] = aBatchStrides[d];
    strides[1][d] = bBatchStrides[d];
  }
  int64_t batch = numElements(batchRank, batchShape);
  if (batch == 0 || m == 0 || n == 0)
    return;
  if (k == 0) {
    if (beta == 0.f)
      fill(c, batch * m * n, 0.f);
    return;
  }
  int rank = detail::collapseDims(batchRank, dims, 2, strides);
  // A stack of A matrices times one shared B is a single taller product.
  if (rank == 1 && strides[1][0] == 0 && strides[0][0] == m * k && !transA) {
    m *= dims[0];
    batch = 1;
    rank = 0;
  }
  configureBlas();

  // Work is split into batch × parts single-threaded GEMMs, each part a band
  // of at most kGemmBand rows or columns of C along its longer side. The
  // split is a function of the shapes alone: BLAS may pick another kernel,
  // and so another order of the sums, for another band shape (OpenBLAS's
  // small-matrix kernels on AVX-512 do), so a split that followed the thread
  // count would change the bits with it.
  double flops = 2.0 * batch * m * n * k;
  int threads = flops < kMinParallelFlops ? 1 : numThreadsFor(kParallelGrain);
  bool splitRows = m >= n;
  int64_t side = splitRows ? m : n;
  int64_t parts = (side + kGemmBand - 1) / kGemmBand;
  int64_t band = (side + parts - 1) / parts;
  const int64_t lda = transA ? m : k, ldb = transB ? k : n;

  parallelChunks(batch * parts, threads, [&](int64_t unit) {
    int64_t index = unit / parts, part = unit % parts;
    int64_t lo = part * band, hi = std::min(side, lo + band);
    if (lo >= hi)
      return;
    StridedWalk aWalk(rank, dims, strides[0]), bWalk(rank, dims, strides[1]);
    aWalk.seek(index);
    bWalk.seek(index);
    const float *pa = a + aWalk.offset, *pb = b + bWalk.offset;
    float *pc = c + index * m * n;
    int64_t rows = m, cols = n;
    if (splitRows) {
      pa += transA ? lo : lo * k;
      pc += lo * n;
      rows = hi - lo;
    } else {
      pb += transB ? lo * k : lo;
      pc += lo;
      cols = hi - lo;
    }
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                transB ? CblasTrans : CblasNoTrans, rows, cols, k, 1.f, pa, lda,
                pb, ldb, beta, pc, n);
  });
}

void matmul(float *c, const float *a, const float *b, int batchRank,
            const int64_t *batchShape, const int64_t *aBatchStrides,
            const int64_t *bBatchStrides, int64_t m, int64_t n, int64_t k,
            bool transA, bool transB) {
  gemm(c, a, b, batchRank, batchShape, aBatchStrides, bBatchStrides, m, n, k,
       transA, transB, 0.f);
}

void addMatmul(float *acc, const float *a, const float *b, int batchRank,
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
  int64_t inStrides[kMaxRank], dims[kMaxRank], strides[1][kMaxRank];
  contiguousStrides(rank, inShape, inStrides);
  for (int d = 0; d < rank; ++d) {
    dims[d] = inShape[perm[d]];
    strides[0][d] = inStrides[perm[d]];
  }
  int64_t total = numElements(rank, dims);
  if (total == 0)
    return;
  int r = detail::collapseDims(rank, dims, 1, strides);
  // When the last dim stays last, whole rows move: a strided copy.
  if (r == 0 || strides[0][r - 1] == 1)
    return elementwise(out, r, dims, Identity<T>(), In<T>{in, strides[0]});

  // Otherwise the input's contiguous dim q lands somewhere before the
  // output's last dim: copy square tiles spanning q and the last dim, so that
  // reads and writes both use whole cache lines.
  int q = 0;
  while (strides[0][q] != 1)
    ++q;
  int64_t outStrides[kMaxRank];
  contiguousStrides(r, dims, outStrides);
  int64_t outerDims[kMaxRank], outerIn[kMaxRank], outerOut[kMaxRank];
  int outerRank = 0;
  for (int d = 0; d < r - 1; ++d) {
    if (d == q)
      continue;
    outerDims[outerRank] = dims[d];
    outerIn[outerRank] = strides[0][d];
    outerOut[outerRank++] = outStrides[d];
  }
  const int64_t qSize = dims[q], lastSize = dims[r - 1];
  const int64_t qOutStride = outStrides[q], lastInStride = strides[0][r - 1];
  const int64_t qTiles = (qSize + kTile - 1) / kTile;
  const int64_t lastTiles = (lastSize + kTile - 1) / kTile;
  const int64_t numTiles = total / (qSize * lastSize) * qTiles * lastTiles;
  parallelFor(numTiles, total, [&](int64_t begin, int64_t end) {
    StridedWalk inWalk(outerRank, outerDims, outerIn);
    StridedWalk outWalk(outerRank, outerDims, outerOut);
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

namespace {
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

namespace {
template <typename Idx> int64_t wrapIndex(Idx index, int64_t dimSize) {
  int64_t i = index < 0 ? int64_t(index) + dimSize : int64_t(index);
  assert(i >= 0 && i < dimSize && "gather index out of range");
  return i;
}
} // namespace

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
// Reductions
//===----------------------------------------------------------------------===//

namespace {

/// Sum (and Mean): floats accumulate in double, integers in int64_t.
template <typename T> struct SumOp {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  static Acc init() { return 0; }
  static Acc combine(Acc acc, Acc x) { return acc + x; }
  static Acc row(const T *x, int64_t n) {
    return laneSum<Acc>(n, [&](int64_t i) { return x[i]; });
  }
};

template <typename T> struct MaxOp {
  using Acc = T;
  static Acc init() { return lowest<T>(); }
  static Acc combine(Acc acc, Acc x) { return maxNan(acc, x); }
  static Acc row(const T *x, int64_t n) { return rowMax(x, n); }
};

/// Elements per chunk when one output reduces a long contiguous run.
constexpr int64_t kReduceChunk = 16384;

/// The reduction over collapsed dims (no size-1 dims, neighbours differ in
/// `reduced`); `finish` turns an accumulator into an output value.
template <typename Op, typename T, typename Finish>
void reduceCollapsed(T *out, const T *in, int rank, const int64_t *dims,
                     const bool *reduced, Finish finish) {
  using Acc = typename Op::Acc;
  int64_t strides[kMaxRank];
  contiguousStrides(rank, dims, strides);
  int64_t keptDims[kMaxRank], keptStrides[kMaxRank];
  int64_t redDims[kMaxRank], redStrides[kMaxRank];
  int keptRank = 0, redRank = 0;
  // The innermost dim is handled by the loops below, not by the walks.
  for (int d = 0; d < rank - 1; ++d) {
    if (reduced[d]) {
      redDims[redRank] = dims[d];
      redStrides[redRank++] = strides[d];
    } else {
      keptDims[keptRank] = dims[d];
      keptStrides[keptRank++] = strides[d];
    }
  }
  const int64_t inner = dims[rank - 1];
  const int64_t total = numElements(rank, dims);
  const int64_t redOuter = numElements(redRank, redDims);
  const int64_t keptOuter = numElements(keptRank, keptDims);

  if (reduced[rank - 1] && keptOuter == 1 && redOuter == 1) {
    // Everything into one value: fixed chunks, combined in order.
    int64_t chunks = (inner + kReduceChunk - 1) / kReduceChunk;
    std::vector<Acc> partial(chunks);
    parallelChunks(chunks, numThreadsFor(total), [&](int64_t c) {
      int64_t first = c * kReduceChunk;
      partial[c] = Op::row(in + first, std::min(kReduceChunk, inner - first));
    });
    Acc acc = Op::init();
    for (Acc p : partial)
      acc = Op::combine(acc, p);
    out[0] = finish(acc);
    return;
  }

  if (reduced[rank - 1]) {
    // Each output reduces contiguous runs of `inner` elements.
    parallelFor(keptOuter, total, [&](int64_t begin, int64_t end) {
      StridedWalk kept(keptRank, keptDims, keptStrides);
      StridedWalk red(redRank, redDims, redStrides);
      kept.seek(begin);
      for (int64_t o = begin; o < end; ++o, kept.next()) {
        Acc acc = Op::init();
        red.seek(0);
        for (int64_t q = 0; q < redOuter; ++q, red.next())
          acc = Op::combine(acc, Op::row(in + kept.offset + red.offset, inner));
        out[o] = finish(acc);
      }
    });
    return;
  }

  // The innermost dim is kept: accumulate whole rows of outputs at once,
  // vectorized across columns, in bands of at most kBand columns.
  constexpr int64_t kBand = 1024;
  int threads = numThreadsFor(total);
  int64_t bands = (inner + kBand - 1) / kBand;
  if (keptOuter * bands < threads)
    bands = std::min<int64_t>((threads + keptOuter - 1) / keptOuter,
                              std::max<int64_t>(1, inner / 16));
  const int64_t width = (inner + bands - 1) / bands;
  parallelChunks(keptOuter * bands, threads, [&](int64_t task) {
    int64_t o = task / bands;
    int64_t c0 = task % bands * width, len = std::min(inner - c0, width);
    if (len <= 0)
      return;
    Acc acc[kBand];
    std::fill_n(acc, len, Op::init());
    StridedWalk kept(keptRank, keptDims, keptStrides);
    StridedWalk red(redRank, redDims, redStrides);
    kept.seek(o);
    for (int64_t q = 0; q < redOuter; ++q, red.next()) {
      const T *x = in + kept.offset + red.offset + c0;
      for (int64_t i = 0; i < len; ++i)
        acc[i] = Op::combine(acc[i], static_cast<Acc>(x[i]));
    }
    T *y = out + o * inner + c0;
    for (int64_t i = 0; i < len; ++i)
      y[i] = finish(acc[i]);
  });
}

} // namespace

template <typename T>
void reduce(T *out, const T *in, int rank, const int64_t *shape,
            const bool *reducedDims, ReduceKind kind) {
  assert(rank >= 0 && rank <= kMaxRank && "rank above kMaxRank");
  int64_t keptCount = 1, redCount = 1;
  for (int d = 0; d < rank; ++d)
    (reducedDims[d] ? redCount : keptCount) *= shape[d];
  if (keptCount == 0)
    return;
  if (redCount == 0) {
    T empty = kind == ReduceKind::Max ? lowest<T>() : T(0);
    if (kind == ReduceKind::Mean && std::numeric_limits<T>::has_quiet_NaN)
      empty = std::numeric_limits<T>::quiet_NaN();
    return fill(out, keptCount, empty);
  }
  // Drop size-1 dims and merge neighbours with the same role: both the input
  // and the output are contiguous, so such runs are single dims.
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
  if (r == 0 || (r == 1 && !reduced[0]))
    return copy(out, in, keptCount);

  if (kind == ReduceKind::Max)
    return reduceCollapsed<MaxOp<T>>(out, in, r, dims, reduced,
                                     [](T acc) { return acc; });
  using Acc = typename SumOp<T>::Acc;
  if (kind == ReduceKind::Sum)
    return reduceCollapsed<SumOp<T>>(
        out, in, r, dims, reduced, [](Acc acc) { return static_cast<T>(acc); });
  return reduceCollapsed<SumOp<T>>(
      out, in, r, dims, reduced,
      [redCount](Acc acc) { return static_cast<T>(acc / redCount); });
}

//===----------------------------------------------------------------------===//
// Softmax
//===----------------------------------------------------------------------===//

namespace {
/// Columns processed together when softmax runs along a non-last dim.
constexpr int64_t kSoftmaxBand = 256;

/// Softmax along n of x[j·inner + i] for the band of columns i < len ≤
/// kSoftmaxBand, vectorized across the columns.
void softmaxBand(float *y, const float *x, int64_t n, int64_t inner,
                 int64_t len, bool log) {
  float m[kSoftmaxBand], s[kSoftmaxBand];
  std::fill_n(m, len, -std::numeric_limits<float>::infinity());
  std::fill_n(s, len, 0.f);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < len; ++i)
      m[i] = maxNan(m[i], x[j * inner + i]);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < len; ++i) {
      float e = fastExp(x[j * inner + i] - m[i]);
      s[i] += e;
      if (!log)
        y[j * inner + i] = e;
    }
  for (int64_t i = 0; i < len; ++i)
    s[i] = log ? std::log(s[i]) : 1.f / s[i];
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < len; ++i) {
      float &v = y[j * inner + i];
      v = log ? (x[j * inner + i] - m[i]) - s[i] : v * s[i];
    }
}

/// softmaxGrad for one band of columns, as softmaxBand.
void softmaxGradBand(float *dx, const float *y, const float *dy, int64_t n,
                     int64_t inner, int64_t len, bool log) {
  double s[kSoftmaxBand];
  std::fill_n(s, len, 0.0);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < len; ++i) {
      int64_t at = j * inner + i;
      s[i] += log ? double(dy[at]) : double(dy[at]) * y[at];
    }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < len; ++i) {
      int64_t at = j * inner + i;
      float si = static_cast<float>(s[i]);
      dx[at] = log ? dy[at] - fastExp(y[at]) * si : y[at] * (dy[at] - si);
    }
}

/// Runs band(offset, len) over every band of columns of [outer, n, inner].
template <typename Band>
void forEachBand(int64_t outer, int64_t n, int64_t inner, Band band) {
  const int64_t bands = (inner + kSoftmaxBand - 1) / kSoftmaxBand;
  parallelFor(outer * bands, outer * n * inner,
              [&](int64_t begin, int64_t end) {
                for (int64_t task = begin; task < end; ++task) {
                  int64_t o = task / bands, c0 = task % bands * kSoftmaxBand;
                  band(o * n * inner + c0, std::min(kSoftmaxBand, inner - c0));
                }
              });
}
} // namespace

void softmax(float *y, const float *x, int64_t outer, int64_t n, int64_t inner,
             bool log) {
  if (inner > 1)
    return forEachBand(outer, n, inner, [&](int64_t offset, int64_t len) {
      softmaxBand(y + offset, x + offset, n, inner, len, log);
    });
  parallelFor(outer, outer * n, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float *xr = x + row * n;
      float *yr = y + row * n;
      if (log) {
        // (x - m) - log Σ: the first difference is exact near the max.
        auto [m, sum] = rowMaxExpSum(xr, n);
        float logSum = std::log(sum);
        for (int64_t i = 0; i < n; ++i)
          yr[i] = (xr[i] - m) - logSum;
        continue;
      }
      float m = rowMax(xr, n);
      float inv = 1.f / laneSum<float>(n, [&](int64_t i) {
                    return yr[i] = fastExp(xr[i] - m);
                  });
      for (int64_t i = 0; i < n; ++i)
        yr[i] *= inv;
    }
  });
}

void softmaxGrad(float *dx, const float *y, const float *dy, int64_t outer,
                 int64_t n, int64_t inner, bool log) {
  if (inner > 1)
    return forEachBand(outer, n, inner, [&](int64_t offset, int64_t len) {
      softmaxGradBand(dx + offset, y + offset, dy + offset, n, inner, len, log);
    });
  parallelFor(outer, outer * n, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float *yr = y + row * n, *gr = dy + row * n;
      float *dr = dx + row * n;
      if (log) {
        float s = static_cast<float>(
            laneSum<double>(n, [&](int64_t i) { return gr[i]; }));
        for (int64_t i = 0; i < n; ++i)
          dr[i] = gr[i] - fastExp(yr[i]) * s;
      } else {
        float s = static_cast<float>(laneSum<double>(
            n, [&](int64_t i) { return double(gr[i]) * yr[i]; }));
        for (int64_t i = 0; i < n; ++i)
          dr[i] = yr[i] * (gr[i] - s);
      }
    }
  });
}

//===----------------------------------------------------------------------===//
// Normalisation
//===----------------------------------------------------------------------===//

namespace {
/// Mean and 1/√(biased variance + eps) of one row, from one pass of Σx and
/// Σx² in double: the cancellation in E[x²] - mean² then costs far less than
/// float resolution unless |mean| exceeds the spread by ~10⁴.
std::pair<double, double> rowMoments(const float *x, int64_t n, float eps) {
  auto [sum, sumSq] = laneSum2<double>(
      n, [&](int64_t i) { return x[i]; },
      [&](int64_t i) { return double(x[i]) * x[i]; });
  double mean = sum / n;
  double var = std::max(sumSq / n - mean * mean, 0.0);
  return {mean, 1.0 / std::sqrt(var + eps)};
}

double rowRstd(const float *x, int64_t n, float eps) {
  double ms =
      laneSum<double>(n, [&](int64_t i) { return double(x[i]) * x[i]; }) / n;
  return 1.0 / std::sqrt(ms + eps);
}

/// Runs rowBody(row, partial) over all rows, where `partial` points to
/// `numSums` arrays of `cols` doubles that the rows of one chunk add into,
/// then stores the sums over chunks into `outs` (null entries skipped).
template <typename RowBody>
void rowsWithColumnSums(int64_t rows, int64_t cols, int numSums,
                        float *const *outs, RowBody rowBody) {
  const int64_t chunks = rowChunks(rows, cols);
  const int64_t stride = numSums * cols;
  std::vector<double> partial(chunks * stride, 0.0);
  parallelChunks(chunks, numThreadsFor(rows * cols), [&](int64_t c) {
    for (int64_t row = rows * c / chunks; row < rows * (c + 1) / chunks; ++row)
      rowBody(row, partial.data() + c * stride);
  });
  for (int k = 0; k < numSums; ++k) {
    if (!outs[k])
      continue;
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0;
      for (int64_t c = 0; c < chunks; ++c)
        sum += partial[c * stride + k * cols + j];
      outs[k][j] = static_cast<float>(sum);
    }
  }
}
} // namespace

void layerNorm(float *y, const float *x, const float *scale, const float *bias,
               int64_t rows, int64_t cols, float eps) {
  parallelFor(rows, rows * cols, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float *xr = x + row * cols;
      float *yr = y + row * cols;
      auto [mean, rstd] = rowMoments(xr, cols, eps);
      float m = static_cast<float>(mean), r = static_cast<float>(rstd);
      if (bias)
        for (int64_t i = 0; i < cols; ++i)
          yr[i] = (xr[i] - m) * r * scale[i] + bias[i];
      else
        for (int64_t i = 0; i < cols; ++i)
          yr[i] = (xr[i] - m) * r * scale[i];
    }
  });
}

void layerNormGrad(float *dx, float *dscale, float *dbias, const float *x,
                   const float *scale, const float *dy, int64_t rows,
                   int64_t cols, float eps) {
  float *outs[] = {dscale, dbias};
  rowsWithColumnSums(rows, cols, 2, outs, [&](int64_t row, double *partial) {
    const float *xr = x + row * cols, *gr = dy + row * cols;
    float *dr = dx + row * cols;
    auto [mean, rstd] = rowMoments(xr, cols, eps);
    float m = static_cast<float>(mean), r = static_cast<float>(rstd);
    // dx = rstd·(g - mean(g) - x̂·mean(g·x̂)) with g = dy·scale.
    auto [sumG, sumGX] = laneSum2<double>(
        cols, [&](int64_t i) { return gr[i] * scale[i]; },
        [&](int64_t i) {
          return double(gr[i] * scale[i]) * ((xr[i] - m) * r);
        });
    float a = static_cast<float>(sumG / cols);
    float b = static_cast<float>(sumGX / cols);
    double *pScale = partial, *pBias = partial + cols;
    for (int64_t i = 0; i < cols; ++i) {
      float xhat = (xr[i] - m) * r;
      dr[i] = r * (gr[i] * scale[i] - a - xhat * b);
      pScale[i] += double(gr[i]) * xhat;
      pBias[i] += gr[i];
    }
  });
}

void rmsNorm(float *y, const float *x, const float *scale, int64_t rows,
             int64_t cols, float eps) {
  parallelFor(rows, rows * cols, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float *xr = x + row * cols;
      float *yr = y + row * cols;
      float r = static_cast<float>(rowRstd(xr, cols, eps));
      for (int64_t i = 0; i < cols; ++i)
        yr[i] = xr[i] * r * scale[i];
    }
  });
}

void rmsNormGrad(float *dx, float *dscale, const float *x, const float *scale,
                 const float *dy, int64_t rows, int64_t cols, float eps) {
  float *outs[] = {dscale};
  rowsWithColumnSums(rows, cols, 1, outs, [&](int64_t row, double *partial) {
    const float *xr = x + row * cols, *gr = dy + row * cols;
    float *dr = dx + row * cols;
    float r = static_cast<float>(rowRstd(xr, cols, eps));
    // dx = rstd·(g - x̂·mean(g·x̂)) with g = dy·scale.
    double sumGX = laneSum<double>(cols, [&](int64_t i) {
      return double(gr[i] * scale[i]) * (xr[i] * r);
    });
    float b = static_cast<float>(sumGX / cols);
    for (int64_t i = 0; i < cols; ++i) {
      float xhat = xr[i] * r;
      dr[i] = r * (gr[i] * scale[i] - xhat * b);
      partial[i] += double(gr[i]) * xhat;
    }
  });
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

namespace {

/// The most query rows per block.
constexpr int64_t kAttnMaxBlock = 64;

/// Query rows per block. Each block multiplies its rows against all keys up
/// to the diagonal (skipping the blocks above it), and in the diagonal block
/// computes the upper half only to mask it: smaller blocks waste less there,
/// larger ones reread the keys fewer times. Measured on AVX-512 with
/// OpenBLAS, 32 rows are faster while a problem's keys and values fit in
/// 128 KiB, 64 beyond. A function of the shapes alone, as the backward's sums
/// depend on it.
int64_t attentionBlockRows(int64_t t, int64_t d, int64_t dv) {
  return t * std::max(d, dv) <= 32768 ? 32 : kAttnMaxBlock;
}

/// The backward splits each problem's query blocks into groups until there
/// are this many units of work (a function of the shapes alone, so the sums
/// over groups do not depend on the thread count).
constexpr int64_t kAttnMinUnits = 8;

/// The number of threads for attention over `batch` problems.
int attentionThreads(int64_t batch, int64_t t, int64_t d, int64_t dv) {
  // Two products over the lower triangle of the scores.
  double flops = double(batch) * t * (t + 1) * (d + dv);
  return flops < kMinParallelFlops ? 1 : numThreadsFor(kParallelGrain);
}

/// Calls body(unit, scratch) for every unit in [0, numUnits), handing the
/// units out one at a time, in order, to `numThreads` OpenMP threads: units
/// differ in cost, and each writes outputs of its own, so the schedule does
/// not change the results. `scratch` is `scratchFloats` floats private to the
/// thread.
template <typename Body>
void forEachUnit(int64_t numUnits, int numThreads, int64_t scratchFloats,
                 Body body) {
#ifdef _OPENMP
  if (numThreads > 1 && numUnits > 1) {
#pragma omp parallel num_threads(numThreads)
    {
      std::unique_ptr<float[]> scratch(new float[scratchFloats]);
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < numUnits; ++u)
        body(u, scratch.get());
    }
    return;
  }
#else
  (void)numThreads;
#endif
  std::unique_ptr<float[]> scratch(new float[scratchFloats]);
  for (int64_t u = 0; u < numUnits; ++u)
    body(u, scratch.get());
}

/// C = alpha·op(A)·op(B) + beta·C, row-major; a zero leading dimension (an
/// empty d or dv) is passed as 1, which BLAS requires.
void sgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
           float alpha, const float *a, int64_t lda, const float *b,
           int64_t ldb, float beta, float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
              transB ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
              std::max<int64_t>(lda, 1), b, std::max<int64_t>(ldb, 1), beta, c,
              std::max<int64_t>(ldc, 1));
}

/// dst[c·ld + r] = src[r·cols + c] for the [rows, cols] matrix src, in
/// square tiles so that both sides move whole cache lines.
void transposeInto(float *dst, int64_t ld, const float *src, int64_t rows,
                   int64_t cols) {
  constexpr int64_t kSide = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kSide)
    for (int64_t c0 = 0; c0 < cols; c0 += kSide) {
      int64_t r1 = std::min(rows, r0 + kSide), c1 = std::min(cols, c0 + kSide);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r)
          dst[c * ld + r] = src[r * cols + c];
    }
}

/// One problem's query blocks of `rows` rows, cut into contiguous groups of
/// about equal cost (rows times keys seen): group g runs blocks [first[g],
/// first[g + 1]), in order. A group may be empty.
struct BlockGroups {
  BlockGroups(int64_t t, int64_t rows, int64_t wanted)
      : t(t), rows(rows), blocks((t + rows - 1) / rows),
        groups(std::clamp<int64_t>(wanted, 1, blocks)),
        first(groups + 1, blocks) {
    int64_t total = 0;
    for (int64_t blk = 0; blk < blocks; ++blk)
      total += cost(blk);
    // A group starts at the block whose midpoint passes its share.
    int64_t g = 0, done = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      while (g < groups && (2 * done + cost(blk)) * groups >= 2 * g * total)
        first[g++] = blk;
      done += cost(blk);
    }
  }

  int64_t rowsOf(int64_t blk) const { return std::min(rows, t - blk * rows); }
  int64_t cost(int64_t blk) const {
    return rowsOf(blk) * (blk * rows + rowsOf(blk));
  }
  /// The rows of group g see keys [0, keysOf(g)).
  int64_t keysOf(int64_t g) const {
    return first[g] == first[g + 1] ? 0 : std::min(t, first[g + 1] * rows);
  }

  int64_t t, rows, blocks, groups;
  std::vector<int64_t> first;
};

/// Rows [i0, i0 + rows) of one problem's causalAttention, given kt: the
/// problem's keys transposed, [d, ldt]. `s` holds rows·(i0 + rows) floats for
/// the block's scores.
void attentionBlock(float *out, float *lse, const float *q, const float *kt,
                    int64_t ldt, const float *v, int64_t i0, int64_t rows,
                    int64_t d, int64_t dv, float scale, float *s) {
  assert(rows <= kAttnMaxBlock && "block above kAttnMaxBlock");
  const int64_t n = i0 + rows; // the keys the block's last row sees
  sgemm(false, false, rows, n, d, scale, q + i0 * d, d, kt, ldt, 0.f, s, n);
  float inv[kAttnMaxBlock];
  for (int64_t r = 0; r < rows; ++r) {
    // Masked scores become -inf, whose exponential is an exact 0. The loops
    // then run over whole rows, whose length is a multiple of 16 but in the
    // last block: row by row up to the diagonal, they would spend more time
    // in scalar remainders than in vector code.
    float *sr = s + r * n;
    std::fill(sr + i0 + r + 1, sr + n, -std::numeric_limits<float>::infinity());
    float m = rowMax(sr, n);
    float sum = laneSum<float>(
        n, [&](int64_t j) { return sr[j] = fastExp(sr[j] - m); });
    lse[i0 + r] = m + std::log(sum);
    inv[r] = 1.f / sum;
  }
  // out = (e^(s - m) v) / Σ: normalising the rows of out, not of s, costs dv
  // products per row instead of n.
  float *o = out + i0 * dv;
  sgemm(false, false, rows, dv, n, 1.f, s, n, v, dv, 0.f, o, dv);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dv; ++c)
      o[r * dv + c] *= inv[r];
}

/// Adds the contributions of query rows [i0, i0 + rows) of one problem to
/// the key gradients accK ([i0 + rows, d]) and accV ([i0 + rows, dv]), and
/// writes their dQ. `kt` and `vt` are k and v transposed, with leading
/// dimension ldt; `p` and `ds` hold rows·(i0 + rows) floats each.
void attentionGradBlock(float *dQ, float *accK, float *accV, const float *q,
                        const float *k, const float *kt, const float *vt,
                        int64_t ldt, const float *out, const float *lse,
                        const float *dout, int64_t i0, int64_t rows, int64_t d,
                        int64_t dv, float scale, float *p, float *ds) {
  const int64_t n = i0 + rows;
  const float *qb = q + i0 * d, *gb = dout + i0 * dv;
  sgemm(false, false, rows, n, d, scale, qb, d, kt, ldt, 0.f, p, n);
  sgemm(false, false, rows, n, dv, 1.f, gb, dv, vt, ldt, 0.f, ds, n);
  for (int64_t r = 0; r < rows; ++r) {
    const float *orow = out + (i0 + r) * dv, *grow = gb + r * dv;
    float dsum = static_cast<float>(laneSum<double>(
        dv, [&](int64_t c) { return double(grow[c]) * orow[c]; }));
    float l = lse[i0 + r];
    // As in attentionBlock: masked entries get p = e^-inf = 0, so ds = 0.
    float *pr = p + r * n, *dr = ds + r * n;
    std::fill(pr + i0 + r + 1, pr + n, -std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < n; ++j) {
      float pj = fastExp(pr[j] - l);
      pr[j] = pj;
      dr[j] = pj * (dr[j] - dsum);
    }
  }
  sgemm(true, false, n, dv, rows, 1.f, p, n, gb, dv, 1.f, accV, dv);
  sgemm(true, false, n, d, rows, scale, ds, n, qb, d, 1.f, accK, d);
  sgemm(false, false, rows, d, n, scale, ds, n, k, d, 0.f, dQ + i0 * d, d);
}

} // namespace

void causalAttention(float *out, float *lse, const float *q, const float *k,
                     const float *v, int64_t batch, int64_t t, int64_t d,
                     int64_t dv, float scale) {
  if (batch == 0 || t == 0)
    return;
  configureBlas();
  // A unit is a group of one problem's query blocks, which shares one
  // transposition of the keys. Every row comes out the same whatever the
  // grouping, so it may follow the thread count: a few units per thread, so
  // that dynamic scheduling evens out unequal groups.
  const int threads = attentionThreads(batch, t, d, dv);
  const BlockGroups groups(
      t, attentionBlockRows(t, d, dv),
      threads == 1 ? 1 : (kAttnMinUnits * threads + batch - 1) / batch);
  const int64_t rowsMax = std::min(groups.rows, t);
  forEachUnit(batch * groups.groups, threads, (rowsMax + d) * t,
              [&](int64_t u, float *scratch) {
                int64_t b = u / groups.groups, g = u % groups.groups;
                float *kt = scratch + rowsMax * t;
                transposeInto(kt, t, k + b * t * d, groups.keysOf(g), d);
                for (int64_t blk = groups.first[g]; blk < groups.first[g + 1];
                     ++blk)
                  attentionBlock(out + b * t * dv, lse + b * t, q + b * t * d,
                                 kt, t, v + b * t * dv, blk * groups.rows,
                                 groups.rowsOf(blk), d, dv, scale, scratch);
              });
}

void causalAttentionGrad(float *dQ, float *dK, float *dV, const float *q,
                         const float *k, const float *v, const float *out,
                         const float *lse, const float *dout, int64_t batch,
                         int64_t t, int64_t d, int64_t dv, float scale) {
  if (batch == 0 || t == 0)
    return;
  configureBlas();
  // A unit is a group of one problem's query blocks, run in order, adding
  // into dK and dV (one group) or into key gradients of its own that are
  // summed over groups in order afterwards. The grouping depends on the
  // shapes alone, so the sums do not depend on the thread count.
  const BlockGroups groups(t, attentionBlockRows(t, d, dv),
                           (kAttnMinUnits + batch - 1) / batch);
  const int64_t numGroups = groups.groups, width = d + dv;
  std::vector<float> partial(numGroups > 1 ? batch * numGroups * t * width : 0);
  const int64_t rowsMax = std::min(groups.rows, t);

  forEachUnit(
      batch * numGroups, attentionThreads(batch, t, d, dv),
      (2 * rowsMax + width) * t, [&](int64_t u, float *scratch) {
        int64_t b = u / numGroups, g = u % numGroups;
        float *accK = dK + b * t * d, *accV = dV + b * t * dv;
        if (numGroups > 1) {
          accK = partial.data() + u * t * width;
          accV = accK + t * d;
        }
        int64_t keys = numGroups > 1 ? groups.keysOf(g) : t;
        std::fill_n(accK, keys * d, 0.f);
        std::fill_n(accV, keys * dv, 0.f);
        float *kt = scratch + 2 * rowsMax * t, *vt = kt + d * t;
        transposeInto(kt, t, k + b * t * d, keys, d);
        transposeInto(vt, t, v + b * t * dv, keys, dv);
        for (int64_t blk = groups.first[g]; blk < groups.first[g + 1]; ++blk) {
          int64_t i0 = blk * groups.rows, rows = groups.rowsOf(blk);
          attentionGradBlock(dQ + b * t * d, accK, accV, q + b * t * d,
                             k + b * t * d, kt, vt, t, out + b * t * dv,
                             lse + b * t, dout + b * t * dv, i0, rows, d, dv,
                             scale, scratch, scratch + rows * (i0 + rows));
        }
      });
  if (numGroups == 1)
    return;
  parallelFor(batch * t, batch * t * width * numGroups,
              [&](int64_t begin, int64_t end) {
                for (int64_t row = begin; row < end; ++row) {
                  int64_t b = row / t, j = row % t;
                  float *gk = dK + row * d, *gv = dV + row * dv;
                  std::fill_n(gk, d, 0.f);
                  std::fill_n(gv, dv, 0.f);
                  for (int64_t g = 0; g < numGroups; ++g) {
                    if (j >= groups.keysOf(g))
                      continue;
                    const float *pk =
                        partial.data() + (b * numGroups + g) * t * width;
                    for (int64_t c = 0; c < d; ++c)
                      gk[c] += pk[j * d + c];
                    for (int64_t c = 0; c < dv; ++c)
                      gv[c] += pk[t * d + j * dv + c];
                  }
                }
              });
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

namespace {

template <typename Idx>
bool isIgnored(Idx target, bool hasIgnore, int64_t ignoreIndex) {
  return hasIgnore && int64_t(target) == ignoreIndex;
}

template <typename Idx> int64_t checkedTarget(Idx target, int64_t classes) {
  assert(target >= 0 && int64_t(target) < classes && "target out of range");
  (void)classes;
  return int64_t(target);
}

/// Writes per-row losses (as computed by rowLoss, 0 for ignored rows) to
/// `loss`, or their sum or mean over non-ignored rows. The sum runs in row
/// order in double. `rowWork` is the number of elements rowLoss reads.
template <typename Idx, typename RowLoss>
void reduceLoss(float *loss, const Idx *targets, int64_t rows, int64_t classes,
                int64_t rowWork, bool hasIgnore, int64_t ignoreIndex,
                Reduction r, RowLoss rowLoss) {
  std::vector<double> perRow(r == Reduction::None ? 0 : rows);
  parallelFor(rows, rows * rowWork, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      double v = isIgnored(targets[row], hasIgnore, ignoreIndex)
                     ? 0.0
                     : rowLoss(row, checkedTarget(targets[row], classes));
      if (r == Reduction::None)
        loss[row] = static_cast<float>(v);
      else
        perRow[row] = v;
    }
  });
  if (r == Reduction::None)
    return;
  double sum = 0;
  int64_t count = 0;
  for (int64_t row = 0; row < rows; ++row) {
    sum += perRow[row];
    count += !isIgnored(targets[row], hasIgnore, ignoreIndex);
  }
  // Mean over no targets is 0/0 = NaN, as in PyTorch.
  loss[0] = static_cast<float>(r == Reduction::Sum ? sum : sum / count);
}

/// The incoming gradient of each row's loss: dloss[row] for None, dloss[0]
/// for Sum, dloss[0] / (number of non-ignored targets) for Mean.
template <typename Idx>
auto rowGradScale(const float *dloss, const Idx *targets, int64_t rows,
                  bool hasIgnore, int64_t ignoreIndex, Reduction r) {
  float shared = dloss[0];
  if (r == Reduction::Mean) {
    int64_t count = 0;
    for (int64_t row = 0; row < rows; ++row)
      count += !isIgnored(targets[row], hasIgnore, ignoreIndex);
    shared = static_cast<float>(double(dloss[0]) / count);
  }
  return
      [=](int64_t row) { return r == Reduction::None ? dloss[row] : shared; };
}

} // namespace

template <typename Idx>
void crossEntropy(float *loss, const float *logits, const Idx *targets,
                  int64_t rows, int64_t classes, bool hasIgnore,
                  int64_t ignoreIndex, Reduction r) {
  reduceLoss(loss, targets, rows, classes, classes, hasIgnore, ignoreIndex, r,
             [&](int64_t row, int64_t t) {
               const float *xr = logits + row * classes;
               auto [m, sum] = rowMaxExpSum(xr, classes);
               return double(m) + std::log(double(sum)) - xr[t];
             });
}

template <typename Idx>
void crossEntropyGrad(float *dlogits, const float *logits, const Idx *targets,
                      const float *dloss, int64_t rows, int64_t classes,
                      bool hasIgnore, int64_t ignoreIndex, Reduction r) {
  auto scaleOf = rowGradScale(dloss, targets, rows, hasIgnore, ignoreIndex, r);
  parallelFor(rows, rows * classes, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      float *dr = dlogits + row * classes;
      if (isIgnored(targets[row], hasIgnore, ignoreIndex)) {
        std::fill_n(dr, classes, 0.f);
        continue;
      }
      int64_t t = checkedTarget(targets[row], classes);
      const float *xr = logits + row * classes;
      float g = scaleOf(row);
      float m = rowMax(xr, classes);
      float k = g / laneSum<float>(classes, [&](int64_t i) {
                  return dr[i] = fastExp(xr[i] - m);
                });
      for (int64_t i = 0; i < classes; ++i)
        dr[i] *= k;
      dr[t] -= g;
    }
  });
}

template <typename Idx>
void nllLoss(float *loss, const float *input, const Idx *targets, int64_t rows,
             int64_t classes, bool hasIgnore, int64_t ignoreIndex,
             Reduction r) {
  reduceLoss(loss, targets, rows, classes, /*rowWork=*/1, hasIgnore,
             ignoreIndex, r, [&](int64_t row, int64_t t) {
               return -double(input[row * classes + t]);
             });
}

template <typename Idx>
void nllLossGrad(float *dinput, const Idx *targets, const float *dloss,
                 int64_t rows, int64_t classes, bool hasIgnore,
                 int64_t ignoreIndex, Reduction r) {
  auto scaleOf = rowGradScale(dloss, targets, rows, hasIgnore, ignoreIndex, r);
  parallelFor(rows, rows * classes, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      float *dr = dinput + row * classes;
      std::fill_n(dr, classes, 0.f);
      if (!isIgnored(targets[row], hasIgnore, ignoreIndex))
        dr[checkedTarget(targets[row], classes)] = -scaleOf(row);
    }
  });
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

#include "runtime/KernelInstantiations.inc"

} // namespace fastllm::rt::cpu
