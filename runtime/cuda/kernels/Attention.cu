//===- Attention.cu - fused causal attention --------------------*- C++ -*-===//
//
// runtime/KernelApi.inc's causalAttention and causalAttentionGrad for the
// CUDA library, flash-attention style in fp32: q, k, v, out and their
// gradients in T = float or __nv_bfloat16, staged as floats in shared memory
// (lse in float), computed tile by tile (32 queries x 32 keys); tiles above
// the diagonal are never visited. Head dims are runtime values; the kernels
// abort with a message when d and dv need more shared memory than the GPU
// has: the backward takes d + dv up to about 600 on an H100, 420 on an A100.
//
// The forward runs a block of 8 warps per 32 query rows, each warp keeping a
// running max and sum (online softmax) for 4 rows while it walks the key
// tiles up to the diagonal. The backward runs one kernel with a block per 32
// key rows (dK, dV) walking the query tiles from the diagonal down, then one
// with a block per 32 query rows (dQ) walking the key tiles up to the
// diagonal; no atomics. bf16 with d = dv in {16, 32, 64, 128}
// (flashAttentionShape) runs in registers on tensor cores instead
// (FlashAttention.cu), other head dims multiples of 16
// (tensorCoreAttentionShape) on tensor cores through shared memory
// (AttentionTensorCore.cu).
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/Attention.cuh"

#include <limits>
#include <type_traits>

namespace fastllm::rt::cuda {

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
    return tensorCoreSharedBytes(kernel, d, dv);
  }
  return size_t(floats) * sizeof(float);
}

template <typename T>
void causalAttention(T *out, float *lse, const T *q, const T *k, const T *v,
                     int64_t batch, int64_t t, int64_t d, int64_t dv,
                     float scale) {
  if (batch == 0 || t == 0)
    return;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (detail::flashAttention(out, lse, q, k, v, batch, t, d, dv, scale) ||
        detail::tensorCoreAttention(out, lse, q, k, v, batch, t, d, dv, scale))
      return;
  }
  const size_t bytes =
      detail::attentionSharedBytes(detail::AttentionKernel::Forward, d, dv);
  detail::reserveSharedMemory(attentionForwardKernel<T>, bytes,
                              "causalAttention", d, dv);
  FASTLLM_LAUNCH(attentionBlocks(batch, t), kAttnThreads, bytes, stream(),
                 attentionForwardKernel<T>)
  (out, lse, q, k, v, t, d, dv, scale);
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
    if (detail::flashAttentionGrad(dQ, dK, dV, q, k, v, out, lse, dout, batch,
                                   t, d, dv, scale) ||
        detail::tensorCoreAttentionGrad(dQ, dK, dV, q, k, v, out, lse, dout,
                                        batch, t, d, dv, scale))
      return;
  }
  const unsigned blocks = attentionBlocks(batch, t);
  const size_t kvBytes = detail::attentionSharedBytes(
      detail::AttentionKernel::KeyValueGrad, d, dv);
  detail::reserveSharedMemory(attentionKeyValueGradKernel<T>, kvBytes,
                              "causalAttentionGrad", d, dv);
  FASTLLM_LAUNCH(blocks, kAttnThreads, kvBytes, stream(),
                 attentionKeyValueGradKernel<T>)
  (dK, dV, q, k, v, out, lse, dout, t, d, dv, scale);
  checkLaunch();
  const size_t qBytes =
      detail::attentionSharedBytes(detail::AttentionKernel::QueryGrad, d, dv);
  detail::reserveSharedMemory(attentionQueryGradKernel<T>, qBytes,
                              "causalAttentionGrad", d, dv);
  FASTLLM_LAUNCH(blocks, kAttnThreads, qBytes, stream(),
                 attentionQueryGradKernel<T>)
  (dQ, q, k, v, out, lse, dout, t, d, dv, scale);
  checkLaunch();
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_FLOAT_TYPES(FASTLLM_INSTANTIATE_ATTENTION)
FASTLLM_INSTANTIATE_ATTENTION(__nv_bfloat16)

} // namespace fastllm::rt::cuda
