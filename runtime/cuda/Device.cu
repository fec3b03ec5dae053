//===- Device.cu - the CUDA target's device: one GPU per rank -------------===//
//
// The arena is one managed allocation: the step's kernels use it on the GPU
// and the runtime's host code (data, optimizer, MPI collectives, checkpoints)
// reads and writes it between steps after synchronizeDevice().
//
//===----------------------------------------------------------------------===//

#include "runtime/Device.h"
#include "runtime/cuda/Kernels.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

using namespace fastllm::rt;

const char *fastllm::rt::deviceTarget() { return "cuda"; }

Status fastllm::rt::initDevice(int localRank) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0)
    return errorf("no CUDA GPU: %s", err != cudaSuccess
                                         ? cudaGetErrorString(err)
                                         : "the driver sees none");
  if ((err = cudaSetDevice(localRank % count)) != cudaSuccess)
    return errorf("cannot use GPU %d: %s", localRank % count,
                  cudaGetErrorString(err));
  // The compute stream: the step's kernels and the runtime's device work,
  // in order; NCCL's communication stream waits on it through events.
  cudaStream_t compute = nullptr;
  if ((err = cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking)) !=
      cudaSuccess)
    return errorf("cannot create the compute stream: %s",
                  cudaGetErrorString(err));
  cuda::setStream(compute);
  return Status();
}

Expected<Arena> fastllm::rt::allocateArena(int64_t bytes) {
  // Measured as the drop in the GPU's free memory once the zeroed arena is
  // resident there (cudaMemset runs on the device).
  size_t freeBefore = 0, freeAfter = 0, total = 0;
  void *data = nullptr;
  cudaError_t err = cudaMemGetInfo(&freeBefore, &total);
  if (err == cudaSuccess)
    err = cudaMallocManaged(&data, size_t(bytes));
  // Resident on this GPU: the host's reads and writes between steps are
  // small (tokens, the loss) or rare (checkpoints).
  int device = 0;
  if (err == cudaSuccess)
    err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaMemAdvise(data, size_t(bytes), cudaMemAdviseSetPreferredLocation,
                        cudaMemLocation{cudaMemLocationTypeDevice, device});
  if (err == cudaSuccess)
    err = cudaMemset(data, 0, size_t(bytes));
  if (err == cudaSuccess)
    err = cudaDeviceSynchronize();
  if (err == cudaSuccess)
    err = cudaMemGetInfo(&freeAfter, &total);
  if (err != cudaSuccess) {
    cudaFree(data);
    return errorf("cannot allocate the model's %lld-byte arena on the GPU: %s",
                  (long long)bytes, cudaGetErrorString(err));
  }
  return Arena{ArenaPtr(static_cast<char *>(data), [](char *p) { cudaFree(p); }),
               int64_t(freeBefore) - int64_t(freeAfter)};
}

void fastllm::rt::synchronizeDevice() {
  cudaError_t err = cudaStreamSynchronize(cuda::stream());
  if (err != cudaSuccess) {
    std::fprintf(stderr, "train: error: the GPU failed: %s\n",
                 cudaGetErrorString(err));
    std::abort();
  }
}

//===----------------------------------------------------------------------===//
// Elementwise work on the arena, on the step's stream
//===----------------------------------------------------------------------===//

namespace {

constexpr int kThreads = 256;

int blocksFor(int64_t n) {
  return int(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8));
}

/// out[i] = in[i] * scale, or out[i] += in[i] * scale when `accumulate`;
/// grid-stride over n elements.
__global__ void scaleKernel(float *out, const float *in, int64_t n, float scale,
                            bool accumulate) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    // __fmul_rn / __fadd_rn: no fused multiply-add, as on the CPU.
    float x = __fmul_rn(in[i], scale);
    out[i] = accumulate ? __fadd_rn(out[i], x) : x;
  }
}

} // namespace

void fastllm::rt::deviceFill(float *out, int64_t n, float value) {
  cuda::fill(out, n, value);
}

void fastllm::rt::deviceCopy(float *out, const float *in, int64_t n) {
  if (out != in)
    cuda::copy(out, in, n);
}

void fastllm::rt::deviceScale(float *out, const float *in, int64_t n,
                              float scale) {
  if (scale == 1.0f)
    return deviceCopy(out, in, n);
  if (n > 0)
    scaleKernel<<<blocksFor(n), kThreads, 0, cuda::stream()>>>(out, in, n,
                                                               scale, false);
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}

void fastllm::rt::deviceAddScaled(float *out, const float *in, int64_t n,
                                  float scale) {
  if (n > 0)
    scaleKernel<<<blocksFor(n), kThreads, 0, cuda::stream()>>>(out, in, n,
                                                               scale, true);
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}
