//===- KernelInstantiations.h - the kernels' instantiations -----*- C++ -*-===//
//
// The explicit instantiations of runtime/KernelApi.inc's templates, one
// macro per op family: each family's source in runtime/cpu/kernels/ and
// runtime/cuda/kernels/ expands its own, inside namespace fastllm::rt::cpu or
// fastllm::rt::cuda, for the element types listed here (the types generated
// code uses), so that both libraries offer the same instances. The CUDA
// library expands each family for __nv_bfloat16 as well.
//
//   FASTLLM_DATA_TYPES(FASTLLM_INSTANTIATE_DATA_MOVEMENT)
//
// expands FASTLLM_INSTANTIATE_DATA_MOVEMENT(T) for every T of the list.
// Included by the libraries' sources only: generated code instantiates
// nothing.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_KERNELINSTANTIATIONS_H
#define FASTLLM_RUNTIME_KERNELINSTANTIATIONS_H

//===----------------------------------------------------------------------===//
// Element types
//===----------------------------------------------------------------------===//

/// X(T) for every element type of the data movement kernels.
#define FASTLLM_DATA_TYPES(X)                                                  \
  X(float)                                                                     \
  X(double)                                                                    \
  X(bool)                                                                      \
  X(int8_t)                                                                    \
  X(uint8_t)                                                                   \
  X(int16_t)                                                                   \
  X(uint16_t)                                                                  \
  X(int32_t)                                                                   \
  X(int64_t)

/// X(T) for every element type of gatherGrad, which adds.
#define FASTLLM_GRAD_TYPES(X)                                                  \
  X(float)                                                                     \
  X(double)

/// X(T) for every element type of reduce.
#define FASTLLM_REDUCE_TYPES(X)                                                \
  X(float)                                                                     \
  X(double)                                                                    \
  X(int32_t)                                                                   \
  X(int64_t)

/// X(T) for every element type of the floating kernels: matmul, softmax,
/// the norms, attention and the losses.
#define FASTLLM_FLOAT_TYPES(X) X(float)

//===----------------------------------------------------------------------===//
// Families
//===----------------------------------------------------------------------===//

#define FASTLLM_INSTANTIATE_MATMUL(T)                                          \
  template void matmul<T>(T *, const T *, const T *, int, const int64_t *,     \
                          const int64_t *, const int64_t *, int64_t, int64_t,  \
                          int64_t, bool, bool);                                \
  template void addMatmul<T>(                                                  \
      float *, const T *, const T *, int, const int64_t *, const int64_t *,    \
      const int64_t *, int64_t, int64_t, int64_t, bool, bool);

#define FASTLLM_INSTANTIATE_DATA_MOVEMENT(T)                                   \
  template void transpose<T>(T *, const T *, int, const int64_t *,             \
                             const int64_t *);                                 \
  template void slice<T>(T *, const T *, int, const int64_t *,                 \
                         const int64_t *, const int64_t *, const int64_t *);   \
  template void sliceGrad<T>(T *, const T *, int, const int64_t *,             \
                             const int64_t *, const int64_t *,                 \
                             const int64_t *);                                 \
  template void concat<T>(T *, int, const T *const *, const int64_t *,         \
                          int64_t, int64_t);                                   \
  template void gather<T, int32_t>(T *, const T *, const int32_t *, int64_t,   \
                                   int64_t, int64_t, int64_t);                 \
  template void gather<T, int64_t>(T *, const T *, const int64_t *, int64_t,   \
                                   int64_t, int64_t, int64_t);

#define FASTLLM_INSTANTIATE_GATHER_GRAD(T)                                     \
  template void gatherGrad<T, int32_t>(T *, const T *, const int32_t *,        \
                                       int64_t, int64_t, int64_t, int64_t);    \
  template void gatherGrad<T, int64_t>(T *, const T *, const int64_t *,        \
                                       int64_t, int64_t, int64_t, int64_t);

#define FASTLLM_INSTANTIATE_REDUCE(T)                                          \
  template void reduce<T>(T *, const T *, int, const int64_t *, const bool *,  \
                          ReduceKind);

#define FASTLLM_INSTANTIATE_SOFTMAX(T)                                         \
  template void softmax<T>(T *, const T *, int64_t, int64_t, int64_t, bool);   \
  template void softmaxGrad<T>(T *, const T *, const T *, int64_t, int64_t,    \
                               int64_t, bool);

#define FASTLLM_INSTANTIATE_NORMS(T)                                           \
  template void layerNorm<T>(T *, const T *, const T *, const T *, int64_t,    \
                             int64_t, float);                                  \
  template void layerNormGrad<T>(T *, T *, T *, const T *, const T *,          \
                                 const T *, int64_t, int64_t, float);          \
  template void rmsNorm<T>(T *, const T *, const T *, int64_t, int64_t,        \
                           float);                                             \
  template void rmsNormGrad<T>(T *, T *, const T *, const T *, const T *,      \
                               int64_t, int64_t, float);

#define FASTLLM_INSTANTIATE_ATTENTION(T)                                       \
  template void causalAttention<T>(T *, float *, const T *, const T *,         \
                                   const T *, int64_t, int64_t, int64_t,       \
                                   int64_t, float);                            \
  template void causalAttentionGrad<T>(                                        \
      T *, T *, T *, const T *, const T *, const T *, const T *,               \
      const float *, const T *, int64_t, int64_t, int64_t, int64_t, float);

/// The losses of T logits (or log-probabilities) for both index types.
#define FASTLLM_INSTANTIATE_LOSSES(T)                                          \
  FASTLLM_INSTANTIATE_LOSSES_IDX(int32_t, T)                                   \
  FASTLLM_INSTANTIATE_LOSSES_IDX(int64_t, T)
#define FASTLLM_INSTANTIATE_LOSSES_IDX(Idx, T)                                 \
  template void crossEntropy<Idx, T>(float *, const T *, const Idx *, int64_t, \
                                     int64_t, bool, int64_t, Reduction);       \
  template void crossEntropyGrad<Idx, T>(T *, const T *, const Idx *,          \
                                         const float *, int64_t, int64_t,      \
                                         bool, int64_t, Reduction);            \
  template void nllLoss<Idx, T>(float *, const T *, const Idx *, int64_t,      \
                                int64_t, bool, int64_t, Reduction);            \
  template void nllLossGrad<Idx, T>(T *, const Idx *, const float *, int64_t,  \
                                    int64_t, bool, int64_t, Reduction);

#endif // FASTLLM_RUNTIME_KERNELINSTANTIATIONS_H
