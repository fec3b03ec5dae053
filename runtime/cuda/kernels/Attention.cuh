//===- Attention.cuh - what the two attention sources share -----*- C++ -*-===//
//
// Private to runtime/cuda/kernels/: Attention.cu (the scalar kernels, and
// causalAttention and causalAttentionGrad, which choose) calls the
// tensor-core kernels of AttentionTensorCore.cu through the functions
// declared here; both reserve their dynamic shared memory the same way.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CUDA_KERNELS_ATTENTION_CUH
#define FASTLLM_RUNTIME_CUDA_KERNELS_ATTENTION_CUH

#include "runtime/cuda/kernels/Common.cuh"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>

namespace fastllm::rt::cuda::detail {

/// The current GPU's dynamic shared memory per block, opted in.
inline int sharedMemoryLimit() {
  int device = 0, limit = 0;
  FASTLLM_CUDA_CHECK(cudaGetDevice(&device));
  FASTLLM_CUDA_CHECK(cudaDeviceGetAttribute(
      &limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return limit;
}

/// Whether every pointer is 16-byte aligned (tiles move in 16-byte pieces).
inline bool aligned16(std::initializer_list<const void *> pointers) {
  for (const void *p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16)
      return false;
  return true;
}

/// Lets `kernel` use `bytes` of dynamic shared memory, or aborts saying that
/// the head dims need more than the GPU has.
template <typename Kernel>
void reserveSharedMemory(Kernel *kernel, size_t bytes, const char *caller,
                         int64_t d, int64_t dv) {
  const int limit = sharedMemoryLimit();
  if (bytes > size_t(limit)) {
    char reason[160];
    std::snprintf(reason, sizeof(reason),
                  "head dims d=%lld, dv=%lld need %zu bytes of shared memory "
                  "per block; this GPU has %d",
                  (long long)d, (long long)dv, bytes, limit);
    detail::fail(__FILE__, __LINE__, caller, reason);
  }
  FASTLLM_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

/// causalAttention of bf16 in FlashAttention.cu's kernels, when the head
/// dims (flashAttentionShape), the sizes, the pointers' alignment and the
/// GPU's shared memory allow: launches it and returns true, or launches
/// nothing and returns false.
bool flashAttention(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                    const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                    int64_t batch, int64_t t, int64_t d, int64_t dv,
                    float scale);

/// causalAttentionGrad of bf16 in FlashAttention.cu's kernels, as
/// flashAttention; also declines when dQ's memory overlaps an input's.
bool flashAttentionGrad(__nv_bfloat16 *dQ, __nv_bfloat16 *dK, __nv_bfloat16 *dV,
                        const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                        const __nv_bfloat16 *v, const __nv_bfloat16 *out,
                        const float *lse, const __nv_bfloat16 *dout,
                        int64_t batch, int64_t t, int64_t d, int64_t dv,
                        float scale);

/// attentionSharedBytes of the tensor-core kernels (Tc*).
size_t tensorCoreSharedBytes(AttentionKernel kernel, int64_t d, int64_t dv);

/// causalAttention of bf16 on tensor cores, when the head dims, the
/// pointers' alignment and the GPU's shared memory allow: launches it and
/// returns true, or launches nothing and returns false.
bool tensorCoreAttention(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                         const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                         int64_t batch, int64_t t, int64_t d, int64_t dv,
                         float scale);

/// causalAttentionGrad of bf16 on tensor cores, as tensorCoreAttention.
bool tensorCoreAttentionGrad(__nv_bfloat16 *dQ, __nv_bfloat16 *dK,
                             __nv_bfloat16 *dV, const __nv_bfloat16 *q,
                             const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                             const __nv_bfloat16 *out, const float *lse,
                             const __nv_bfloat16 *dout, int64_t batch,
                             int64_t t, int64_t d, int64_t dv, float scale);

} // namespace fastllm::rt::cuda::detail

#endif // FASTLLM_RUNTIME_CUDA_KERNELS_ATTENTION_CUH
