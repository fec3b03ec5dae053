//===- Matmul.cpp - matmul and addMatmul on OpenBLAS ------------*- C++ -*-===//
//
// runtime/KernelApi.inc's matmul and addMatmul for the CPU library (float),
// and the setup of OpenBLAS that every GEMM of the library (attention's
// too) runs first. Each product is split into single-threaded GEMMs over
// bands of C whose number is a function of the shapes alone, shared among
// the OpenMP team.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/kernels/Common.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>

// OpenBLAS's kernel selection for DYNAMIC_ARCH builds; weak, so that another
// OpenBLAS build (or BLAS) still links. See configureBlas.
extern "C" {
__attribute__((weak)) void gotoblas_dynamic_init(void);
__attribute__((weak)) void gotoblas_dynamic_quit(void);
}

namespace fastllm::rt::cpu {

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
void detail::configureBlas() {
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

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

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
  int64_t batch = numElements(batchRank, batchShape);
  if (batch == 0 || m == 0 || n == 0)
    return;
  if (k == 0) {
    if (beta == 0.f)
      fill(c, batch * m * n, 0.f);
    return;
  }
  // The batch collapsed; a stack of A matrices times one shared B is a
  // single taller product.
  const ::fastllm::rt::detail::MatmulBatch plan =
      ::fastllm::rt::detail::planMatmulBatch(
          batchRank, batchShape, aBatchStrides, bBatchStrides, m, k, transA);
  m = plan.m;
  batch = numElements(plan.rank, plan.dims);
  const int rank = plan.rank;

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
    StridedWalk aWalk(rank, plan.dims, plan.strides[0]);
    StridedWalk bWalk(rank, plan.dims, plan.strides[1]);
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

template <typename T>
void matmul(T *c, const T *a, const T *b, int batchRank,
            const int64_t *batchShape, const int64_t *aBatchStrides,
            const int64_t *bBatchStrides, int64_t m, int64_t n, int64_t k,
            bool transA, bool transB) {
  gemm(c, a, b, batchRank, batchShape, aBatchStrides, bBatchStrides, m, n, k,
       transA, transB, 0.f);
}

template <typename T>
void addMatmul(float *acc, const T *a, const T *b, int batchRank,
               const int64_t *batchShape, const int64_t *aBatchStrides,
               const int64_t *bBatchStrides, int64_t m, int64_t n, int64_t k,
               bool transA, bool transB) {
  gemm(acc, a, b, batchRank, batchShape, aBatchStrides, bBatchStrides, m, n, k,
       transA, transB, 1.f);
}

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_FLOAT_TYPES(FASTLLM_INSTANTIATE_MATMUL)

} // namespace fastllm::rt::cpu
