//===- Device.h - the device side of the CUDA emulation ---------*- C++ -*-===//
//
// What a kernel sees when the CUDA sources are compiled by the host compiler
// (Emulation.h includes this after the toolkit's headers): the thread and
// block indices, the barriers, the warp shuffles, shared memory and the few
// device intrinsics the project uses. Every thread of a block is a fiber on
// one host thread (Launch.cpp); the calls below are the only points where a
// thread gives way to the others, which is all a correct kernel may rely on.
//
// The barriers and warp operations are checked as a GPU defines them: every
// lane a warp operation names must reach a warp operation of the same kind
// with the same mask, and every thread of the block must reach __syncthreads;
// otherwise the kernel, block, thread and source line are reported and the
// process aborts. A shuffle that reads a lane outside its mask is an error
// too (its value is undefined on a GPU).
//
//===----------------------------------------------------------------------===//

#ifndef FASTLLM_RUNTIME_CUDA_EMU_DEVICE_H
#define FASTLLM_RUNTIME_CUDA_EMU_DEVICE_H

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

// The built-in variables, per host thread: the scheduler sets them before it
// switches to a thread of the block.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

namespace fastllm::emu {

/// The warp operations a thread can wait in.
enum class WarpOpKind : int {
  SyncWarp,
  ShuffleXor,
  ShuffleDown,
  ShuffleUp,
  ShuffleIdx,
  Wmma,    ///< load, store, mma and fill of WMMA fragments
  Combine, ///< warpCombine: mma.sync, ldmatrix
};

/// Waits at the block's barrier (__syncthreads at file:line).
void syncThreads(const char *file, int line);

/// Waits until every lane of `mask` is in a warp operation of the same kind
/// and mask, then returns this lane's result. `bits` is this lane's value (a
/// shuffle's `var`, `size` bytes); `arg` the lane mask, delta or source lane;
/// `width` the shuffle's segment. `key` (`keyBytes` bytes) must be equal on
/// every lane: a WMMA operation's pointer, leading dimension and layout.
uint64_t warpOp(WarpOpKind kind, unsigned mask, uint64_t bits, int size,
                int arg, int width, const void *key, int keyBytes,
                const char *file, int line);

/// What warpCombine runs once all 32 lanes are there: `lanes[l]` is lane
/// l's `data`.
using WarpCombineFn = void (*)(void *const lanes[32]);

/// A warp-collective instruction of the full warp (mma.sync, ldmatrix): when
/// all 32 lanes have called it with the same `fn` and `tag`, runs `fn` once
/// over their `data` (each lane's operands and where its results go) before
/// any lane goes on, so every lane sees the others' operands as they were
/// at the call.
void warpCombine(WarpCombineFn fn, int tag, void *data, const char *file,
                 int line);

/// cp.async: copies `bytes` (4, 8 or 16) from global `src` to shared `dst`,
/// `srcBytes` < `bytes` of them read and the rest zeros (0: nothing read).
/// Under the in-order schedule, at this thread's asyncWait that covers it,
/// so that a kernel that reads `dst` before waiting reads what was there
/// (0xff bytes in a fresh block); under the adversarial one at once, so
/// that a refill of a buffer other warps still read overwrites it early.
void asyncCopy(void *dst, const void *src, int bytes, int srcBytes);
/// cp.async.commit_group: this thread's copies since the last commit form a
/// group.
void asyncCommit();
/// cp.async.wait_group: completes this thread's committed groups but the
/// `pending` most recent.
void asyncWait(int pending);

/// The block's dynamic shared memory (the launch's third parameter), 128-byte
/// aligned; filled with 0xff bytes (NaN as floats) when the block starts.
void *dynamicShared();

/// Reports a misuse inside a kernel (with the kernel, block and thread) and
/// aborts.
[[noreturn]] void deviceFatal(const char *file, int line, const char *format,
                              ...) __attribute__((format(printf, 3, 4)));

template <typename T>
T shuffle(WarpOpKind kind, const char *file, int line, unsigned mask, T var,
          int arg, int width) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8,
                "shuffles move 1 to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = warpOp(kind, mask, bits, int(sizeof(T)), arg, width, nullptr, 0, file,
                line);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

} // namespace fastllm::emu

#define __syncthreads() ::fastllm::emu::syncThreads(__FILE__, __LINE__)
#define __syncwarp(...)                                                        \
  ::fastllm::emu::syncWarp(__FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_xor_sync(mask, var, ...)                                        \
  ::fastllm::emu::shuffleOp(::fastllm::emu::WarpOpKind::ShuffleXor, __FILE__,  \
                            __LINE__, mask, var, __VA_ARGS__)
#define __shfl_down_sync(mask, var, ...)                                       \
  ::fastllm::emu::shuffleOp(::fastllm::emu::WarpOpKind::ShuffleDown, __FILE__, \
                            __LINE__, mask, var, __VA_ARGS__)
#define __shfl_up_sync(mask, var, ...)                                         \
  ::fastllm::emu::shuffleOp(::fastllm::emu::WarpOpKind::ShuffleUp, __FILE__,   \
                            __LINE__, mask, var, __VA_ARGS__)
#define __shfl_sync(mask, var, ...)                                            \
  ::fastllm::emu::shuffleOp(::fastllm::emu::WarpOpKind::ShuffleIdx, __FILE__,  \
                            __LINE__, mask, var, __VA_ARGS__)

namespace fastllm::emu {

inline void syncWarp(const char *file, int line, unsigned mask = 0xffffffffu) {
  warpOp(WarpOpKind::SyncWarp, mask, 0, 0, 0, 32, nullptr, 0, file, line);
}

template <typename T>
T shuffleOp(WarpOpKind kind, const char *file, int line, unsigned mask, T var,
            int arg, int width = warpSize) {
  return shuffle(kind, file, line, mask, var, arg, width);
}

} // namespace fastllm::emu

// Device intrinsics with the host's IEEE arithmetic: the host compiler does
// not contract across these calls (the emulated build uses -ffp-contract=off).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __uint_as_float(unsigned bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// CUDA's min and max overloads for device code (math_functions.hpp, which
// only nvcc includes), for the types the kernels use.
#define FASTLLM_EMU_MIN_MAX(T)                                                 \
  inline T min(T a, T b) { return b < a ? b : a; }                             \
  inline T max(T a, T b) { return a < b ? b : a; }
FASTLLM_EMU_MIN_MAX(int)
FASTLLM_EMU_MIN_MAX(unsigned)
FASTLLM_EMU_MIN_MAX(long)
FASTLLM_EMU_MIN_MAX(unsigned long)
FASTLLM_EMU_MIN_MAX(long long)
FASTLLM_EMU_MIN_MAX(unsigned long long)
#undef FASTLLM_EMU_MIN_MAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// The runtime API's C++ overloads that cuda_runtime.h declares for nvcc only.
template <typename T>
cudaError_t cudaFuncSetAttribute(T *entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void *>(entry), attr,
                                value);
}
template <typename T>
cudaError_t cudaGetSymbolAddress(void **devPtr, const T &symbol) {
  return ::cudaGetSymbolAddress(devPtr, static_cast<const void *>(&symbol));
}

#endif // FASTLLM_RUNTIME_CUDA_EMU_DEVICE_H
