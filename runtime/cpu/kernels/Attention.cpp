//===- Attention.cpp - fused causal attention -------------------*- C++ -*-===//
//
// runtime/KernelApi.inc's causalAttention and causalAttentionGrad for the
// CPU library (float): each thread holds the scores of one block of query
// rows against the keys up to the diagonal, multiplied by single-threaded
// GEMMs, so no more than a block of the t x t scores exists per thread.
// Blocks are grouped into units of work whose number, in the backward, is a
// function of the shapes alone, so the key gradients' sums over groups do
// not depend on the thread count.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/kernels/Common.h"

#include <cblas.h>

#include <cmath>
#include <memory>
#include <vector>

namespace fastllm::rt::cpu {

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

template <typename T>
void causalAttention(T *out, float *lse, const T *q, const T *k, const T *v,
                     int64_t batch, int64_t t, int64_t d, int64_t dv,
                     float scale) {
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

template <typename T>
void causalAttentionGrad(T *dQ, T *dK, T *dV, const T *q, const T *k,
                         const T *v, const T *out, const float *lse,
                         const T *dout, int64_t batch, int64_t t, int64_t d,
                         int64_t dv, float scale) {
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
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_FLOAT_TYPES(FASTLLM_INSTANTIATE_ATTENTION)

} // namespace fastllm::rt::cpu
