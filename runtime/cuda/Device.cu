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
#ifdef FASTLLM_CUDA_EMULATION
#include "runtime/cuda/emu/Stream.h"
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace fastllm::rt;

const char *fastllm::rt::deviceTarget() { return "cuda"; }

const char *fastllm::rt::deviceDescription() {
#ifdef FASTLLM_CUDA_EMULATION
  static const std::string text = [] {
    const char *schedule = std::getenv("FASTLLM_CUDA_EMU_SCHEDULE");
    return std::string("cuda, emulated on the CPU (schedule ") +
           (schedule && *schedule ? schedule : "inorder") + ", streams " +
           (fastllm::emu::threadedStreams() ? "threads" : "inorder") + ")";
  }();
  return text.c_str();
#else
  return "cuda";
#endif
}

std::string fastllm::rt::deviceName() {
#ifdef FASTLLM_CUDA_EMULATION
  return "";
#else
  int device = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    return "";
  return prop.name;
#endif
}

// A GPU's peak comes from its table (defaultPeakTflops) or --peak-tflops.
double fastllm::rt::measuredPeakTflops() { return 0; }

int64_t fastllm::rt::deviceMemoryInUse() {
  size_t freeBytes = 0, total = 0;
  if (cudaMemGetInfo(&freeBytes, &total) != cudaSuccess)
    return -1;
  return int64_t(total) - int64_t(freeBytes);
}

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
  // Kernels' stream-ordered scratch (cudaMallocAsync) stays in the pool
  // between steps instead of going back to the driver at every sync.
  cudaMemPool_t pool;
  uint64_t keep = UINT64_MAX;
  if (cudaDeviceGetDefaultMemPool(&pool, localRank % count) == cudaSuccess)
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  return Status();
}

Expected<Arena> fastllm::rt::allocateArena(int64_t bytes) {
  // Measured as the drop in the GPU's free memory once the zeroed arena is
  // resident there (cudaMemset runs on the device).
  size_t freeBefore = 0, freeAfter = 0, total = 0;
  void *data = nullptr;
  cudaError_t err = cudaMemGetInfo(&freeBefore, &total);
  // Managed memory larger than the GPU would not fail: it would live partly
  // in host memory, slowly, and the measured figure would hide it. NCCL's
  // buffers, cuBLASLt's workspace and kernels' scratch come after it: keep
  // 1 GiB for them.
  constexpr size_t kHeadroom = size_t(1) << 30;
  if (err == cudaSuccess && size_t(bytes) + kHeadroom > freeBefore)
    return errorf("the model's %lld-byte arena and 1 GiB for the libraries "
                  "do not fit in the GPU's %lld free bytes (of %lld); lower "
                  "--batch-size or raise --dp/--zero-stage",
                  (long long)bytes, (long long)freeBefore, (long long)total);
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
  return Arena{
      ArenaPtr(static_cast<char *>(data), [](char *p) { cudaFree(p); }),
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
    FASTLLM_LAUNCH(blocksFor(n), kThreads, 0, cuda::stream(), scaleKernel)
    (out, in, n, scale, false);
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}

void fastllm::rt::deviceAddScaled(float *out, const float *in, int64_t n,
                                  float scale) {
  if (n > 0)
    FASTLLM_LAUNCH(blocksFor(n), kThreads, 0, cuda::stream(), scaleKernel)
    (out, in, n, scale, true);
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}

//===----------------------------------------------------------------------===//
// The optimizer over this rank's shard: one block per piece of AdamW
//===----------------------------------------------------------------------===//

namespace {

/// AdamW::pieces() on the device, uploaded again only when they change.
struct DevicePieces {
  std::vector<AdamW::Chunk> host; ///< what `chunks` holds
  AdamW::Chunk *chunks = nullptr;
  double *partials = nullptr; ///< one sum of squares per piece
  int64_t count = 0;
};

bool samePieces(const std::vector<AdamW::Chunk> &a,
                const std::vector<AdamW::Chunk> &b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const AdamW::Chunk &x, const AdamW::Chunk &y) {
                      return x.begin == y.begin && x.end == y.end &&
                             x.decay == y.decay;
                    });
}

const DevicePieces &piecesOf(const AdamW &opt) {
  static DevicePieces cached;
  const std::vector<AdamW::Chunk> &host = opt.pieces();
  if (cached.chunks && samePieces(cached.host, host))
    return cached;
  if (cached.chunks) { // the kernels that read them ran on the same stream
    FASTLLM_CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
    FASTLLM_CUDA_CHECK(cudaFree(cached.chunks));
    FASTLLM_CUDA_CHECK(cudaFree(cached.partials));
  }
  cached.host = host;
  cached.count = int64_t(host.size());
  size_t n = std::max<size_t>(host.size(), 1);
  FASTLLM_CUDA_CHECK(cudaMalloc(&cached.chunks, n * sizeof(AdamW::Chunk)));
  FASTLLM_CUDA_CHECK(cudaMalloc(&cached.partials, n * sizeof(double)));
  // On the compute stream (non-blocking: a legacy-stream copy would not be
  // ordered before the kernels that read the table), from the cache's own
  // copy, which outlives the transfer.
  FASTLLM_CUDA_CHECK(cudaMemcpyAsync(cached.chunks, cached.host.data(),
                                     host.size() * sizeof(AdamW::Chunk),
                                     cudaMemcpyHostToDevice, cuda::stream()));
  return cached;
}

/// partials[c] = the sum of grads[j]^2 over piece c, in double.
__global__ void sumOfSquaresKernel(const float *grads,
                                   const AdamW::Chunk *chunks,
                                   double *partials) {
  __shared__ double warpSums[kThreads / 32];
  const AdamW::Chunk c = chunks[blockIdx.x];
  double sum = 0;
  for (int64_t j = c.begin + threadIdx.x; j < c.end; j += blockDim.x)
    sum += double(grads[j]) * grads[j];
  for (int offset = 16; offset > 0; offset /= 2)
    sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0)
    warpSums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kThreads / 32; ++w)
      total += warpSums[w];
    partials[blockIdx.x] = total;
  }
}

__global__ void clipKernel(float *grads, const AdamW::Chunk *chunks,
                           float coef) {
  const AdamW::Chunk c = chunks[blockIdx.x];
  for (int64_t j = c.begin + threadIdx.x; j < c.end; j += blockDim.x)
    grads[j] = __fmul_rn(grads[j], coef);
}

__global__ void adamwKernel(float *master, const float *grads, float *m,
                            float *v, const AdamW::Chunk *chunks,
                            AdamWScalars s) {
  const AdamW::Chunk c = chunks[blockIdx.x];
  for (int64_t j = c.begin + threadIdx.x; j < c.end; j += blockDim.x)
    adamwUpdate(s, c.decay, grads[j], master[j], m[j], v[j]);
}

} // namespace

double fastllm::rt::deviceSumOfSquares(const AdamW &opt,
                                       const float *gradShard) {
  const DevicePieces &p = piecesOf(opt);
  if (!p.count)
    return 0;
  FASTLLM_LAUNCH(unsigned(p.count), kThreads, 0, cuda::stream(),
                 sumOfSquaresKernel)
  (gradShard, p.chunks, p.partials);
  FASTLLM_CUDA_CHECK(cudaGetLastError());
  // Added on the host in piece order, as the CPU does: the result does not
  // depend on timing.
  std::vector<double> partials(p.count);
  FASTLLM_CUDA_CHECK(cudaMemcpyAsync(partials.data(), p.partials,
                                     p.count * sizeof(double),
                                     cudaMemcpyDeviceToHost, cuda::stream()));
  FASTLLM_CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
  double total = 0;
  for (double s : partials)
    total += s;
  return total;
}

void fastllm::rt::deviceClipGradients(const AdamW &opt, float *gradShard,
                                      double totalNorm, double maxNorm) {
  float coef = AdamW::clipCoefficient(totalNorm, maxNorm);
  const DevicePieces &p = piecesOf(opt);
  if (coef == 1.0f || !p.count)
    return;
  FASTLLM_LAUNCH(unsigned(p.count), kThreads, 0, cuda::stream(), clipKernel)
  (gradShard, p.chunks, coef);
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}

void fastllm::rt::deviceAdamWStep(const AdamW &opt, float *master,
                                  const float *gradShard, float *m, float *v,
                                  double lr, int64_t t) {
  const DevicePieces &p = piecesOf(opt);
  if (!p.count)
    return;
  FASTLLM_LAUNCH(unsigned(p.count), kThreads, 0, cuda::stream(), adamwKernel)
  (master, gradShard, m, v, p.chunks, opt.scalarsAt(lr, t));
  FASTLLM_CUDA_CHECK(cudaGetLastError());
}
