//===- FlashAttention.cu - causal attention in registers --------*- C++ -*-===//
//
// The bf16 causal attention for head dims d = dv in {16, 32, 64, 128}, in
// the manner of FlashAttention-2: blocks of 4 warps own 64 rows, 16 per
// warp; every product is an mma.sync (Mma.cuh) whose operands come from
// shared tiles through ldmatrix or straight from the previous product's
// registers, so scores, probabilities and accumulators never leave the
// registers. Tiles of 64 rows move by cp.async into padded shared rows (the
// 8 rows an ldmatrix reads fall on distinct banks), the next tile loading
// while the current one is used. The softmax is online and in base 2
// (scores scaled by scale·log2 e, ex2.approx); P and dS are rounded to bf16
// for the products that read them, the statistics use the unrounded P.
//
// The backward is deterministic: no atomics. D = rowsum(dO∘O) is computed
// once per row by its own kernel into the dQ buffer (free until dQ is
// written; causalAttentionGrad's caller never aliases it with an input);
// then a kernel per 64-key tile accumulates dK and dV over the query tiles
// (4 products: S, dP, P·dO, dS·Q), and a kernel per 64-query tile
// accumulates dQ over the key tiles (3 products: S, dP, dS·K).
//
// Indices within one (batch, head) problem are 32-bit: t·d < 2^31 is
// checked before launch.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/Attention.cuh"
#include "runtime/cuda/kernels/Mma.cuh"

#include <cstdint>
#include <initializer_list>
#include <limits>

namespace fastllm::rt::cuda {

namespace {

using Bf16 = __nv_bfloat16;
using mma::cpAsync16;
using mma::cpAsyncCommit;
using mma::cpAsyncWait;
using mma::fastExp2;
using mma::ldmatrixX4;
using mma::ldmatrixX4Trans;
using mma::mmaBf16;
using mma::packBf16;

constexpr int kRows = 64; ///< query or key rows of a tile: 4 warps x 16
constexpr int kThreads = 128;
constexpr int kPad = 8; ///< bf16 past d in each shared row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/// A shared tile's row stride, in bf16: 16 bytes past the row, so that rows
/// 0..7 start 4 banks apart and an ldmatrix's 8 rows are conflict-free.
template <int D> constexpr int kRowStride = D + kPad;
template <int D> constexpr int kTileElems = kRows *kRowStride<D>;

/// Starts copying rows [first, first + 64) of the bf16 [t][D] matrix src
/// into tile (rows at or past t become zeros); every thread of the block.
template <int D>
__device__ void loadTile(Bf16 *tile, const Bf16 *src, int first, int t) {
  constexpr int chunks = D / 8; // 16 bytes each
  for (int e = threadIdx.x; e < kRows * chunks; e += kThreads) {
    const int r = e / chunks, c = e - r * chunks;
    const bool valid = first + r < t;
    cpAsync16(tile + r * kRowStride<D> + c * 8,
              valid ? src + (first + r) * D + c * 8 : src, valid ? 16 : 0);
  }
}

/// The lane's ldmatrix row address for four 8x8 matrices at
/// (r0 + 8·rowBlock, c0 + 8·colBlock) of a tile: matrix m of the four has
/// colBlock = m / 2 and rowBlock = m % 2, or the other way round when
/// `colBlockFirst`.
template <int D>
__device__ const Bf16 *fragmentRow(const Bf16 *tile, int r0, int c0,
                                   bool colBlockFirst) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  const int rowBlock = colBlockFirst ? m / 2 : m % 2;
  const int colBlock = colBlockFirst ? m % 2 : m / 2;
  return tile + (r0 + rowBlock * 8 + lane % 8) * kRowStride<D> + c0 +
         colBlock * 8;
}

/// A operand: tile rows [r0, r0 + 16), columns [k0, k0 + 16).
template <int D>
__device__ void loadA(uint32_t (&a)[4], const Bf16 *tile, int r0, int k0) {
  ldmatrixX4(a, fragmentRow<D>(tile, r0, k0, false));
}

/// B operands of B = tileᵀ (B[k][n] = tile[n][k]) for the n-tiles n0 and
/// n0 + 8 over k in [k0, k0 + 16): b[0], b[1] for n0; b[2], b[3] for n0 + 8.
template <int D>
__device__ void loadBTransposed(uint32_t (&b)[4], const Bf16 *tile, int n0,
                                int k0) {
  ldmatrixX4(b, fragmentRow<D>(tile, n0, k0, true));
}

/// B operands of B = tile (B[k][n] = tile[k][n]) for the n-tiles n0 and
/// n0 + 8 over k in [k0, k0 + 16), as loadBTransposed orders them.
template <int D>
__device__ void loadB(uint32_t (&b)[4], const Bf16 *tile, int k0, int n0) {
  ldmatrixX4Trans(b, fragmentRow<D>(tile, k0, n0, false));
}

/// The A operand of columns [16kk, 16kk + 16) of a 16-row block held as
/// accumulators (n-tiles 2kk and 2kk + 1), rounded to bf16.
__device__ void accumulatorsAsA(uint32_t (&a)[4], const float (&lo)[4],
                                const float (&hi)[4]) {
  a[0] = packBf16(lo[0], lo[1]);
  a[1] = packBf16(lo[2], lo[3]);
  a[2] = packBf16(hi[0], hi[1]);
  a[3] = packBf16(hi[2], hi[3]);
}

/// acc[N][4] (16 rows x 8N columns) += rows [r0, r0 + 16) of `lhs` times
/// rows [n0, n0 + 8N) of `rhs` transposed, over the D columns of both.
template <int D, int N>
__device__ void rowsTimesRowsT(float (&acc)[N][4], const Bf16 *lhs, int r0,
                               const Bf16 *rhs, int n0) {
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    loadA<D>(a, lhs, r0, kk * 16);
    for (int n = 0; n < N; n += 2) {
      uint32_t b[4];
      loadBTransposed<D>(b, rhs, n0 + n * 8, kk * 16);
      mmaBf16(acc[n], a, b[0], b[1]);
      mmaBf16(acc[n + 1], a, b[2], b[3]);
    }
  }
}

/// acc[D/8][4] (16 rows x D) += p (16 rows x 16·K, as accumulators [2K][4])
/// times rows [k0, k0 + 16·K) of `tile`.
template <int D, int K>
__device__ void accumulateTimesTile(float (&acc)[D / 8][4],
                                    const float (&p)[2 * K][4],
                                    const Bf16 *tile, int k0) {
  for (int kk = 0; kk < K; ++kk) {
    uint32_t a[4];
    accumulatorsAsA(a, p[2 * kk], p[2 * kk + 1]);
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t b[4];
      loadB<D>(b, tile, k0 + kk * 16, n * 8);
      mmaBf16(acc[n], a, b[0], b[1]);
      mmaBf16(acc[n + 1], a, b[2], b[3]);
    }
  }
}

/// Writes `scale`·acc (16 rows from `row0` of the warp, D columns) as bf16
/// into rows below t of dst [t][D].
template <int D>
__device__ void storeRows(Bf16 *dst, const float (&acc)[D / 8][4], int row0,
                          int t, float scale0, float scale1) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + g + 8 * h;
    if (row >= t)
      continue;
    const float s = h ? scale1 : scale0;
    for (int n = 0; n < D / 8; ++n) {
      const uint32_t v = packBf16(acc[n][2 * h] * s, acc[n][2 * h + 1] * s);
      *reinterpret_cast<uint32_t *>(dst + row * D + n * 8 + 2 * c) = v;
    }
  }
}

/// The key tiles' double buffering, at step jt of 0..last: starts copying
/// key and value tile jt + 1 (when there is one) into the buffer step jt - 1
/// used, then waits for this thread's copies of tile jt. A barrier must
/// follow before the tile is read.
template <int D>
__device__ void nextKeyValueTile(Bf16 *ks, Bf16 *vs, const Bf16 *k,
                                 const Bf16 *v, int jt, int last, int t) {
  if (jt < last) {
    const int other = (1 - jt % 2) * kTileElems<D>;
    loadTile<D>(ks + other, k, (jt + 1) * kRows, t);
    loadTile<D>(vs + other, v, (jt + 1) * kRows, t);
    cpAsyncCommit();
    cpAsyncWait<1>();
  } else {
    cpAsyncWait<0>();
  }
}

/// The sum over the 4 lanes of a quad (the lanes holding one row).
__device__ float quadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ float quadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

/// The forward: block (problem, 64-query tile), heaviest tile first; key
/// tiles up to the diagonal, double-buffered.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flashForwardKernel(Bf16 *out, float *lse, const Bf16 *q, const Bf16 *k,
                       const Bf16 *v, int t, float scaleLog2) {
  FASTLLM_DYNAMIC_SHARED(unsigned char, raw, 128);
  constexpr int tile = kTileElems<D>;
  Bf16 *qs = reinterpret_cast<Bf16 *>(raw);
  Bf16 *ks = qs + tile; // two tiles
  Bf16 *vs = ks + 2 * tile;
  const int tiles = (t + kRows - 1) / kRows;
  const int64_t problem = blockIdx.x / tiles;
  const int i0 = (tiles - 1 - int(blockIdx.x % tiles)) * kRows;
  q += problem * t * D;
  k += problem * t * D;
  v += problem * t * D;
  out += problem * t * D;
  lse += problem * t;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4, r0 = warp * 16;

  loadTile<D>(qs, q, i0, t);
  loadTile<D>(ks, k, 0, t);
  loadTile<D>(vs, v, 0, t);
  cpAsyncCommit();
  float o[D / 8][4] = {};
  float rowMax[2] = {-INFINITY, -INFINITY}, rowSum[2] = {0.f, 0.f};
  const int last = i0 / kRows; // the diagonal key tile
  for (int jt = 0; jt <= last; ++jt) {
    const int buf = jt % 2;
    nextKeyValueTile<D>(ks, vs, k, v, jt, last, t);
    __syncthreads(); // every thread's copies of this tile are in
    float s[8][4] = {};
    rowsTimesRowsT<D>(s, qs, r0, ks + buf * tile, 0);
    float tileMax[2] = {-INFINITY, -INFINITY};
    for (int n = 0; n < 8; ++n)
      for (int e = 0; e < 4; ++e) {
        const int row = i0 + r0 + g + 8 * (e / 2);
        const int key = jt * kRows + n * 8 + 2 * c + e % 2;
        const float x = key <= row ? s[n][e] * scaleLog2 : -INFINITY;
        s[n][e] = x;
        tileMax[e / 2] = fmaxf(tileMax[e / 2], x);
      }
    float rescale[2];
    for (int h = 0; h < 2; ++h) {
      // Every row sees key 0 of the first tile: the maximum is finite.
      const float m = fmaxf(rowMax[h], quadMax(tileMax[h]));
      rescale[h] = fastExp2(rowMax[h] - m); // 0 for the first tile
      rowMax[h] = m;
      rowSum[h] *= rescale[h];
    }
    for (int n = 0; n < 8; ++n)
      for (int e = 0; e < 4; ++e) {
        const float p = fastExp2(s[n][e] - rowMax[e / 2]); // masked: 0
        s[n][e] = p;
        rowSum[e / 2] += p; // this lane's columns; the quad's sum at the end
      }
    for (int n = 0; n < D / 8; ++n)
      for (int e = 0; e < 4; ++e)
        o[n][e] *= rescale[e / 2];
    accumulateTimesTile<D, 4>(o, s, vs + buf * tile, 0);
    __syncthreads(); // done with `buf` before the next step refills it
  }
  float inv[2];
  for (int h = 0; h < 2; ++h) {
    rowSum[h] = quadSum(rowSum[h]);
    inv[h] = 1.f / rowSum[h];
    const int row = i0 + r0 + g + 8 * h;
    if (c == 0 && row < t)
      lse[row] = (rowMax[h] + log2f(rowSum[h])) * kLn2;
  }
  storeRows<D>(out, o, i0 + r0, t, inv[0], inv[1]);
}

/// D_i = Σ_c dO[i][c]·O[i][c] for each of `rows` rows, one thread per row.
template <int D>
__global__ void flashRowDotKernel(float *dsum, const Bf16 *out,
                                  const Bf16 *dout, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows)
    return;
  const uint4 *o = reinterpret_cast<const uint4 *>(out + row * D);
  const uint4 *d = reinterpret_cast<const uint4 *>(dout + row * D);
  float sum = 0.f;
  for (int x = 0; x < D / 8; ++x) {
    const uint4 ov = o[x], dv = d[x];
    const __nv_bfloat162 *op = reinterpret_cast<const __nv_bfloat162 *>(&ov);
    const __nv_bfloat162 *dp = reinterpret_cast<const __nv_bfloat162 *>(&dv);
    for (int e = 0; e < 4; ++e) {
      const float2 of = __bfloat1622float2(op[e]),
                   df = __bfloat1622float2(dp[e]);
      sum += of.x * df.x + of.y * df.y;
    }
  }
  dsum[row] = sum;
}

/// dK and dV: block (problem, 64-key tile), heaviest first; query tiles
/// from the diagonal on, double-buffered with their lse and D. Each warp
/// owns 16 keys: Sᵀ = K_w·Qᵀ, dPᵀ = V_w·dOᵀ, then dV_w += Pᵀ·dO and
/// dK_w += dSᵀ·Q, in chunks of Q queries (fewer registers for d = 128).
template <int D>
__global__ void __launch_bounds__(kThreads)
    flashKeyValueGradKernel(Bf16 *dK, Bf16 *dV, const Bf16 *q, const Bf16 *k,
                            const Bf16 *v, const float *lse, const float *dsum,
                            const Bf16 *dout, int t, float scale,
                            float scaleLog2) {
  constexpr int Q = D <= 64 ? 64 : 32;
  FASTLLM_DYNAMIC_SHARED(unsigned char, raw, 128);
  constexpr int tile = kTileElems<D>;
  Bf16 *ks = reinterpret_cast<Bf16 *>(raw);
  Bf16 *vs = ks + tile;
  Bf16 *qs = vs + tile;                                    // two tiles
  Bf16 *dos = qs + 2 * tile;                               // two tiles
  float *lses = reinterpret_cast<float *>(dos + 2 * tile); // [2][64]
  float *dsums = lses + 2 * kRows;                         // [2][64]
  const int tiles = (t + kRows - 1) / kRows;
  const int64_t problem = blockIdx.x / tiles;
  const int j0 = int(blockIdx.x % tiles) * kRows;
  q += problem * t * D;
  k += problem * t * D;
  v += problem * t * D;
  dout += problem * t * D;
  lse += problem * t;
  dsum += problem * t;
  dK += problem * t * D;
  dV += problem * t * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4, r0 = warp * 16;
  // The statistics of query tile i0 into buffer `buf`: lse in base 2
  // (+inf past t: P = 0 there), D (0 past t).
  auto loadStats = [&](int buf, int i0) {
    for (int r = threadIdx.x; r < kRows; r += kThreads) {
      const int i = i0 + r;
      lses[buf * kRows + r] = i < t ? lse[i] * kLog2e : INFINITY;
      dsums[buf * kRows + r] = i < t ? dsum[i] : 0.f;
    }
  };

  loadTile<D>(ks, k, j0, t);
  loadTile<D>(vs, v, j0, t);
  loadTile<D>(qs, q, j0, t);
  loadTile<D>(dos, dout, j0, t);
  cpAsyncCommit();
  loadStats(0, j0);
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  const int steps = (t - j0 + kRows - 1) / kRows;
  for (int it = 0; it < steps; ++it) {
    const int buf = it % 2, i0 = j0 + it * kRows;
    if (it + 1 < steps) {
      loadTile<D>(qs + (1 - buf) * tile, q, i0 + kRows, t);
      loadTile<D>(dos + (1 - buf) * tile, dout, i0 + kRows, t);
      cpAsyncCommit();
      loadStats(1 - buf, i0 + kRows);
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads(); // this tile's copies and statistics are in
    const Bf16 *qt = qs + buf * tile, *dot = dos + buf * tile;
    const float *ls = lses + buf * kRows, *ds = dsums + buf * kRows;
    for (int c0 = 0; c0 < kRows; c0 += Q) {
      float p[Q / 8][4] = {}, dp[Q / 8][4] = {};
      rowsTimesRowsT<D>(p, ks, r0, qt, c0);
      rowsTimesRowsT<D>(dp, vs, r0, dot, c0);
      for (int n = 0; n < Q / 8; ++n)
        for (int e = 0; e < 4; ++e) {
          const int key = j0 + r0 + g + 8 * (e / 2);
          const int col = c0 + n * 8 + 2 * c + e % 2; // query i0 + col
          const float prob =
              i0 + col >= key ? fastExp2(p[n][e] * scaleLog2 - ls[col]) : 0.f;
          p[n][e] = prob;
          dp[n][e] = prob * (dp[n][e] - ds[col]);
        }
      accumulateTimesTile<D, Q / 16>(dv, p, dot, c0);
      accumulateTimesTile<D, Q / 16>(dk, dp, qt, c0);
    }
    __syncthreads(); // done with `buf` before the next step refills it
  }
  storeRows<D>(dK, dk, j0 + r0, t, scale, scale);
  storeRows<D>(dV, dv, j0 + r0, t, 1.f, 1.f);
}

/// dQ: block (problem, 64-query tile), heaviest first; key tiles up to the
/// diagonal, double-buffered. S = Q_w·Kᵀ, dP = dO_w·Vᵀ, dQ_w += dS·K. D
/// of the block's rows is computed here (the dQ buffer held it for the
/// dK/dV kernel, and this kernel overwrites it).
template <int D>
__global__ void __launch_bounds__(kThreads)
    flashQueryGradKernel(Bf16 *dQ, const Bf16 *q, const Bf16 *k, const Bf16 *v,
                         const Bf16 *out, const float *lse, const Bf16 *dout,
                         int t, float scale, float scaleLog2) {
  FASTLLM_DYNAMIC_SHARED(unsigned char, raw, 128);
  constexpr int tile = kTileElems<D>;
  Bf16 *qs = reinterpret_cast<Bf16 *>(raw);
  Bf16 *dos = qs + tile;
  Bf16 *ks = dos + tile; // two tiles
  Bf16 *vs = ks + 2 * tile;
  float *rowDots = reinterpret_cast<float *>(vs + 2 * tile); // [64]
  const int tiles = (t + kRows - 1) / kRows;
  const int64_t problem = blockIdx.x / tiles;
  const int i0 = (tiles - 1 - int(blockIdx.x % tiles)) * kRows;
  q += problem * t * D;
  k += problem * t * D;
  v += problem * t * D;
  out += problem * t * D;
  dout += problem * t * D;
  lse += problem * t;
  dQ += problem * t * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4, r0 = warp * 16;

  loadTile<D>(qs, q, i0, t);
  loadTile<D>(dos, dout, i0, t);
  loadTile<D>(ks, k, 0, t);
  loadTile<D>(vs, v, 0, t);
  cpAsyncCommit();
  // D of the tile's rows: two threads per row, half the columns each.
  {
    const int r = threadIdx.x / 2, half = threadIdx.x % 2;
    const int i = i0 + r;
    float sum = 0.f;
    if (i < t)
      for (int x = half * D / 2; x < (half + 1) * D / 2; ++x)
        sum += __bfloat162float(out[i * D + x]) *
               __bfloat162float(dout[i * D + x]);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    if (half == 0)
      rowDots[r] = sum;
  }
  float lse2[2], rowDot[2];
  for (int h = 0; h < 2; ++h) {
    const int row = i0 + r0 + g + 8 * h;
    lse2[h] = row < t ? lse[row] * kLog2e : INFINITY;
  }
  float dq[D / 8][4] = {};
  const int last = i0 / kRows;
  for (int jt = 0; jt <= last; ++jt) {
    const int buf = jt % 2;
    nextKeyValueTile<D>(ks, vs, k, v, jt, last, t);
    __syncthreads(); // this tile's copies (and rowDots) are in
    if (jt == 0)
      for (int h = 0; h < 2; ++h)
        rowDot[h] = rowDots[r0 + g + 8 * h];
    const Bf16 *kt = ks + buf * tile;
    float s[8][4] = {}, dp[8][4] = {};
    rowsTimesRowsT<D>(s, qs, r0, kt, 0);
    rowsTimesRowsT<D>(dp, dos, r0, vs + buf * tile, 0);
    for (int n = 0; n < 8; ++n)
      for (int e = 0; e < 4; ++e) {
        const int row = i0 + r0 + g + 8 * (e / 2);
        const int key = jt * kRows + n * 8 + 2 * c + e % 2;
        const float prob =
            key <= row ? fastExp2(s[n][e] * scaleLog2 - lse2[e / 2]) : 0.f;
        s[n][e] = prob * (dp[n][e] - rowDot[e / 2]); // dS
      }
    accumulateTimesTile<D, 4>(dq, s, kt, 0);
    __syncthreads(); // done with `buf` before the next step refills it
  }
  storeRows<D>(dQ, dq, i0 + r0, t, scale, scale);
}

/// Dynamic shared memory of the three tile kernels.
template <int D> size_t forwardBytes() {
  return size_t(5 * kTileElems<D>) * sizeof(Bf16);
}
template <int D> size_t keyValueGradBytes() {
  return size_t(6 * kTileElems<D>) * sizeof(Bf16) + 4 * kRows * sizeof(float);
}
template <int D> size_t queryGradBytes() {
  return size_t(6 * kTileElems<D>) * sizeof(Bf16) + kRows * sizeof(float);
}

/// Whether [p, p + bytes) and [o, o + otherBytes) share a byte.
bool overlaps(const void *p, size_t bytes, const void *o, size_t otherBytes) {
  const auto a = reinterpret_cast<uintptr_t>(p),
             b = reinterpret_cast<uintptr_t>(o);
  return a < b + otherBytes && b < a + bytes;
}

/// Whether this attention runs here: d = dv one of the instantiated dims,
/// t·d within 32-bit indices, the blocks within a grid, every pointer
/// 16-byte aligned and the kernels' shared memory within the GPU's limit.
template <int D>
bool flashFits(int64_t batch, int64_t t,
               std::initializer_list<const void *> pointers, size_t bytes) {
  if (t * D > std::numeric_limits<int>::max() ||
      batch * ((t + kRows - 1) / kRows) > std::numeric_limits<int>::max())
    return false;
  return detail::aligned16(pointers) &&
         bytes <= size_t(detail::sharedMemoryLimit());
}

template <int D>
bool flashForward(Bf16 *out, float *lse, const Bf16 *q, const Bf16 *k,
                  const Bf16 *v, int64_t batch, int64_t t, float scale) {
  const size_t bytes = forwardBytes<D>();
  if (!flashFits<D>(batch, t, {out, q, k, v}, bytes))
    return false;
  detail::reserveSharedMemory(flashForwardKernel<D>, bytes, "causalAttention",
                              D, D);
  const unsigned blocks = unsigned(batch * ((t + kRows - 1) / kRows));
  FASTLLM_LAUNCH(blocks, kThreads, bytes, stream(), flashForwardKernel<D>)
  (out, lse, q, k, v, int(t), scale * kLog2e);
  checkLaunch();
  return true;
}

template <int D>
bool flashBackward(Bf16 *dQ, Bf16 *dK, Bf16 *dV, const Bf16 *q, const Bf16 *k,
                   const Bf16 *v, const Bf16 *out, const float *lse,
                   const Bf16 *dout, int64_t batch, int64_t t, float scale) {
  const size_t kvBytes = keyValueGradBytes<D>(), qBytes = queryGradBytes<D>();
  if (!flashFits<D>(batch, t, {dQ, dK, dV, q, k, v, out, dout},
                    kvBytes > qBytes ? kvBytes : qBytes))
    return false;
  // D goes through the dQ buffer: it must not be an input's memory.
  const size_t matrix = size_t(batch * t * D) * sizeof(Bf16);
  for (const void *in : {(const void *)q, (const void *)k, (const void *)v,
                         (const void *)out, (const void *)dout})
    if (overlaps(dQ, matrix, in, matrix))
      return false;
  if (overlaps(dQ, matrix, lse, size_t(batch * t) * sizeof(float)))
    return false;
  float *dsum = reinterpret_cast<float *>(dQ);
  const int64_t rows = batch * t;
  FASTLLM_LAUNCH(unsigned((rows + 255) / 256), 256, 0, stream(),
                 flashRowDotKernel<D>)
  (dsum, out, dout, rows);
  checkLaunch();
  const unsigned blocks = unsigned(batch * ((t + kRows - 1) / kRows));
  detail::reserveSharedMemory(flashKeyValueGradKernel<D>, kvBytes,
                              "causalAttentionGrad", D, D);
  FASTLLM_LAUNCH(blocks, kThreads, kvBytes, stream(),
                 flashKeyValueGradKernel<D>)
  (dK, dV, q, k, v, lse, dsum, dout, int(t), scale, scale * kLog2e);
  checkLaunch();
  detail::reserveSharedMemory(flashQueryGradKernel<D>, qBytes,
                              "causalAttentionGrad", D, D);
  FASTLLM_LAUNCH(blocks, kThreads, qBytes, stream(), flashQueryGradKernel<D>)
  (dQ, q, k, v, out, lse, dout, int(t), scale, scale * kLog2e);
  checkLaunch();
  return true;
}

} // namespace

bool detail::flashAttentionShape(int64_t d, int64_t dv) {
  return d == dv && (d == 16 || d == 32 || d == 64 || d == 128);
}

bool detail::flashAttention(Bf16 *out, float *lse, const Bf16 *q, const Bf16 *k,
                            const Bf16 *v, int64_t batch, int64_t t, int64_t d,
                            int64_t dv, float scale) {
  if (d != dv)
    return false;
  switch (d) {
  case 16:
    return flashForward<16>(out, lse, q, k, v, batch, t, scale);
  case 32:
    return flashForward<32>(out, lse, q, k, v, batch, t, scale);
  case 64:
    return flashForward<64>(out, lse, q, k, v, batch, t, scale);
  case 128:
    return flashForward<128>(out, lse, q, k, v, batch, t, scale);
  default:
    return false;
  }
}

bool detail::flashAttentionGrad(Bf16 *dQ, Bf16 *dK, Bf16 *dV, const Bf16 *q,
                                const Bf16 *k, const Bf16 *v, const Bf16 *out,
                                const float *lse, const Bf16 *dout,
                                int64_t batch, int64_t t, int64_t d, int64_t dv,
                                float scale) {
  if (d != dv)
    return false;
  switch (d) {
  case 16:
    return flashBackward<16>(dQ, dK, dV, q, k, v, out, lse, dout, batch, t,
                             scale);
  case 32:
    return flashBackward<32>(dQ, dK, dV, q, k, v, out, lse, dout, batch, t,
                             scale);
  case 64:
    return flashBackward<64>(dQ, dK, dV, q, k, v, out, lse, dout, batch, t,
                             scale);
  case 128:
    return flashBackward<128>(dQ, dK, dV, q, k, v, out, lse, dout, batch, t,
                              scale);
  default:
    return false;
  }
}

} // namespace fastllm::rt::cuda
