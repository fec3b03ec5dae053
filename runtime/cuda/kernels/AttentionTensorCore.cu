//===- AttentionTensorCore.cu - attention on tensor cores -------*- C++ -*-===//
//
// The bf16 causal attention of Attention.cu on tensor cores, for head dims
// that are multiples of 16 (tensorCoreAttentionShape), 16-byte aligned
// pointers and a GPU with the shared memory the kernels need: 4 warps per
// 64 query rows, Q·Kᵀ and P·V as WMMA products with P rounded to bf16. The
// backward has the same two kernels as the scalar one over 64-row tiles, its
// products on WMMA with P and dS rounded to bf16.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/Attention.cuh"

#include <mma.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <type_traits>

namespace fastllm::rt::cuda {

namespace wmma = nvcuda::wmma;

//===----------------------------------------------------------------------===//
// Tensor-core attention (bf16, head dims multiples of 16)
//===----------------------------------------------------------------------===//
//
// The same algorithm as Attention.cu's scalar kernels with the products on
// tensor cores (WMMA, bf16 16x16x16 with fp32 accumulators): blocks of 4
// warps own 64 rows, 16 per warp; tiles are 64 rows. Scores, dP and the
// output, dQ, dK and dV accumulators stay fp32 in shared memory; P and dS are
// rounded to bf16 for the products that read them (as FlashAttention does),
// the softmax statistics use the unrounded P. Two lanes serve one row in the
// elementwise parts: of a 64-wide score row, 32 columns each (pairColumn);
// of an output row, the even or the odd columns (pairSlot).

namespace {

constexpr int kTcTile = 64;
constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;

using Bf16 = __nv_bfloat16;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::row_major>;
/// The transpose of a row-major [rows][ld] array read as matrix A.
using FragAT =
    wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::row_major>;
/// The transpose of a row-major [rows][ld] array read as matrix B.
using FragBT =
    wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::col_major>;
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
__device__ void tcLoadTile(Bf16 *dst, const Bf16 *src, int64_t first, int64_t t,
                           int64_t cols) {
  const int64_t vecs = cols / 8; // uint4 per row
  uint4 *out = reinterpret_cast<uint4 *>(dst);
  const uint4 *in = reinterpret_cast<const uint4 *>(src);
  for (int64_t e = threadIdx.x; e < kTcTile * vecs; e += blockDim.x) {
    const int64_t r = e / vecs, c = e - r * vecs;
    out[e] =
        first + r < t ? in[(first + r) * vecs + c] : make_uint4(0, 0, 0, 0);
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
                             const Bf16 *k, const Bf16 *v, int64_t t, int64_t d,
                             int64_t dv, float scale) {
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
                               const Bf16 *v, const Bf16 *out, const float *lse,
                               const Bf16 *dout, int64_t t, int64_t d,
                               int64_t dv, float scale) {
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
                                  const Bf16 *k, const Bf16 *v, const Bf16 *out,
                                  const float *lse, const Bf16 *dout, int64_t t,
                                  int64_t d, int64_t dv, float scale) {
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

/// Whether the bf16 attention runs on tensor cores: head dims multiples of
/// 16, the pointers 16-byte aligned (tiles move in 16-byte pieces) and the
/// three kernels' shared memory within the GPU's limit.
bool useTensorCores(int64_t d, int64_t dv,
                    std::initializer_list<const void *> pointers) {
  if (!detail::tensorCoreAttentionShape(d, dv) || !detail::aligned16(pointers))
    return false;
  const int limit = detail::sharedMemoryLimit();
  for (auto kernel : {detail::AttentionKernel::TcForward,
                      detail::AttentionKernel::TcQueryGrad,
                      detail::AttentionKernel::TcKeyValueGrad})
    if (detail::attentionSharedBytes(kernel, d, dv) > size_t(limit))
      return false;
  return true;
}

} // namespace

size_t detail::tensorCoreSharedBytes(AttentionKernel kernel, int64_t d,
                                     int64_t dv) {
  return size_t(TcShared(kernel, d, dv).total);
}

bool detail::tensorCoreAttentionShape(int64_t d, int64_t dv) {
  return d > 0 && dv > 0 && d % 16 == 0 && dv % 16 == 0;
}

bool detail::tensorCoreAttention(Bf16 *out, float *lse, const Bf16 *q,
                                 const Bf16 *k, const Bf16 *v, int64_t batch,
                                 int64_t t, int64_t d, int64_t dv,
                                 float scale) {
  if (!useTensorCores(d, dv, {out, q, k, v}))
    return false;
  const size_t bytes =
      detail::attentionSharedBytes(detail::AttentionKernel::TcForward, d, dv);
  reserveSharedMemory(attentionForwardTcKernel, bytes, "causalAttention", d,
                      dv);
  FASTLLM_LAUNCH(tcAttentionBlocks(batch, t), kTcThreads, bytes, stream(),
                 attentionForwardTcKernel)
  (out, lse, q, k, v, t, d, dv, scale);
  checkLaunch();
  return true;
}

bool detail::tensorCoreAttentionGrad(Bf16 *dQ, Bf16 *dK, Bf16 *dV,
                                     const Bf16 *q, const Bf16 *k,
                                     const Bf16 *v, const Bf16 *out,
                                     const float *lse, const Bf16 *dout,
                                     int64_t batch, int64_t t, int64_t d,
                                     int64_t dv, float scale) {
  if (!useTensorCores(d, dv, {dQ, dK, dV, q, k, v, out, dout}))
    return false;
  const unsigned blocks = tcAttentionBlocks(batch, t);
  const size_t kvBytes = detail::attentionSharedBytes(
      detail::AttentionKernel::TcKeyValueGrad, d, dv);
  reserveSharedMemory(attentionKeyValueGradTcKernel, kvBytes,
                      "causalAttentionGrad", d, dv);
  FASTLLM_LAUNCH(blocks, kTcThreads, kvBytes, stream(),
                 attentionKeyValueGradTcKernel)
  (dK, dV, q, k, v, out, lse, dout, t, d, dv, scale);
  checkLaunch();
  const size_t qBytes =
      detail::attentionSharedBytes(detail::AttentionKernel::TcQueryGrad, d, dv);
  reserveSharedMemory(attentionQueryGradTcKernel, qBytes, "causalAttentionGrad",
                      d, dv);
  FASTLLM_LAUNCH(blocks, kTcThreads, qBytes, stream(),
                 attentionQueryGradTcKernel)
  (dQ, q, k, v, out, lse, dout, t, d, dv, scale);
  checkLaunch();
  return true;
}

} // namespace fastllm::rt::cuda
