//===- Launch.h - kernel launches of the CUDA emulation ---------*- C++ -*-===//
//
// FASTLLM_LAUNCH(grid, block, shmem, stream, kernel)(args...) of
// runtime/cuda/Launch.cuh, emulated: the arguments are converted to the
// kernel's parameter types (as a launch does), the launch is checked against
// an H100's limits (a bad one sets cudaGetLastError, as on a GPU) and the
// grid runs on `stream`, block after block, each block's threads as fibers
// (Launch.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CUDA_EMU_LAUNCH_H
#define FASTLLM_RUNTIME_CUDA_EMU_LAUNCH_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <tuple>
#include <utility>

namespace fastllm::emu {

/// One launch: what runs each thread, and where.
struct LaunchSpec {
  const void *kernel; ///< identifies the kernel (cudaFuncSetAttribute)
  const char *name;   ///< the kernel as the launch site spells it
  dim3 grid, block;
  size_t sharedBytes;
  cudaStream_t stream;
  /// Runs the kernel body as the current thread (set up by the scheduler).
  std::function<void()> body;
};

/// Checks `spec` and enqueues its grid on its stream; a launch a GPU would
/// refuse sets the last error instead and runs nothing.
void launch(LaunchSpec spec);

template <typename... P> class Launcher {
public:
  Launcher(void (*kernel)(P...), const char *name, dim3 grid, dim3 block,
           size_t sharedBytes, cudaStream_t stream)
      : kernel(kernel), name(name), grid(grid), block(block),
        sharedBytes(sharedBytes), stream(stream) {}

  template <typename... A> void operator()(A &&...args) const {
    static_assert(sizeof...(A) == sizeof...(P),
                  "a kernel launch passes every parameter");
    // The kernel's parameters, converted once, as a GPU launch copies them.
    auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(
        std::forward<A>(args)...);
    void (*k)(P...) = kernel;
    launch({reinterpret_cast<const void *>(kernel), name, grid, block,
            sharedBytes, stream, [k, params] { std::apply(k, *params); }});
  }

private:
  void (*kernel)(P...);
  const char *name;
  dim3 grid, block;
  size_t sharedBytes;
  cudaStream_t stream;
};

template <typename... P>
Launcher<P...> makeLauncher(void (*kernel)(P...), const char *name, dim3 grid,
                            dim3 block, size_t sharedBytes,
                            cudaStream_t stream) {
  return Launcher<P...>(kernel, name, grid, block, sharedBytes, stream);
}

} // namespace fastllm::emu

#endif // FASTLLM_RUNTIME_CUDA_EMU_LAUNCH_H
