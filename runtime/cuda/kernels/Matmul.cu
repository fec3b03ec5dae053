//===- Matmul.cu - matmul and addMatmul on cuBLASLt -------------*- C++ -*-===//
//
// runtime/KernelApi.inc's matmul and addMatmul for the CUDA library:
// cuBLASLt on one process-wide handle, enqueued on stream(). Each call is one
// strided-batched GEMM per index of the batch dims that do not collapse into
// one (usually a single call), planned by planMatmul and planLtGemm
// (Plans.cuh). T is float or __nv_bfloat16, and both accumulate in fp32
// (CUBLAS_COMPUTE_32F): float products are full fp32 (never TF32); bf16
// products run on tensor cores, and C is rounded to bf16 once. addMatmul's
// GEMM adds its fp32 product into the fp32 acc (beta = 1), never rounding it
// to T.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/Common.cuh"

#include <cublasLt.h>

#include <array>
#include <cstdio>
#include <limits>
#include <map>

namespace fastllm::rt::cuda {

//===----------------------------------------------------------------------===//
// Plans
//===----------------------------------------------------------------------===//

detail::MatmulPlan detail::planMatmul(int batchRank, const int64_t *batchShape,
                                      const int64_t *aBatchStrides,
                                      const int64_t *bBatchStrides, int64_t m,
                                      int64_t k, bool transA) {
  detail::checkRank(batchRank, "matmul");
  const ::fastllm::rt::detail::MatmulBatch batch =
      ::fastllm::rt::detail::planMatmulBatch(
          batchRank, batchShape, aBatchStrides, bBatchStrides, m, k, transA);
  MatmulPlan plan{};
  plan.m = batch.m;
  plan.count = 1;
  plan.calls = 1;
  const int rank = batch.rank;
  if (rank == 0)
    return plan;
  // The innermost batch dim is the batch of one strided call; the outer
  // ones give each call its first matrices.
  plan.count = batch.dims[rank - 1];
  plan.aStride = batch.strides[0][rank - 1];
  plan.bStride = batch.strides[1][rank - 1];
  plan.aFirst.rank = plan.bFirst.rank = rank - 1;
  for (int d = 0; d < rank - 1; ++d) {
    plan.aFirst.shape[d] = plan.bFirst.shape[d] = batch.dims[d];
    plan.aFirst.strides[d] = batch.strides[0][d];
    plan.bFirst.strides[d] = batch.strides[1][d];
    plan.calls *= batch.dims[d];
  }
  return plan;
}

detail::LtGemm detail::planLtGemm(const MatmulPlan &plan, int64_t n, int64_t k,
                                  bool transA, bool transB) {
  LtGemm gemm;
  gemm.rows = n;
  gemm.cols = plan.m;
  gemm.depth = k;
  gemm.count = plan.count;
  // B is row-major [k, n] ([n, k] when transB): column-major n x k (k x n).
  gemm.first = transB ? LtOperand{k, n, k, plan.bStride, true}
                      : LtOperand{n, k, n, plan.bStride, false};
  // A is row-major [m, k] ([k, m] when transA): column-major k x m (m x k).
  gemm.second = transA ? LtOperand{plan.m, k, plan.m, plan.aStride, true}
                       : LtOperand{k, plan.m, k, plan.aStride, false};
  return gemm;
}

namespace {

void checkCublas(cublasStatus_t status, const char *what, const char *file,
                 int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    detail::fail(file, line, what, cublasLtGetStatusString(status));
}

#define FASTLLM_CUBLAS_CHECK(expr)                                             \
  checkCublas((expr), #expr, __FILE__, __LINE__)

/// cuBLASLt's scratch memory for the GEMMs that want some (split-k), one
/// buffer for the process, allocated with the handle. 32 MiB is what NVIDIA
/// recommends for Hopper.
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

struct LtContext {
  cublasLtHandle_t handle;
  void *workspace;
};

/// The process's cuBLASLt handle and workspace, created on first use for the
/// current device. They are never freed: at exit that would race the CUDA
/// runtime's own teardown.
const LtContext &ltContext() {
  static const LtContext context = [] {
    LtContext c;
    FASTLLM_CUBLAS_CHECK(cublasLtCreate(&c.handle));
    FASTLLM_CUDA_CHECK(cudaMalloc(&c.workspace, kLtWorkspaceBytes));
    return c;
  }();
  return context;
}

/// The largest power of two (up to 256) dividing `p`'s address: what the
/// GEMM algorithm may assume of that operand.
uint32_t alignmentOf(const void *p) {
  uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align)
    align /= 2;
  return align;
}

/// One GEMM shape's cuBLASLt descriptors and the algorithm its heuristic
/// chose, made once per shape, type and operand alignments and kept for the
/// process (a training step runs the same GEMMs every time).
struct LtPlan {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t first, second, out;
  cublasLtMatmulAlgo_t algo;
};

cublasLtMatrixLayout_t ltLayout(cudaDataType_t type, int64_t rows, int64_t cols,
                                int64_t ld, int64_t count, int64_t stride) {
  if (count > std::numeric_limits<int32_t>::max())
    detail::fail(__FILE__, __LINE__, "cuBLASLt batch",
                 "more than 2^31 - 1 products in one GEMM call");
  cublasLtMatrixLayout_t layout;
  FASTLLM_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld));
  const int32_t batch = int32_t(count);
  FASTLLM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
  FASTLLM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
      sizeof(stride)));
  return layout;
}

/// The plan of GEMM `g` on `type` operands with an `outType` product, the
/// operands (first, second, out) aligned to `align` bytes.
const LtPlan &ltPlan(cudaDataType_t type, cudaDataType_t outType,
                     const detail::LtGemm &g, const uint32_t align[3]) {
  using Key = std::array<int64_t, 15>;
  static std::map<Key, LtPlan> plans;
  const Key key = {type,          outType,     g.rows,          g.cols,
                   g.depth,       g.count,     g.first.ld,      g.first.stride,
                   g.first.trans, g.second.ld, g.second.stride, g.second.trans,
                   align[0],      align[1],    align[2]};
  auto [it, inserted] = plans.try_emplace(key);
  LtPlan &plan = it->second;
  if (!inserted)
    return plan;
  // fp32 accumulation and scale for either type; fp32 operands are
  // multiplied in full fp32 (no TF32: that needs CUBLAS_COMPUTE_32F_FAST_TF32),
  // as on the CPU.
  FASTLLM_CUBLAS_CHECK(
      cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opFirst = g.first.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opSecond = g.second.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
      plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opFirst, sizeof(opFirst)));
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
      plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opSecond, sizeof(opSecond)));
  plan.first = ltLayout(type, g.first.rows, g.first.cols, g.first.ld, g.count,
                        g.first.stride);
  plan.second = ltLayout(type, g.second.rows, g.second.cols, g.second.ld,
                         g.count, g.second.stride);
  plan.out =
      ltLayout(outType, g.rows, g.cols, g.rows, g.count, g.rows * g.cols);

  cublasLtMatmulPreference_t preference;
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace = kLtWorkspaceBytes;
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
      sizeof(workspace)));
  const cublasLtMatmulPreferenceAttributes_t alignAttrs[3] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 3; ++i)
    FASTLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        preference, alignAttrs[i], &align[i], sizeof(align[i])));
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2],
      sizeof(align[2])));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(
      ltContext().handle, plan.desc, plan.first, plan.second, plan.out,
      plan.out, preference, 1, &result, &found));
  FASTLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  if (found == 0) {
    char what[160];
    std::snprintf(what, sizeof what,
                  "cuBLASLt has no algorithm for a %s GEMM %lld x %lld x %lld "
                  "(batch %lld)",
                  type == CUDA_R_32F ? "fp32" : "bf16", (long long)g.cols,
                  (long long)g.rows, (long long)g.depth, (long long)g.count);
    detail::fail(__FILE__, __LINE__, what, "no heuristic result");
  }
  plan.algo = result.algo;
  return plan;
}

/// c = op(A)·op(B) + beta·c, c of type TOut (T, or float to accumulate).
template <typename T, typename TOut>
void gemm(TOut *c, const T *a, const T *b, int batchRank,
          const int64_t *batchShape, const int64_t *aBatchStrides,
          const int64_t *bBatchStrides, int64_t m, int64_t n, int64_t k,
          bool transA, bool transB, float beta) {
  int64_t batch = numElements(batchRank, batchShape);
  if (batch == 0 || m == 0 || n == 0)
    return;
  if (k == 0) {
    if (beta == 0.f)
      fill(c, batch * m * n, 0.f);
    return;
  }
  const detail::MatmulPlan plan = detail::planMatmul(
      batchRank, batchShape, aBatchStrides, bBatchStrides, m, k, transA);
  const detail::LtGemm gemm = detail::planLtGemm(plan, n, k, transA, transB);
  const LtContext &context = ltContext();
  const float alpha = 1.f;
  for (int64_t call = 0; call < plan.calls; ++call) {
    const T *first = b + plan.bFirst.offset(call);
    const T *second = a + plan.aFirst.offset(call);
    TOut *out = c + call * plan.count * plan.m * n;
    const uint32_t align[3] = {alignmentOf(first), alignmentOf(second),
                               alignmentOf(out)};
    const LtPlan &lt = ltPlan(detail::gemmDataType<T>(),
                              detail::gemmDataType<TOut>(), gemm, align);
    FASTLLM_CUBLAS_CHECK(
        cublasLtMatmul(context.handle, lt.desc, &alpha, first, lt.first, second,
                       lt.second, &beta, out, lt.out, out, lt.out, &lt.algo,
                       context.workspace, kLtWorkspaceBytes, stream()));
  }
}

} // namespace

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
// Data movement

//===----------------------------------------------------------------------===//
// Explicit instantiations
//===----------------------------------------------------------------------===//

FASTLLM_FLOAT_TYPES(FASTLLM_INSTANTIATE_MATMUL)
FASTLLM_INSTANTIATE_MATMUL(__nv_bfloat16)

} // namespace fastllm::rt::cuda
