//===- Plans.cuh - the CUDA kernels' host-side plans ------------*- C++ -*-===//
//
// How the CUDA kernels turn host shapes into launches and kernel parameters,
// beyond runtime/KernelPlans.h's plans that both libraries share: matmul's
// strided-batched GEMM calls in cuBLASLt's terms, transpose's and reduce's
// walks, gatherGrad's bands and the attention kernels' shared memory. Pure
// host logic, private to runtime/cuda/kernels/ and tested on the host by
// runtime/cuda/test/KernelsTest.cu.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CUDA_KERNELS_PLANS_CUH
#define FASTLLM_RUNTIME_CUDA_KERNELS_PLANS_CUH

#include "runtime/KernelPlans.h"
#include "runtime/cuda/Kernels.cuh"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace fastllm::rt::cuda::detail {

//===----------------------------------------------------------------------===//
// Matmul (Matmul.cu)
//===----------------------------------------------------------------------===//

/// How matmul runs as strided-batched GEMMs: `calls` calls of `count`
/// products each. Product p of call c multiplies A at aFirst.offset(c) +
/// p·aStride by B at bFirst.offset(c) + p·bStride; its C is the next
/// contiguous [m, n] block. The batch is runtime/KernelPlans.h's
/// MatmulBatch: collapsed, and a stack of A matrices times one shared B is
/// one product with a taller m.
struct MatmulPlan {
  int64_t m;
  int64_t count;
  int64_t aStride, bStride;
  int64_t calls;
  StridedIndex aFirst, bFirst;
};

/// One operand of a cuBLASLt GEMM as it lies in memory: a column-major
/// rows x cols matrix with leading dimension ld, the next matrix of the
/// batch `stride` elements further (0: the same one), read transposed or not.
struct LtOperand {
  int64_t rows, cols, ld, stride;
  bool trans;
};

/// The strided-batched GEMM a MatmulPlan call is in cuBLASLt's column-major
/// terms. A row-major [r, c] matrix read column-major is its [c, r]
/// transpose, so the row-major C = op(A)·op(B) is computed as the
/// column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's first operand is matmul's B
/// and its second matmul's A, each with its own transpose flag; the product
/// D (= Cᵀ) is rows x cols = n x plan.m, leading dimension n, `count` of them
/// each rows·cols elements after the last.
struct LtGemm {
  LtOperand first, second;
  int64_t rows, cols, depth;
  int64_t count;
};

/// The cuBLASLt GEMM of each call of `plan` (which only shifts the base
/// pointers between calls).
LtGemm planLtGemm(const MatmulPlan &plan, int64_t n, int64_t k, bool transA,
                  bool transB);

/// The CUDA data type of matmul's A, B and C for element type T. Both
/// multiply with fp32 accumulation (CUBLAS_COMPUTE_32F).
template <typename T> constexpr cudaDataType_t gemmDataType() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16>,
                "matmul multiplies float or __nv_bfloat16 matrices");
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

/// Plans matmul's batch; the batch, m, n and k are not empty.
MatmulPlan planMatmul(int batchRank, const int64_t *batchShape,
                      const int64_t *aBatchStrides,
                      const int64_t *bBatchStrides, int64_t m, int64_t k,
                      bool transA);

//===----------------------------------------------------------------------===//
// Data movement (DataMovement.cu)
//===----------------------------------------------------------------------===//

using ::fastllm::rt::detail::TransposePlan;

/// Side of transpose's tiles: one warp per tile row.
inline constexpr int kTransposeTile = 32;

/// runtime/KernelPlans.h's planTranspose in kTransposeTile tiles, refusing
/// a rank above kMaxRank.
TransposePlan planTranspose(int rank, const int64_t *inShape,
                            const int64_t *perm);

/// gatherGrad gives each block one outer slice and one band of consecutive
/// table rows: the number of bands per slice that makes about 1024 blocks,
/// from the shapes alone, at most one per row.
int64_t gatherGradBands(int64_t outer, int64_t dimSize);

//===----------------------------------------------------------------------===//
// Reductions (Reduce.cu)
//===----------------------------------------------------------------------===//

/// How reduce walks its input: output o starts at kept.offset(o) and reduces
/// the elements at red.offset(r) from there, r < redCount. `innerReduced`
/// when the input's contiguous dim is among the reduced ones.
struct ReducePlan {
  int64_t keptCount, redCount;
  bool innerReduced;
  StridedIndex kept, red;
};

/// Plans reduce over the dims flagged in `reducedDims` (no dim empty), from
/// runtime/KernelPlans.h's ReduceDims.
ReducePlan planReduce(int rank, const int64_t *shape, const bool *reducedDims);

/// The kernels that sum over rows into columns (reduce along a
/// non-contiguous dim, norm gradients) cut the rows into parts when the
/// columns alone give too few blocks (768 columns are 24 blocks of 32 for
/// 132 SMs): about kColumnBlocks blocks in all, each part at least
/// kMinPartRows rows. Each part's sums go to scratch, then combinePartsKernel
/// adds the parts in order: the count depends on the shape alone, so the
/// sums are the same on every GPU.
inline constexpr int64_t kColumnBlocks = 1024;
inline constexpr int64_t kMinPartRows = 64;

/// How many parts `rows` rows are cut into for `tiles` column tiles.
inline int64_t columnParts(int64_t tiles, int64_t rows) {
  const int64_t want = (kColumnBlocks + tiles - 1) / tiles;
  const int64_t most = rows / kMinPartRows;
  return std::max<int64_t>(1, std::min<int64_t>({want, most, 65535}));
}

//===----------------------------------------------------------------------===//
// Attention (Attention.cu, AttentionTensorCore.cu)
//===----------------------------------------------------------------------===//

/// The kernels of causalAttention and causalAttentionGrad.
/// The scalar kernels (any head dims, fp32 or bf16) and the tensor-core ones
/// (bf16, head dims multiples of 16; Tc*).
enum class AttentionKernel {
  Forward,
  QueryGrad,
  KeyValueGrad,
  TcForward,
  TcQueryGrad,
  TcKeyValueGrad
};

/// The dynamic shared memory `kernel` needs for head dims d and dv.
size_t attentionSharedBytes(AttentionKernel kernel, int64_t d, int64_t dv);

/// Whether head dims d and dv suit the tensor-core kernels (multiples of
/// 16); bf16 attention uses them then, when the pointers are 16-byte
/// aligned and the GPU has the shared memory they need.
bool tensorCoreAttentionShape(int64_t d, int64_t dv);

/// Whether head dims d and dv have the register-resident kernels of
/// FlashAttention.cu (d = dv in {16, 32, 64, 128}); bf16 attention uses them
/// before the tensor-core ones, on the same conditions.
bool flashAttentionShape(int64_t d, int64_t dv);

} // namespace fastllm::rt::cuda::detail

#endif // FASTLLM_RUNTIME_CUDA_KERNELS_PLANS_CUH
