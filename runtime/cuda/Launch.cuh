//===- Launch.cuh - kernel launches and dynamic shared memory ---*- C++ -*-===//
//
// The two spellings that differ between nvcc and the CUDA emulation (built
// with FASTLLM_CUDA_EMULATION by the host compiler, runtime/cuda/emu/):
//
//   FASTLLM_LAUNCH(grid, block, sharedBytes, stream, kernel)(args...)
//     kernel<<<grid, block, sharedBytes, stream>>>(args...); `kernel` names
//     one function (a template with all its arguments given).
//   FASTLLM_DYNAMIC_SHARED(T, name, align);
//     extern __shared__ __align__(align) T name[]; the launch's dynamic
//     shared memory.
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CUDA_LAUNCH_CUH
#define FASTLLM_RUNTIME_CUDA_LAUNCH_CUH

#ifdef FASTLLM_CUDA_EMULATION
#include "runtime/cuda/emu/Launch.h"
#define FASTLLM_LAUNCH(grid, block, sharedBytes, stream, ...)                  \
  ::fastllm::emu::makeLauncher(__VA_ARGS__, #__VA_ARGS__, grid, block,         \
                               sharedBytes, stream)
#define FASTLLM_DYNAMIC_SHARED(T, name, align)                                 \
  T *const name = static_cast<T *>(::fastllm::emu::dynamicShared())
#else
#define FASTLLM_LAUNCH(grid, block, sharedBytes, stream, ...)                  \
  __VA_ARGS__<<<grid, block, sharedBytes, stream>>>
#define FASTLLM_DYNAMIC_SHARED(T, name, align)                                 \
  extern __shared__ __align__(align)                                           \
  T name[]
#endif

#endif // FASTLLM_RUNTIME_CUDA_LAUNCH_CUH
