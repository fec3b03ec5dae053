//===- Stream.cu - the stream the CUDA kernels run on -----------*- C++ -*-===//
//
// stream() and setStream() of runtime/cuda/Kernels.cuh: the one stream every
// kernel of the library is enqueued on, process-wide.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/Kernels.cuh"

#include <atomic>

namespace fastllm::rt::cuda {

namespace {
std::atomic<cudaStream_t> currentStream{nullptr};
} // namespace

cudaStream_t stream() { return currentStream.load(std::memory_order_relaxed); }

void setStream(cudaStream_t s) {
  currentStream.store(s, std::memory_order_relaxed);
}

} // namespace fastllm::rt::cuda
