//===- CublasLt.cpp - cuBLASLt matmul interpreter of the CUDA emulation ---===//
//
// The part of cuBLASLt that runtime/cuda/kernels/Matmul.cu uses, interpreted
// on the host: handle, matmul descriptor, matrix layouts, heuristic
// preference, the heuristic itself and cublasLtMatmul, which enqueues the GEMM
// D = alpha * op(A) * op(B) + beta * C on its stream (Stream.h). Every
// definition matches its declaration in the toolkit's cublasLt.h.
//
// Interpreted, and nothing else:
//  - matmul descriptor: compute type CUBLAS_COMPUTE_32F, scale type
//    CUDA_R_32F, pointer mode HOST (alpha and beta are host floats read at
//    call time), TRANSA and TRANSB (CUBLAS_OP_N, CUBLAS_OP_T, and CUBLAS_OP_C,
//    which on the real types below is CUBLAS_OP_T as in cuBLAS), and the
//    default values of TRANSC (N), FILL_MODE (FULL) and EPILOGUE (DEFAULT);
//  - matrix layouts: types CUDA_R_32F and CUDA_R_16BF, column-major order,
//    rows, cols, ld, BATCH_COUNT (int32_t), STRIDED_BATCH_OFFSET (int64_t,
//    >= 0; 0 broadcasts one matrix to the whole batch), the default (strided)
//    batch mode and no plane offset;
//  - preference: search mode BEST_FIT, MAX_WORKSPACE_BYTES and the four
//    MIN_ALIGNMENT_*_BYTES (powers of two);
//  - operand types (A, B, C, D): all CUDA_R_32F, or CUDA_R_16BF A and B with
//    C and D both CUDA_R_16BF or both CUDA_R_32F.
//
// What the emulation cannot interpret is an error, never ignored, with the
// status the real library documents or gives: CUBLAS_STATUS_INVALID_VALUE for a
// null argument, a sizeInBytes that is not the size of the attribute's type (as
// cublasLt.h documents it), a value outside its enum (an attribute the
// header does not declare included), or inconsistent operands (shapes, batch
// counts, ld < rows, C == D with another layout than D, an algorithm made
// for other types); CUBLAS_STATUS_NOT_SUPPORTED for a declared attribute or
// value the emulation does not implement (epilogues, scale pointers, device
// pointer mode, other orders and types, ...), and for an operand pointer less
// aligned than the algorithm was chosen for: the heuristic takes the
// preference's MIN_ALIGNMENT_* (default 256 bytes) as a promise, and the real
// library answers a broken promise with CUBLAS_STATUS_NOT_SUPPORTED from
// cublasLtMatmul (pytorch/pytorch#92201, #97205).
//
// Misuses the real library does not report but that a GPU leaves undefined
// or faults on end the process through fatal(): a handle or descriptor that
// cublasLt*Create did not make (or that was destroyed), a null operand that
// would be read or written, D overlapping A, B, a distinct C or another batch
// of itself.
//
// Numerics, a model of a GPU's fp32 GEMM: every element of op(A) * op(B) is
// one fp32 accumulator updated with a fused multiply-add per k, in k order
// (bf16 inputs are widened exactly, so their products are exact); then
// t = alpha * acc, and t = fma(beta, C, t) unless beta is 0, where C is not
// read (it may hold NaN); t is stored as fp32 or rounded once to bf16
// (round to nearest even). alpha == 0 does not skip A and B: NaN and Inf in
// them propagate, as through a kernel that scales its accumulators. Results
// are bit-identical whatever the blocking and whether the AVX2/FMA kernel
// or the portable one runs, and do not depend on -ffp-contract. They do not
// match cuBLAS bit for bit (its kernels sum k in tiles, maybe split-k); the
// sequential order has the largest error bound (about k ulps) of those, so
// the model is a conservative one for tolerances. No workspace is used: the
// heuristic returns one algorithm needing 0 bytes.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/emu/Stream.h"

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FASTLLM_EMU_LT_X86 1
#endif

using fastllm::emu::fatal;

/// The handle's state: cublasLt.h leaves `struct cublasLtContext` incomplete,
/// for the library to define. Nothing is kept in it but a mark of liveness.
struct cublasLtContext {
  uint32_t magic;
};

namespace {

//===----------------------------------------------------------------------===//
// Descriptor state
//===----------------------------------------------------------------------===//
//
// cublasLt.h makes every descriptor but the handle a pointer to a fixed-size
// "semi-opaque" struct that a caller may also allocate itself (for the
// cublasLt*Init functions, which the emulation does not define: the project
// does not call them), and cublasLtMatmulAlgo_t a value that may be copied
// and serialized. So each state is a trivially copyable struct stored
// in that storage, copied in and out with memcpy, and marked with a magic
// number that Destroy clears.

constexpr uint32_t kHandleMagic = 0x4c74480au;
constexpr uint32_t kLayoutMagic = 0x4c744c0au;
constexpr uint32_t kDescMagic = 0x4c74440au;
constexpr uint32_t kPrefMagic = 0x4c74500au;
constexpr uint32_t kAlgoMagic = 0x4c74410au;

/// A matrix layout: cublasLtMatrixLayoutOpaque_t's content.
struct LayoutState {
  uint32_t magic;
  int32_t type; // cudaDataType_t
  uint64_t rows;
  uint64_t cols;
  int64_t ld;
  int64_t stride; // STRIDED_BATCH_OFFSET, elements
  int32_t batch;  // BATCH_COUNT
  int32_t order;  // cublasLtOrder_t
};

/// A matmul descriptor: cublasLtMatmulDescOpaque_t's content.
struct DescState {
  uint32_t magic;
  int32_t computeType; // cublasComputeType_t
  int32_t scaleType;   // cudaDataType_t
  int32_t transA;      // cublasOperation_t
  int32_t transB;
};

enum Operand { kA, kB, kC, kD, kNumOperands };

/// A heuristic preference: cublasLtMatmulPreferenceOpaque_t's content.
struct PrefState {
  uint32_t magic;
  uint32_t align[kNumOperands]; // MIN_ALIGNMENT_*_BYTES
  uint64_t maxWorkspace;
};

/// An algorithm from the heuristic: cublasLtMatmulAlgo_t's content. It is
/// good for the types it was chosen for and pointers aligned as promised.
struct AlgoState {
  uint32_t magic;
  uint32_t align[kNumOperands];
  int32_t type[kNumOperands];
};

static_assert(sizeof(LayoutState) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(DescState) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(PrefState) <= sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(AlgoState) <= sizeof(cublasLtMatmulAlgo_t));

/// `T` stored at `p`.
template <typename T> T loadState(const void *p) {
  T state;
  std::memcpy(&state, p, sizeof state);
  return state;
}

/// Stores `state` at `p`.
template <typename T> void storeState(void *p, const T &state) {
  std::memcpy(p, &state, sizeof state);
}

/// Allocates a zeroed `Opaque` holding `state` into `*out`.
template <typename Opaque, typename T>
cublasStatus_t createState(Opaque **out, const T &state) {
  if (!out)
    return CUBLAS_STATUS_INVALID_VALUE;
  Opaque *opaque = new (std::nothrow) Opaque{};
  if (!opaque)
    return CUBLAS_STATUS_ALLOC_FAILED;
  storeState(opaque, state);
  *out = opaque;
  return CUBLAS_STATUS_SUCCESS;
}

/// Frees a descriptor of `T` state made by createState (null: nothing).
template <typename T, typename Opaque>
cublasStatus_t destroyState(Opaque *opaque, uint32_t magic, const char *what,
                            const char *caller) {
  if (!opaque)
    return CUBLAS_STATUS_SUCCESS;
  if (loadState<T>(opaque).magic != magic)
    fatal("%s: %p is not a live %s descriptor", caller,
          static_cast<void *>(opaque), what);
  T cleared{};
  storeState(opaque, cleared);
  delete opaque;
  return CUBLAS_STATUS_SUCCESS;
}

/// The state at non-null descriptor `opaque`, which must be live.
template <typename T, typename Opaque>
T liveState(const Opaque *opaque, uint32_t magic, const char *what,
            const char *caller) {
  T state = loadState<T>(opaque);
  if (state.magic != magic)
    fatal("%s: %p is not a %s descriptor made by its Create function (or it "
          "was destroyed)",
          caller, static_cast<const void *>(opaque), what);
  return state;
}

/// Checks a handle as cublasLt does: null is CUBLAS_STATUS_NOT_INITIALIZED.
cublasStatus_t checkHandle(cublasLtHandle_t handle, const char *caller) {
  if (!handle)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  if (handle->magic != kHandleMagic)
    fatal("%s: %p is not a handle made by cublasLtCreate (or it was "
          "destroyed)",
          caller, static_cast<void *>(handle));
  return CUBLAS_STATUS_SUCCESS;
}

/// Reads attribute value `out` from `buf`: CUBLAS_STATUS_INVALID_VALUE if
/// `buf` is null or `size` is not the size of the attribute's type.
template <typename T>
cublasStatus_t readAttribute(const void *buf, size_t size, T &out) {
  if (!buf || size != sizeof(T))
    return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&out, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

#define FASTLLM_LT_TRY(expr)                                                   \
  do {                                                                         \
    cublasStatus_t tryStatus_ = (expr);                                        \
    if (tryStatus_ != CUBLAS_STATUS_SUCCESS)                                   \
      return tryStatus_;                                                       \
  } while (0)

/// Whether the emulation computes with matrices of type `type`.
bool isSupportedType(int32_t type) {
  return type == CUDA_R_32F || type == CUDA_R_16BF;
}

/// Bytes of one element of a supported type.
size_t elementSize(int32_t type) { return type == CUDA_R_32F ? 4 : 2; }

/// Whether `x` is a power of two.
bool isPowerOfTwo(uint32_t x) { return x != 0 && (x & (x - 1)) == 0; }

/// Whether op `op` (from TRANSA/TRANSB) transposes: N no, T and C (= T on
/// real types) yes.
bool transposes(int32_t op) { return op != CUBLAS_OP_N; }

//===----------------------------------------------------------------------===//
// Problem planning
//===----------------------------------------------------------------------===//

/// One operand of a planned GEMM, as stored (before op).
struct Matrix {
  const void *data;
  int32_t type;
  int64_t rows, cols, ld, stride;
};

/// A GEMM checked for cublasLtMatmul or the heuristic: D (m x n) =
/// alpha * op(A) (m x k) * op(B) (k x n) + beta * C, `batch` times.
struct Gemm {
  int64_t m, n, k, batch;
  bool transA, transB;
  Matrix op[kNumOperands];
};

/// Largest allowed rows, cols and k: cublasLt.h says only int32_t values are
/// usually supported.
constexpr uint64_t kMaxDim = uint64_t(std::numeric_limits<int32_t>::max());

/// Elements spanned by layout `l` over its whole batch (0 if empty), or -1 on
/// overflow of int64_t.
int64_t extentOf(const Matrix &l, int64_t batch) {
  if (l.rows == 0 || l.cols == 0)
    return 0;
  int64_t cols, batches, extent;
  if (__builtin_mul_overflow(l.cols - 1, l.ld, &cols) ||
      __builtin_mul_overflow(batch - 1, l.stride, &batches) ||
      __builtin_add_overflow(cols, batches, &extent) ||
      __builtin_add_overflow(extent, l.rows, &extent))
    return -1;
  return extent;
}

/// Checks the operation `desc` on layouts a..d and plans it into `g`, as the
/// heuristic and cublasLtMatmul both do.
cublasStatus_t planGemm(const DescState &desc, const LayoutState *const lay[],
                        Gemm &g) {
  // The descriptor setters admit nothing else; checked again so that a new
  // accepted value cannot slip through unimplemented.
  if (desc.computeType != CUBLAS_COMPUTE_32F || desc.scaleType != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  for (int i = 0; i < kNumOperands; ++i) {
    const LayoutState &l = *lay[i];
    if (!isSupportedType(l.type) || l.order != CUBLASLT_ORDER_COL)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l.rows > kMaxDim || l.cols > kMaxDim)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    // Column-major: columns may not overlap (cublasLt.h, LAYOUT_LD).
    if (l.ld < std::max<int64_t>(1, int64_t(l.rows)))
      return CUBLAS_STATUS_INVALID_VALUE;
    g.op[i] = Matrix{nullptr,         l.type, int64_t(l.rows),
                     int64_t(l.cols), l.ld,   l.stride};
  }
  const int32_t ta = lay[kA]->type, tb = lay[kB]->type;
  const int32_t tc = lay[kC]->type, td = lay[kD]->type;
  const bool allFloat = ta == CUDA_R_32F && tb == CUDA_R_32F &&
                        tc == CUDA_R_32F && td == CUDA_R_32F;
  const bool bf16In = ta == CUDA_R_16BF && tb == CUDA_R_16BF && tc == td;
  if (!allFloat && !bf16In)
    return CUBLAS_STATUS_NOT_SUPPORTED;

  g.transA = transposes(desc.transA);
  g.transB = transposes(desc.transB);
  const Matrix &a = g.op[kA], &b = g.op[kB], &c = g.op[kC], &d = g.op[kD];
  g.m = d.rows;
  g.n = d.cols;
  g.k = g.transA ? a.rows : a.cols;
  const int64_t aRows = g.transA ? a.cols : a.rows;
  const int64_t bRows = g.transB ? b.cols : b.rows;
  const int64_t bCols = g.transB ? b.rows : b.cols;
  if (aRows != g.m || bRows != g.k || bCols != g.n || c.rows != g.m ||
      c.cols != g.n)
    return CUBLAS_STATUS_INVALID_VALUE;
  g.batch = lay[kD]->batch;
  for (int i = 0; i < kNumOperands; ++i)
    if (lay[i]->batch != g.batch)
      return CUBLAS_STATUS_INVALID_VALUE;
  for (int i = 0; i < kNumOperands; ++i)
    if (extentOf(g.op[i], g.batch) < 0)
      return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

/// Loads the four layouts of a call (null: CUBLAS_STATUS_INVALID_VALUE).
cublasStatus_t loadLayouts(const cublasLtMatrixLayout_t in[], LayoutState out[],
                           const char *caller) {
  for (int i = 0; i < kNumOperands; ++i) {
    if (!in[i])
      return CUBLAS_STATUS_INVALID_VALUE;
    out[i] =
        liveState<LayoutState>(in[i], kLayoutMagic, "matrix layout", caller);
  }
  return CUBLAS_STATUS_SUCCESS;
}

//===----------------------------------------------------------------------===//
// Memory checks
//===----------------------------------------------------------------------===//

/// Bytes [begin, end) of memory.
struct Span {
  uintptr_t begin, end;
  bool overlaps(const Span &o) const { return begin < o.end && o.begin < end; }
};

/// The bytes from the first to the last element of the `batch` matrices of
/// `l`: a bound of what the GEMM touches (an operand inside another's
/// padding counts as overlapping).
Span spanOf(const Matrix &l, int64_t batch) {
  uintptr_t begin = reinterpret_cast<uintptr_t>(l.data);
  return {begin, begin + uintptr_t(extentOf(l, batch)) *
                             uintptr_t(elementSize(l.type))};
}

/// Whether the `batch` matrices of `d` are disjoint: batches one after the
/// other, or interleaved within columns (stride >= rows and the whole batch
/// of a column within ld). Other layouts are taken as overlapping.
bool batchesDisjoint(const Matrix &d, int64_t batch) {
  if (batch <= 1 || d.rows == 0 || d.cols == 0)
    return true;
  const int64_t one = extentOf(d, 1);
  if (d.stride >= one)
    return true;
  return d.stride >= d.rows && (batch - 1) * d.stride + d.rows <= d.ld;
}

/// Checks what cublasLtMatmul's pointers do to memory; a GPU would fault or
/// race on each of these, so they are fatal. `readC`: beta != 0.
void checkMemory(const Gemm &g, bool readC) {
  if (g.m == 0 || g.n == 0)
    return;
  const Matrix &a = g.op[kA], &b = g.op[kB], &c = g.op[kC], &d = g.op[kD];
  if (!d.data)
    fatal("cublasLtMatmul: D is null");
  if (g.k > 0 && (!a.data || !b.data))
    fatal("cublasLtMatmul: %s is null and read (k = %lld)", a.data ? "B" : "A",
          (long long)g.k);
  if (readC && !c.data)
    fatal("cublasLtMatmul: C is null and read (beta != 0)");
  if (!batchesDisjoint(d, g.batch))
    fatal("cublasLtMatmul: the %lld batches of D overlap (rows %lld, cols "
          "%lld, ld %lld, stride %lld): they would race on a GPU",
          (long long)g.batch, (long long)d.rows, (long long)d.cols,
          (long long)d.ld, (long long)d.stride);
  const Span out = spanOf(d, g.batch);
  if (g.k > 0 && spanOf(a, g.batch).overlaps(out))
    fatal("cublasLtMatmul: D overlaps A: A would be read while D is written");
  if (g.k > 0 && spanOf(b, g.batch).overlaps(out))
    fatal("cublasLtMatmul: D overlaps B: B would be read while D is written");
  if (readC && c.data != d.data && spanOf(c, g.batch).overlaps(out))
    fatal("cublasLtMatmul: C and D differ but overlap: C would be read while "
          "D is written");
}

//===----------------------------------------------------------------------===//
// GEMM
//===----------------------------------------------------------------------===//
//
// Blocked as a GPU GEMM is tiled: D is cut into kMR x kNR tiles, each computed
// from packed panels of op(A) (kMR rows by k, fp32) and op(B) (k by kNR
// columns, fp32) by a micro-kernel holding the tile's accumulators, which go
// through all of k in order. op(B) is packed kNC columns at a time.

constexpr int64_t kMR = 16;
constexpr int64_t kNR = 4;
constexpr int64_t kNC = 128;

float toFloat(float x) { return x; }
float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

/// Stores `x` as T, rounding once (to nearest even) for bf16.
void store(float *p, float x) { *p = x; }
void store(__nv_bfloat16 *p, float x) { *p = __float2bfloat16(x); }

/// Packs rows [i0, i0 + kMR) of op(A) (zeros past m) into panel[p * kMR + r].
template <typename T>
void packA(float *panel, const T *a, int64_t lda, bool trans, int64_t i0,
           int64_t m, int64_t k) {
  const int64_t rows = std::min(kMR, m - i0);
  if (!trans) {
    for (int64_t p = 0; p < k; ++p) {
      const T *col = a + p * lda + i0;
      float *out = panel + p * kMR;
      for (int64_t r = 0; r < rows; ++r)
        out[r] = toFloat(col[r]);
      for (int64_t r = rows; r < kMR; ++r)
        out[r] = 0.f;
    }
    return;
  }
  for (int64_t r = 0; r < kMR; ++r) {
    if (r >= rows) {
      for (int64_t p = 0; p < k; ++p)
        panel[p * kMR + r] = 0.f;
      continue;
    }
    const T *row = a + (i0 + r) * lda; // op(A)(i0 + r, p) = A(p, i0 + r)
    for (int64_t p = 0; p < k; ++p)
      panel[p * kMR + r] = toFloat(row[p]);
  }
}

/// Packs columns [j0, j0 + cols) of op(B) (zeros past n, up to a multiple of
/// kNR) into panels of kNR columns: out[(q * k + p) * kNR + c] holds
/// op(B)(p, j0 + q * kNR + c).
template <typename T>
void packB(float *out, const T *b, int64_t ldb, bool trans, int64_t j0,
           int64_t cols, int64_t k) {
  const int64_t panels = (cols + kNR - 1) / kNR;
  for (int64_t q = 0; q < panels; ++q) {
    float *panel = out + q * k * kNR;
    for (int64_t c = 0; c < kNR; ++c) {
      const int64_t j = j0 + q * kNR + c;
      if (q * kNR + c >= cols) {
        for (int64_t p = 0; p < k; ++p)
          panel[p * kNR + c] = 0.f;
      } else if (!trans) {
        const T *col = b + j * ldb;
        for (int64_t p = 0; p < k; ++p)
          panel[p * kNR + c] = toFloat(col[p]);
      } else {
        for (int64_t p = 0; p < k; ++p) // op(B)(p, j) = B(j, p)
          panel[p * kNR + c] = toFloat(b[p * ldb + j]);
      }
    }
  }
}

/// acc[c * kMR + r] = sum over p in order of a[p * kMR + r] * b[p * kNR + c],
/// one fma per step: the portable micro-kernel.
void microKernelPortable(int64_t k, const float *a, const float *b,
                         float *acc) {
  float sum[kNR][kMR] = {};
  for (int64_t p = 0; p < k; ++p) {
    const float *ap = a + p * kMR;
    for (int64_t c = 0; c < kNR; ++c) {
      const float bc = b[p * kNR + c];
      for (int64_t r = 0; r < kMR; ++r)
        sum[c][r] = std::fma(ap[r], bc, sum[c][r]);
    }
  }
  std::memcpy(acc, sum, sizeof sum);
}

#ifdef FASTLLM_EMU_LT_X86
/// microKernelPortable with AVX2 FMA: the same fmas, so the same bits.
__attribute__((target("avx2,fma"))) void
microKernelFma(int64_t k, const float *a, const float *b, float *acc) {
  static_assert(kMR == 16 && kNR == 4, "the kernel is written for 16 x 4");
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
  __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
  __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const __m256 a0 = _mm256_loadu_ps(a + p * kMR);
    const __m256 a1 = _mm256_loadu_ps(a + p * kMR + 8);
    const float *bp = b + p * kNR;
    __m256 bc = _mm256_broadcast_ss(bp);
    c00 = _mm256_fmadd_ps(a0, bc, c00);
    c01 = _mm256_fmadd_ps(a1, bc, c01);
    bc = _mm256_broadcast_ss(bp + 1);
    c10 = _mm256_fmadd_ps(a0, bc, c10);
    c11 = _mm256_fmadd_ps(a1, bc, c11);
    bc = _mm256_broadcast_ss(bp + 2);
    c20 = _mm256_fmadd_ps(a0, bc, c20);
    c21 = _mm256_fmadd_ps(a1, bc, c21);
    bc = _mm256_broadcast_ss(bp + 3);
    c30 = _mm256_fmadd_ps(a0, bc, c30);
    c31 = _mm256_fmadd_ps(a1, bc, c31);
  }
  _mm256_storeu_ps(acc + 0, c00);
  _mm256_storeu_ps(acc + 8, c01);
  _mm256_storeu_ps(acc + 16, c10);
  _mm256_storeu_ps(acc + 24, c11);
  _mm256_storeu_ps(acc + 32, c20);
  _mm256_storeu_ps(acc + 40, c21);
  _mm256_storeu_ps(acc + 48, c30);
  _mm256_storeu_ps(acc + 56, c31);
}
#endif

using MicroKernel = void (*)(int64_t, const float *, const float *, float *);

/// The fastest micro-kernel this CPU runs.
MicroKernel pickMicroKernel() {
#ifdef FASTLLM_EMU_LT_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return microKernelFma;
#endif
  return microKernelPortable;
}

/// The scalars and operands of one enqueued cublasLtMatmul.
struct Launch {
  Gemm g;
  float alpha, beta;
};

/// Runs launch `l` with A and B of type TIn and C and D of type TOut.
template <typename TIn, typename TOut> void runGemm(const Launch &l) {
  static const MicroKernel kernel = pickMicroKernel();
  const Gemm &g = l.g;
  if (g.m == 0 || g.n == 0)
    return;
  const Matrix &a = g.op[kA], &b = g.op[kB], &c = g.op[kC], &d = g.op[kD];
  const bool readC = l.beta != 0.f;
  const int64_t k = g.k;
  std::vector<float> aPanel(size_t(k * kMR));
  std::vector<float> bBlock(
      size_t(k * std::min(kNC, (g.n + kNR - 1) / kNR * kNR)));
  float acc[kNR * kMR];
  for (int64_t batch = 0; batch < g.batch; ++batch) {
    // A and B may be null when k is 0, C when it is not read.
    const TIn *ab =
        k > 0 ? static_cast<const TIn *>(a.data) + batch * a.stride : nullptr;
    const TIn *bb =
        k > 0 ? static_cast<const TIn *>(b.data) + batch * b.stride : nullptr;
    const TOut *cb =
        readC ? static_cast<const TOut *>(c.data) + batch * c.stride : nullptr;
    TOut *db =
        static_cast<TOut *>(const_cast<void *>(d.data)) + batch * d.stride;
    for (int64_t j0 = 0; j0 < g.n; j0 += kNC) {
      const int64_t cols = std::min(kNC, g.n - j0);
      if (k > 0)
        packB(bBlock.data(), bb, b.ld, g.transB, j0, cols, k);
      for (int64_t i0 = 0; i0 < g.m; i0 += kMR) {
        const int64_t rows = std::min(kMR, g.m - i0);
        if (k > 0)
          packA(aPanel.data(), ab, a.ld, g.transA, i0, g.m, k);
        for (int64_t q = 0; q * kNR < cols; ++q) {
          kernel(k, aPanel.data(), bBlock.data() + q * k * kNR, acc);
          const int64_t tileCols = std::min(kNR, cols - q * kNR);
          for (int64_t cc = 0; cc < tileCols; ++cc) {
            const int64_t j = j0 + q * kNR + cc;
            TOut *dcol = db + j * d.ld + i0;
            const TOut *ccol = readC ? cb + j * c.ld + i0 : nullptr;
            for (int64_t r = 0; r < rows; ++r) {
              float t = l.alpha * acc[cc * kMR + r];
              if (readC)
                t = std::fma(l.beta, toFloat(ccol[r]), t);
              store(dcol + r, t);
            }
          }
        }
      }
    }
  }
}

/// Runs launch `l` for its operand types (checked by planGemm).
void run(const Launch &l) {
  const bool bf16In = l.g.op[kA].type == CUDA_R_16BF;
  const bool bf16Out = l.g.op[kD].type == CUDA_R_16BF;
  if (!bf16In)
    runGemm<float, float>(l);
  else if (bf16Out)
    runGemm<__nv_bfloat16, __nv_bfloat16>(l);
  else
    runGemm<__nv_bfloat16, float>(l);
}

} // namespace

//===----------------------------------------------------------------------===//
// API
//===----------------------------------------------------------------------===//

extern "C" {

/// Creates a handle; it holds no state of its own.
cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t *lightHandle) {
  if (!lightHandle)
    return CUBLAS_STATUS_INVALID_VALUE;
  cublasLtContext *context = new (std::nothrow) cublasLtContext{kHandleMagic};
  if (!context)
    return CUBLAS_STATUS_ALLOC_FAILED;
  *lightHandle = context;
  return CUBLAS_STATUS_SUCCESS;
}

/// Destroys a handle made by cublasLtCreate.
cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  FASTLLM_LT_TRY(checkHandle(lightHandle, __func__));
  lightHandle->magic = 0;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

/// The enumerator's name of `status`.
const char *CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
  case CUBLAS_STATUS_SUCCESS:
    return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED:
    return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED:
    return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE:
    return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH:
    return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_MAPPING_ERROR:
    return "CUBLAS_STATUS_MAPPING_ERROR";
  case CUBLAS_STATUS_EXECUTION_FAILED:
    return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_INTERNAL_ERROR:
    return "CUBLAS_STATUS_INTERNAL_ERROR";
  case CUBLAS_STATUS_NOT_SUPPORTED:
    return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_LICENSE_ERROR:
    return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

/// A description of `status`, in our own words.
const char *CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
  case CUBLAS_STATUS_SUCCESS:
    return "success";
  case CUBLAS_STATUS_NOT_INITIALIZED:
    return "the library was not initialized (null handle)";
  case CUBLAS_STATUS_ALLOC_FAILED:
    return "resource allocation failed";
  case CUBLAS_STATUS_INVALID_VALUE:
    return "an invalid value or parameter was passed";
  case CUBLAS_STATUS_ARCH_MISMATCH:
    return "the device does not support the operation";
  case CUBLAS_STATUS_MAPPING_ERROR:
    return "access to device memory failed";
  case CUBLAS_STATUS_EXECUTION_FAILED:
    return "the device failed to execute the operation";
  case CUBLAS_STATUS_INTERNAL_ERROR:
    return "an internal operation failed";
  case CUBLAS_STATUS_NOT_SUPPORTED:
    return "the operation or configuration is not supported";
  case CUBLAS_STATUS_LICENSE_ERROR:
    return "license error";
  }
  return "unknown cuBLAS status";
}

//===--- Matrix layouts ---------------------------------------------------===//

/// Creates a column-major layout of `rows` x `cols` elements of `type`,
/// columns `ld` apart, batch of 1.
cublasStatus_t CUBLASWINAPI
cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                           uint64_t rows, uint64_t cols, int64_t ld) {
  if (!matLayout || ld < 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!isSupportedType(type))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  LayoutState state{kLayoutMagic,      int32_t(type), rows, cols, ld, 0, 1,
                    CUBLASLT_ORDER_COL};
  return createState(matLayout, state);
}

/// Destroys a layout made by cublasLtMatrixLayoutCreate.
cublasStatus_t CUBLASWINAPI
cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  return destroyState<LayoutState>(matLayout, kLayoutMagic, "matrix layout",
                                   __func__);
}

/// Sets one attribute of a layout; the value's type is the one cublasLt.h
/// documents for the attribute, and sizeInBytes must be its size.
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(
    cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
    const void *buf, size_t sizeInBytes) {
  if (!matLayout)
    return CUBLAS_STATUS_INVALID_VALUE;
  LayoutState s = liveState<LayoutState>(matLayout, kLayoutMagic,
                                         "matrix layout", __func__);
  switch (attr) {
  case CUBLASLT_MATRIX_LAYOUT_TYPE: {
    uint32_t type;
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, type));
    if (!isSupportedType(int32_t(type)))
      return CUBLAS_STATUS_NOT_SUPPORTED;
    s.type = int32_t(type);
    break;
  }
  case CUBLASLT_MATRIX_LAYOUT_ORDER: {
    int32_t order;
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, order));
    if (order < CUBLASLT_ORDER_COL || order > CUBLASLT_ORDER_COL32_2R_4R4)
      return CUBLAS_STATUS_INVALID_VALUE;
    if (order != CUBLASLT_ORDER_COL)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    s.order = order;
    break;
  }
  case CUBLASLT_MATRIX_LAYOUT_ROWS:
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, s.rows));
    break;
  case CUBLASLT_MATRIX_LAYOUT_COLS:
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, s.cols));
    break;
  case CUBLASLT_MATRIX_LAYOUT_LD: {
    int64_t ld;
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, ld));
    if (ld < 0)
      return CUBLAS_STATUS_INVALID_VALUE;
    s.ld = ld;
    break;
  }
  case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: {
    int32_t batch;
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, batch));
    if (batch < 1)
      return CUBLAS_STATUS_INVALID_VALUE;
    s.batch = batch;
    break;
  }
  case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: {
    int64_t stride;
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, stride));
    if (stride < 0)
      return CUBLAS_STATUS_NOT_SUPPORTED; // not modelled
    s.stride = stride;
    break;
  }
  case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: {
    int64_t offset;
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, offset));
    if (offset != 0)
      return CUBLAS_STATUS_NOT_SUPPORTED; // planar complex
    break;
  }
  case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: {
    uint32_t mode;
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, mode));
    if (mode == CUBLASLT_BATCH_MODE_POINTER_ARRAY)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    if (mode != CUBLASLT_BATCH_MODE_STRIDED)
      return CUBLAS_STATUS_INVALID_VALUE;
    break;
  }
  default:
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  storeState(matLayout, s);
  return CUBLAS_STATUS_SUCCESS;
}

//===--- Matmul descriptors -----------------------------------------------===//

/// Creates a matmul descriptor: only fp32 compute and scale are emulated.
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(
    cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
    cudaDataType_t scaleType) {
  if (!matmulDesc)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (computeType != CUBLAS_COMPUTE_32F || scaleType != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  DescState state{kDescMagic, int32_t(computeType), int32_t(scaleType),
                  CUBLAS_OP_N, CUBLAS_OP_N};
  return createState(matmulDesc, state);
}

/// Destroys a descriptor made by cublasLtMatmulDescCreate.
cublasStatus_t CUBLASWINAPI
cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  return destroyState<DescState>(matmulDesc, kDescMagic, "matmul", __func__);
}

/// Sets one attribute of a matmul descriptor (see the file comment for those
/// interpreted); sizeInBytes must be the size of the attribute's type.
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(
    cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
    const void *buf, size_t sizeInBytes) {
  if (!matmulDesc)
    return CUBLAS_STATUS_INVALID_VALUE;
  DescState s =
      liveState<DescState>(matmulDesc, kDescMagic, "matmul", __func__);
  int32_t value;
  switch (attr) {
  case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, value));
    if (value != CUBLAS_COMPUTE_32F)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    break;
  case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, value));
    if (value != CUDA_R_32F)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    break;
  case CUBLASLT_MATMUL_DESC_POINTER_MODE:
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, value));
    if (value < CUBLASLT_POINTER_MODE_HOST ||
        value > CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST)
      return CUBLAS_STATUS_INVALID_VALUE;
    if (value != CUBLASLT_POINTER_MODE_HOST)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    break;
  case CUBLASLT_MATMUL_DESC_TRANSA:
  case CUBLASLT_MATMUL_DESC_TRANSB:
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, value));
    if (value < CUBLAS_OP_N || value > CUBLAS_OP_CONJG)
      return CUBLAS_STATUS_INVALID_VALUE;
    if (value == CUBLAS_OP_CONJG)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    (attr == CUBLASLT_MATMUL_DESC_TRANSA ? s.transA : s.transB) = value;
    break;
  case CUBLASLT_MATMUL_DESC_TRANSC:
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, value));
    if (value < CUBLAS_OP_N || value > CUBLAS_OP_CONJG)
      return CUBLAS_STATUS_INVALID_VALUE;
    if (value != CUBLAS_OP_N) // cublasLt.h: only N is supported
      return CUBLAS_STATUS_NOT_SUPPORTED;
    break;
  case CUBLASLT_MATMUL_DESC_FILL_MODE:
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, value));
    if (value < CUBLAS_FILL_MODE_LOWER || value > CUBLAS_FILL_MODE_FULL)
      return CUBLAS_STATUS_INVALID_VALUE;
    if (value != CUBLAS_FILL_MODE_FULL)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE: {
    uint32_t epilogue;
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, epilogue));
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    break;
  }
  // Declared by cublasLt.h, not emulated: whatever the value, an error.
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
  case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
  case CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE:
  case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET:
  case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
  case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
  case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER:
  case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER:
  case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER:
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER:
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER:
  case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
  case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
  case CUBLASLT_MATMUL_DESC_A_SCALE_MODE:
  case CUBLASLT_MATMUL_DESC_B_SCALE_MODE:
  case CUBLASLT_MATMUL_DESC_C_SCALE_MODE:
  case CUBLASLT_MATMUL_DESC_D_SCALE_MODE:
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE:
  case CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER:
  case CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE:
  case CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR:
    return CUBLAS_STATUS_NOT_SUPPORTED;
  default:
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  storeState(matmulDesc, s);
  return CUBLAS_STATUS_SUCCESS;
}

//===--- Heuristic preferences --------------------------------------------===//

/// Creates a preference with cublasLt.h's defaults: no workspace, operands
/// aligned to 256 bytes.
cublasStatus_t CUBLASWINAPI
cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  PrefState state{kPrefMagic, {256, 256, 256, 256}, 0};
  return createState(pref, state);
}

/// Destroys a preference made by cublasLtMatmulPreferenceCreate.
cublasStatus_t CUBLASWINAPI
cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return destroyState<PrefState>(pref, kPrefMagic, "matmul preference",
                                 __func__);
}

/// Sets one attribute of a preference (search mode BEST_FIT, the maximum
/// workspace and the operands' alignments); sizeInBytes must be the size of
/// the attribute's type.
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
    const void *buf, size_t sizeInBytes) {
  if (!pref)
    return CUBLAS_STATUS_INVALID_VALUE;
  PrefState s =
      liveState<PrefState>(pref, kPrefMagic, "matmul preference", __func__);
  switch (attr) {
  case CUBLASLT_MATMUL_PREF_SEARCH_MODE: {
    uint32_t mode;
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, mode));
    if (mode > CUBLASLT_SEARCH_RESERVED_09)
      return CUBLAS_STATUS_INVALID_VALUE;
    if (mode != CUBLASLT_SEARCH_BEST_FIT)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    break;
  }
  case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, s.maxWorkspace));
    break;
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
    uint32_t align;
    FASTLLM_LT_TRY(readAttribute(buf, sizeInBytes, align));
    if (!isPowerOfTwo(align))
      return CUBLAS_STATUS_INVALID_VALUE;
    s.align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = align;
    break;
  }
  // Declared by cublasLt.h, not emulated: whatever the value, an error.
  case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
  case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
  case CUBLASLT_MATMUL_PREF_IMPL_MASK:
    return CUBLAS_STATUS_NOT_SUPPORTED;
  default:
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  storeState(pref, s);
  return CUBLAS_STATUS_SUCCESS;
}

//===--- Heuristic and matmul ---------------------------------------------===//

/// Checks the problem as cublasLtMatmul would and returns one algorithm
/// needing no workspace, good for operands aligned as `preference` promises.
/// With a promise below an operand's element size there is no algorithm:
/// *returnAlgoCount = 0 and CUBLAS_STATUS_NOT_SUPPORTED.
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
    cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
    cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
    int *returnAlgoCount) {
  FASTLLM_LT_TRY(checkHandle(lightHandle, __func__));
  if (!operationDesc || !preference || requestedAlgoCount <= 0 ||
      !heuristicResultsArray || !returnAlgoCount)
    return CUBLAS_STATUS_INVALID_VALUE;
  *returnAlgoCount = 0;
  const DescState desc =
      liveState<DescState>(operationDesc, kDescMagic, "matmul", __func__);
  const PrefState pref = liveState<PrefState>(preference, kPrefMagic,
                                              "matmul preference", __func__);
  const cublasLtMatrixLayout_t handles[] = {Adesc, Bdesc, Cdesc, Ddesc};
  LayoutState layouts[kNumOperands];
  FASTLLM_LT_TRY(loadLayouts(handles, layouts, __func__));
  const LayoutState *lay[] = {&layouts[0], &layouts[1], &layouts[2],
                              &layouts[3]};
  Gemm g;
  FASTLLM_LT_TRY(planGemm(desc, lay, g));

  AlgoState algo{};
  algo.magic = kAlgoMagic;
  for (int i = 0; i < kNumOperands; ++i) {
    if (pref.align[i] < elementSize(layouts[i].type))
      return CUBLAS_STATUS_NOT_SUPPORTED;
    algo.align[i] = pref.align[i];
    algo.type[i] = layouts[i].type;
  }
  cublasLtMatmulHeuristicResult_t &result = heuristicResultsArray[0];
  std::memset(&result, 0, sizeof result);
  storeState(&result.algo, algo);
  result.workspaceSize = 0;
  result.state = CUBLAS_STATUS_SUCCESS;
  result.wavesCount = 1.f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

/// D = alpha * op(A) * op(B) + beta * C, enqueued on `stream` after checking
/// everything (see the file comment). alpha and beta are host floats, read
/// now; with beta == 0, C is not read. `algo` null: the library picks one
/// for the pointers given. No workspace is used.
cublasStatus_t CUBLASWINAPI cublasLtMatmul(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
    const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
    const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
    const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
    cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
    void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  FASTLLM_LT_TRY(checkHandle(lightHandle, __func__));
  if (!computeDesc || !alpha || !beta)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (workspaceSizeInBytes > 0 && !workspace)
    return CUBLAS_STATUS_INVALID_VALUE;
  const DescState desc =
      liveState<DescState>(computeDesc, kDescMagic, "matmul", __func__);
  const cublasLtMatrixLayout_t handles[] = {Adesc, Bdesc, Cdesc, Ddesc};
  LayoutState layouts[kNumOperands];
  FASTLLM_LT_TRY(loadLayouts(handles, layouts, __func__));
  const LayoutState *lay[] = {&layouts[0], &layouts[1], &layouts[2],
                              &layouts[3]};
  Launch launch;
  Gemm &g = launch.g;
  FASTLLM_LT_TRY(planGemm(desc, lay, g));
  g.op[kA].data = A;
  g.op[kB].data = B;
  g.op[kC].data = C;
  g.op[kD].data = D;

  // In place (C == D) the real library wants the same layout for both;
  // out of place, C may have its own ld and stride.
  if (C == D) {
    const LayoutState &c = layouts[kC], &d = layouts[kD];
    if (c.type != d.type || c.ld != d.ld || c.stride != d.stride)
      return CUBLAS_STATUS_INVALID_VALUE;
  }

  // The algorithm: made for these types, and for pointers aligned as the
  // preference promised; without one, any element-aligned pointers.
  uint32_t align[kNumOperands];
  if (algo) {
    const AlgoState a = loadState<AlgoState>(algo);
    if (a.magic != kAlgoMagic)
      return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < kNumOperands; ++i) {
      if (a.type[i] != layouts[i].type)
        return CUBLAS_STATUS_INVALID_VALUE;
      align[i] = a.align[i];
    }
  } else {
    for (int i = 0; i < kNumOperands; ++i)
      align[i] = uint32_t(elementSize(layouts[i].type));
  }
  for (int i = 0; i < kNumOperands; ++i) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(g.op[i].data);
    if (address % align[i] != 0)
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }

  std::memcpy(&launch.alpha, alpha, sizeof(float));
  std::memcpy(&launch.beta, beta, sizeof(float));
  checkMemory(g, launch.beta != 0.f);
  if (g.m == 0 || g.n == 0)
    return CUBLAS_STATUS_SUCCESS;
  fastllm::emu::enqueue(stream, [launch] { run(launch); });
  return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
