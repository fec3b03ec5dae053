//===- Mma.cuh - warp-level tensor-core and async-copy primitives -*- C++ -*-===//
//
// The PTX instructions that register-resident kernels (FlashAttention.cu)
// are built from, each with its emulation:
//
//  - mmaBf16: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, D += A·B
//    with A 16x16 and B 16x8 in bf16 and D 16x8 in fp32;
//  - ldmatrixX4 / ldmatrixX4Trans: ldmatrix.sync.aligned.m8n8.x4(.trans)
//    .shared.b16, four 8x8 bf16 matrices from shared memory into the
//    fragments mma.sync reads;
//  - cpAsync16, cpAsyncCommit, cpAsyncWait: cp.async.cg.shared.global of 16
//    bytes (zero-filled past the source's valid bytes), its groups.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), for lane
// L with g = L / 4 and c = L % 4, two bf16 per 32-bit register, the lower
// column (or row) in the low half:
//   A (16x16, row): a0 = A[g][2c..2c+1], a1 = A[g+8][2c..], a2 = A[g][2c+8..],
//                   a3 = A[g+8][2c+8..]
//   B (16x8, col):  b0 = B[2c..2c+1][g], b1 = B[2c+8..2c+9][g]
//   C, D (16x8):    d0, d1 = D[g][2c], D[g][2c+1]; d2, d3 = D[g+8][2c..]
// ldmatrix: lane L gives the address of row L % 8 of matrix L / 8 (8
// contiguous bf16, 16-byte aligned); register i of lane L receives matrix
// i's row g, elements 2c and 2c+1 (with .trans: its elements [2c][g] and
// [2c+1][g]).
//
// Under the emulation (FASTLLM_CUDA_EMULATION) each instruction is one warp
// collective (emu::warpCombine) that computes the same fragments on the
// host, products in fp32 added in k order, and cp.async copies at the wait
// that covers them. The layouts here are the contract both paths keep;
// CudaKernels.MmaFragmentsMatchTheHost checks them on a GPU.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CUDA_KERNELS_MMA_CUH
#define FASTLLM_RUNTIME_CUDA_KERNELS_MMA_CUH

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

namespace fastllm::rt::cuda::mma {

/// Two floats rounded to bf16 (to nearest even) in one register, `lo` in
/// the low half.
__device__ inline uint32_t packBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

#ifdef FASTLLM_CUDA_EMULATION

namespace detail {

inline float lowHalf(uint32_t r) {
  return __uint_as_float(r << 16);
}
inline float highHalf(uint32_t r) {
  return __uint_as_float(r & 0xffff0000u);
}

struct MmaOperands {
  float *d;
  uint32_t a[4], b[2];
};

inline void mmaCombine(void *const lanes[32]) {
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const auto *o = static_cast<const MmaOperands *>(lanes[l]);
    const int g = l / 4, c = l % 4;
    for (int half = 0; half < 2; ++half) {
      const int col = 2 * c + half;
      auto pick = [&](uint32_t r) { return half ? highHalf(r) : lowHalf(r); };
      A[g][col] = pick(o->a[0]);
      A[g + 8][col] = pick(o->a[1]);
      A[g][col + 8] = pick(o->a[2]);
      A[g + 8][col + 8] = pick(o->a[3]);
      B[col][g] = pick(o->b[0]);
      B[col + 8][g] = pick(o->b[1]);
      C[g][col] = o->d[half];
      C[g + 8][col] = o->d[2 + half];
    }
  }
  for (int l = 0; l < 32; ++l) {
    auto *o = static_cast<MmaOperands *>(lanes[l]);
    const int g = l / 4, c = l % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + (e / 2) * 8, col = 2 * c + e % 2;
      float sum = C[row][col];
      for (int k = 0; k < 16; ++k)
        sum += A[row][k] * B[k][col];
      o->d[e] = sum;
    }
  }
}

struct LdmatrixOperands {
  const void *row;
  uint32_t *out;
};

template <bool Trans> void ldmatrixCombine(void *const lanes[32]) {
  uint16_t m[4][8][8];
  for (int l = 0; l < 32; ++l) {
    const auto *o = static_cast<const LdmatrixOperands *>(lanes[l]);
    if (reinterpret_cast<uintptr_t>(o->row) % 16)
      ::fastllm::emu::deviceFatal(__FILE__, __LINE__,
                                  "ldmatrix: lane %d's row address %p is not "
                                  "16-byte aligned",
                                  l, o->row);
    std::memcpy(m[l / 8][l % 8], o->row, 16);
  }
  for (int l = 0; l < 32; ++l) {
    const auto *o = static_cast<const LdmatrixOperands *>(lanes[l]);
    const int g = l / 4, c = l % 4;
    for (int i = 0; i < 4; ++i) {
      const uint16_t lo = Trans ? m[i][2 * c][g] : m[i][g][2 * c];
      const uint16_t hi = Trans ? m[i][2 * c + 1][g] : m[i][g][2 * c + 1];
      o->out[i] = uint32_t(lo) | uint32_t(hi) << 16;
    }
  }
}

} // namespace detail

/// d += a·b (m16n8k16, bf16 operands, fp32 accumulators; b = {b0, b1});
/// the whole warp.
inline void mmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                    uint32_t b1) {
  detail::MmaOperands o{d, {a[0], a[1], a[2], a[3]}, {b0, b1}};
  ::fastllm::emu::warpCombine(detail::mmaCombine, 0, &o, __FILE__, __LINE__);
}

/// Four 8x8 bf16 matrices from shared memory; lane L names row L % 8 of
/// matrix L / 8.
inline void ldmatrixX4(uint32_t (&r)[4], const void *row) {
  detail::LdmatrixOperands o{row, r};
  ::fastllm::emu::warpCombine(detail::ldmatrixCombine<false>, 0, &o, __FILE__,
                              __LINE__);
}

/// ldmatrixX4 of the matrices' transposes.
inline void ldmatrixX4Trans(uint32_t (&r)[4], const void *row) {
  detail::LdmatrixOperands o{row, r};
  ::fastllm::emu::warpCombine(detail::ldmatrixCombine<true>, 1, &o, __FILE__,
                              __LINE__);
}

/// 16 bytes from global `src` to shared `dst` asynchronously; only the
/// first `srcBytes` (0 or 16) are read, the rest are zero.
inline void cpAsync16(void *dst, const void *src, int srcBytes) {
  ::fastllm::emu::asyncCopy(dst, src, 16, srcBytes);
}
inline void cpAsyncCommit() { ::fastllm::emu::asyncCommit(); }
template <int Pending> inline void cpAsyncWait() {
  ::fastllm::emu::asyncWait(Pending);
}

/// 2^x (ex2.approx on a GPU: -inf gives 0).
inline float fastExp2(float x) { return std::exp2(x); }

#else // nvcc

__device__ inline void mmaBf16(float (&d)[4], const uint32_t (&a)[4],
                               uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                 "r"(b1));
}

__device__ inline void ldmatrixX4(uint32_t (&r)[4], const void *row) {
  const unsigned address = unsigned(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
               "{%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ inline void ldmatrixX4Trans(uint32_t (&r)[4], const void *row) {
  const unsigned address = unsigned(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 "
               "{%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ inline void cpAsync16(void *dst, const void *src, int srcBytes) {
  const unsigned address = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address),
               "l"(src), "r"(srcBytes));
}

__device__ inline void cpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

template <int Pending> __device__ inline void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

__device__ inline float fastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

#endif

} // namespace fastllm::rt::cuda::mma

#endif // FASTLLM_RUNTIME_CUDA_KERNELS_MMA_CUH
