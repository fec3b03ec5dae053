//===- EmulatorTest.cu - the CUDA emulation's own rules -------------------===//
//
// Small kernels, compiled as the CUDA sources are (emulated), that check what
// the emulator promises beyond running correct code: exact shuffles, a
// barrier or warp operation that not every named lane reaches reported as an
// error, shared memory per block, the launch limits of an H100 reported
// through cudaGetLastError, WMMA's rules, cp.async and ldmatrix, and the
// stream modes' ordering.
// Run under both schedules (ctest), like the kernel tests.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/Launch.cuh"
#include "runtime/cuda/kernels/Mma.cuh"

#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

/// A managed buffer of n Ts, zeroed.
template <typename T> struct Buffer {
  explicit Buffer(size_t n) : n(n) {
    EXPECT_EQ(cudaMallocManaged(&p, n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, n * sizeof(T)), cudaSuccess);
  }
  ~Buffer() { cudaFree(p); }
  T *p = nullptr;
  size_t n;
};

__global__ void indicesKernel(int *out) {
  const int t =
      threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int b = blockIdx.x + gridDim.x * blockIdx.y;
  out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 1000 + t;
}

TEST(CudaEmulation, GridAndBlockIndices) {
  Buffer<int> out(2 * 3 * 4 * 5 * 2);
  FASTLLM_LAUNCH(dim3(2, 3), dim3(4, 5, 2), 0, nullptr, indicesKernel)(out.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int b = 0; b < 6; ++b)
    for (int t = 0; t < 40; ++t)
      EXPECT_EQ(out.p[b * 40 + t], b * 1000 + t);
}

__global__ void shuffleKernel(int *out) {
  const int lane = threadIdx.x % 32;
  const int base = threadIdx.x / 32 * 32 * 4;
  out[base + lane] = __shfl_xor_sync(0xffffffffu, lane * 10, 5);
  out[base + 32 + lane] = __shfl_down_sync(0xffffffffu, lane * 10, 3, 16);
  out[base + 64 + lane] = __shfl_up_sync(0xffffffffu, lane * 10, 2);
  out[base + 96 + lane] = __shfl_sync(0xffffffffu, lane * 10, 7, 8);
}

TEST(CudaEmulation, ShufflesAreExact) {
  Buffer<int> out(64 * 4);
  FASTLLM_LAUNCH(1, 64, 0, nullptr, shuffleKernel)(out.p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int w = 0; w < 2; ++w)
    for (int l = 0; l < 32; ++l) {
      const int *o = out.p + w * 128;
      EXPECT_EQ(o[l], (l ^ 5) * 10);
      // down by 3 within 16-lane segments: the segment's last lanes keep
      // their own value.
      EXPECT_EQ(o[32 + l], (l % 16 + 3 < 16 ? l + 3 : l) * 10);
      EXPECT_EQ(o[64 + l], (l >= 2 ? l - 2 : l) * 10);
      EXPECT_EQ(o[96 + l], (l / 8 * 8 + 7) * 10);
    }
}

__global__ void sharedSumKernel(int *out) {
  __shared__ int values[64];
  values[threadIdx.x] = int(threadIdx.x + blockIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int i = 0; i < 64; ++i)
      sum += values[i];
    out[blockIdx.x] = sum;
  }
}

TEST(CudaEmulation, SharedMemoryIsPerBlock) {
  Buffer<int> out(3);
  FASTLLM_LAUNCH(3, 64, 0, nullptr, sharedSumKernel)(out.p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int b = 0; b < 3; ++b)
    EXPECT_EQ(out.p[b], 64 * 63 / 2 + 64 * b);
}

__global__ void dynamicSharedKernel(float *out, int n) {
  FASTLLM_DYNAMIC_SHARED(float, buffer, 16);
  // Unwritten dynamic shared memory reads as NaN (0xff bytes).
  if (threadIdx.x == 0)
    out[0] = buffer[n - 1];
}

TEST(CudaEmulation, DynamicSharedMemoryLimits) {
  Buffer<float> out(1);
  // 48 KiB without opting in.
  FASTLLM_LAUNCH(1, 32, 48 * 1024, nullptr, dynamicSharedKernel)(out.p, 1024);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(out.p[0] != out.p[0]);
  // More needs the kernel's opt-in, up to an H100's 227 KiB.
  FASTLLM_LAUNCH(1, 32, 64 * 1024, nullptr, dynamicSharedKernel)(out.p, 1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFuncSetAttribute(dynamicSharedKernel,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 228 * 1024),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(dynamicSharedKernel,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 64 * 1024),
            cudaSuccess);
  FASTLLM_LAUNCH(1, 32, 64 * 1024, nullptr, dynamicSharedKernel)(out.p, 1);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaEmulation, LaunchLimits) {
  Buffer<int> out(1 << 12);
  FASTLLM_LAUNCH(1, 1025, 0, nullptr, indicesKernel)(out.p);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  FASTLLM_LAUNCH(1, dim3(32, 2, 65), 0, nullptr, indicesKernel)(out.p);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  FASTLLM_LAUNCH(dim3(1, 65536), 1, 0, nullptr, indicesKernel)(out.p);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  FASTLLM_LAUNCH(0, 32, 0, nullptr, indicesKernel)(out.p);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess); // reading it cleared it
}

__global__ void exitBeforeShuffleKernel(int *out) {
  if (threadIdx.x == 3)
    return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, int(threadIdx.x), 1);
}

__global__ void exitBeforeBarrierKernel(int *out) {
  if (threadIdx.x >= 32)
    return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void mismatchedMasksKernel(int *out) {
  const unsigned mask = threadIdx.x < 16 ? 0x0000ffffu : 0xffffffffu;
  out[threadIdx.x] = __shfl_xor_sync(mask, int(threadIdx.x), 1);
}

__global__ void readOutsideMaskKernel(int *out) {
  if (threadIdx.x < 16)
    out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, int(threadIdx.x), 16);
}

using CudaEmulationDeathTest = ::testing::Test;

TEST(CudaEmulationDeathTest, LaneExitsBeforeAShuffle) {
  Buffer<int> out(32);
  EXPECT_DEATH(
      {
        FASTLLM_LAUNCH(1, 32, 0, nullptr, exitBeforeShuffleKernel)(out.p);
        cudaDeviceSynchronize();
      },
      "kernel exitBeforeShuffleKernel, block \\(0,0,0\\).*__shfl_xor_sync "
      "with mask 0xffffffff.*lane 3 has exited");
}

TEST(CudaEmulationDeathTest, ThreadsExitBeforeABarrier) {
  Buffer<int> out(64);
  EXPECT_DEATH(
      {
        FASTLLM_LAUNCH(1, 64, 0, nullptr, exitBeforeBarrierKernel)(out.p);
        cudaDeviceSynchronize();
      },
      "EmulatorTest.cu:[0-9]+: kernel exitBeforeBarrierKernel.*__syncthreads "
      "never completes: 32 of the block's 64 threads have exited");
}

TEST(CudaEmulationDeathTest, LanesDisagreeOnTheMask) {
  Buffer<int> out(32);
  EXPECT_DEATH(
      {
        FASTLLM_LAUNCH(1, 32, 0, nullptr, mismatchedMasksKernel)(out.p);
        cudaDeviceSynchronize();
      },
      // Which lanes meet first depends on the schedule.
      "meets lane [0-9]+ in __shfl_xor_sync with mask|never completes: lane "
      "[0-9]+ has exited");
}

TEST(CudaEmulationDeathTest, ShuffleReadsALaneOutsideItsMask) {
  Buffer<int> out(32);
  EXPECT_DEATH(
      {
        FASTLLM_LAUNCH(1, 32, 0, nullptr, readOutsideMaskKernel)(out.p);
        cudaDeviceSynchronize();
      },
      "reads lane 1[6-9]|reads lane 2|reads lane 3");
}

namespace wmma = nvcuda::wmma;

__global__ void wmmaKernel(float *c, const __nv_bfloat16 *a,
                           const __nv_bfloat16 *b, unsigned ldm) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 1.f);
  wmma::load_matrix_sync(fa, a, ldm);
  wmma::load_matrix_sync(fb, b, ldm);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

TEST(CudaEmulation, WmmaMultipliesAndChecksItsRules) {
  Buffer<__nv_bfloat16> a(16 * 24 + 8), b(16 * 24);
  Buffer<float> c(16 * 16);
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) {
      a.p[i * 24 + k] = __float2bfloat16(float(i - k) / 8);
      b.p[i * 24 + k] =
          __float2bfloat16(float(i + 2 * k) / 16); // B[k][j] at j*24+k
    }
  FASTLLM_LAUNCH(1, 32, 0, nullptr, wmmaKernel)(c.p, a.p, b.p, 24u);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float want = 1.f;
      for (int k = 0; k < 16; ++k)
        want += __bfloat162float(a.p[i * 24 + k]) *
                __bfloat162float(b.p[j * 24 + k]);
      EXPECT_EQ(c.p[i * 16 + j], want) << i << "," << j;
    }
  // A leading dimension that is not a multiple of 16 bytes, a pointer that is
  // not 32-byte aligned.
  EXPECT_DEATH(
      {
        FASTLLM_LAUNCH(1, 32, 0, nullptr, wmmaKernel)(c.p, a.p, b.p, 20u);
        cudaDeviceSynchronize();
      },
      "leading dimension 20 is not a multiple of 16 bytes");
  EXPECT_DEATH(
      {
        FASTLLM_LAUNCH(1, 32, 0, nullptr, wmmaKernel)(c.p, a.p + 8, b.p, 24u);
        cudaDeviceSynchronize();
      },
      "is not 32-byte aligned");
}

/// Lane 0 copies in[0..4) and zeros into dynamic shared memory by cp.async
/// and reads the first element before and after the wait; lanes 0..31 then
/// give ldmatrix rows of different alignment (`misaligned`: lane 5's is 8
/// bytes off).
__global__ void asyncCopyKernel(float *out, const float *in, bool misaligned) {
  namespace m = fastllm::rt::cuda::mma;
  FASTLLM_DYNAMIC_SHARED(float, s, 16);
  if (threadIdx.x == 0) {
    m::cpAsync16(s, in, 16);
    m::cpAsync16(s + 4, in, 0); // nothing read: zeros
    m::cpAsyncCommit();
    out[0] = s[0];
    m::cpAsyncWait<0>();
    out[1] = s[0];
    out[2] = s[4];
  }
  __syncwarp();
  uint32_t r[4];
  const char *rows = reinterpret_cast<const char *>(s) + 64;
  m::ldmatrixX4(r, rows + threadIdx.x * 16 + (misaligned && threadIdx.x == 5 ? 8 : 0));
}

// Tests that cp.async lands at the wait under the in-order schedule (a read
// before it sees the block's 0xff fill, NaN) and at once under the
// adversarial one; that a copy of no source bytes writes zeros; and that an
// ldmatrix row address off 16 bytes is reported.
TEST(CudaEmulation, AsyncCopiesLandAtTheWaitOrAtOnce) {
  Buffer<float> in(4), out(3);
  in.p[0] = 2.5f;
  FASTLLM_LAUNCH(1, 32, 1024, nullptr, asyncCopyKernel)(out.p, in.p, false);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const char *schedule = std::getenv("FASTLLM_CUDA_EMU_SCHEDULE");
  if (schedule && !std::strcmp(schedule, "adversarial"))
    EXPECT_EQ(out.p[0], 2.5f);
  else
    EXPECT_TRUE(std::isnan(out.p[0])) << out.p[0];
  EXPECT_EQ(out.p[1], 2.5f);
  EXPECT_EQ(out.p[2], 0.f);
  EXPECT_DEATH(
      {
        FASTLLM_LAUNCH(1, 32, 1024, nullptr, asyncCopyKernel)(out.p, in.p,
                                                               true);
        cudaDeviceSynchronize();
      },
      "ldmatrix: lane 5's row address .* is not 16-byte aligned");
}

__global__ void addOneKernel(int *x, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    x[i] += 1;
}

__global__ void copyKernel(int *dst, const int *src, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    dst[i] = src[i];
}

TEST(CudaEmulation, EventsOrderStreams) {
  // Two streams: the second copies what the first produced, after an event.
  constexpr int n = 1 << 16;
  Buffer<int> x(n), y(n);
  cudaStream_t first, second;
  ASSERT_EQ(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking),
            cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking),
            cudaSuccess);
  cudaEvent_t done;
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
            cudaSuccess);
  for (int round = 0; round < 20; ++round)
    FASTLLM_LAUNCH(1, 256, 0, first, addOneKernel)(x.p, n);
  ASSERT_EQ(cudaEventRecord(done, first), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(second, done, 0), cudaSuccess);
  FASTLLM_LAUNCH(1, 256, 0, second, copyKernel)(y.p, x.p, n);
  ASSERT_EQ(cudaStreamSynchronize(second), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  for (int i = 0; i < n; i += 997)
    ASSERT_EQ(y.p[i], 20);
  cudaEventDestroy(done);
  cudaStreamDestroy(first);
  cudaStreamDestroy(second);
}

} // namespace
