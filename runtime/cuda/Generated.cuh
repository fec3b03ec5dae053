//===- Generated.cuh - what generated CUDA steps include --------*- C++ -*-===//
//
// The CUDA kernel library plus the two things only generated code needs:
// the device address of a __device__ constant array, and the loss read back
// once the stream has finished the step.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CUDA_GENERATED_CUH
#define FASTLLM_RUNTIME_CUDA_GENERATED_CUH

#include "runtime/cuda/Kernels.cuh"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace fastllm::rt::cuda {

/// Generated code has no error path: a failing CUDA call ends the process.
inline void checkGenerated(cudaError_t err, const char *what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "train: error: %s failed: %s\n", what,
                 cudaGetErrorString(err));
    std::abort();
  }
}

/// The device address of a __device__ array (looked up once per array).
template <typename T, size_t N> const T *deviceAddress(const T (&symbol)[N]) {
  void *address = nullptr;
  checkGenerated(cudaGetSymbolAddress(&address, symbol),
                 "cudaGetSymbolAddress");
  return static_cast<const T *>(address);
}

/// The value at `p` (in the managed arena) once the stream is done.
inline float readScalar(const float *p) {
  checkGenerated(cudaStreamSynchronize(stream()), "the step");
  return *p;
}

} // namespace fastllm::rt::cuda

#endif // FASTLLM_RUNTIME_CUDA_GENERATED_CUH
