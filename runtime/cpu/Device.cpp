//===- Device.cpp - the CPU target's device: host memory ------------------===//

#include "runtime/Device.h"
#include "runtime/cpu/Kernels.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <malloc.h>
#include <vector>

using namespace fastllm::rt;

const char *fastllm::rt::deviceTarget() { return "cpu"; }

const char *fastllm::rt::deviceDescription() { return "cpu"; }

std::string fastllm::rt::deviceName() { return ""; }

int64_t fastllm::rt::deviceMemoryInUse() { return -1; }

double fastllm::rt::measuredPeakTflops() {
  constexpr int64_t n = 512;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double best = 0;
  for (int round = 0; round < 4; ++round) { // the first warms up
    auto start = std::chrono::steady_clock::now();
    cpu::matmul<float>(c.data(), a.data(), b.data(), 0, nullptr, nullptr,
                       nullptr, n, n, n, false, false);
    double seconds = std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - start)
                         .count();
    if (round > 0 && seconds > 0)
      best = std::max(best, 2.0 * double(n * n * n) / seconds / 1e12);
  }
  return best;
}

Status fastllm::rt::initDevice(int) {
  // Before any kernel: code built for a newer CPU would stop with SIGILL in
  // the middle of a step.
  const char *missing = cpu::missingCpuFeature();
  if (!missing)
    return Status();
  // A native build's remedy is the portable level; a portable build's level
  // is fixed when fastllm-opt itself is built (x86-64-v3 where the build
  // machine has AVX2, FMA and BMI2, x86-64-v2 otherwise).
  if (std::strncmp(cpu::kernelCpuTarget(), "portable", 8) == 0)
    return errorf("this binary was built for the CPU level %s, whose %s "
                  "instructions this CPU lacks: it is older than the "
                  "portable level of the fastllm-opt that compiled the "
                  "model; compile the model with a fastllm-opt built on a "
                  "machine without %s (its portable level is then lower)",
                  cpu::kernelCpuTarget(), missing, missing);
  return errorf("this binary was built for the CPU level %s, whose %s "
                "instructions this CPU lacks; compile the model again with "
                "--target-cpu portable",
                cpu::kernelCpuTarget(), missing);
}

/// Bytes the C library's allocator has handed out: its heap's chunks in use
/// and the chunks it mapped on its own (large ones).
static int64_t allocatorBytesInUse() {
  struct mallinfo2 info = mallinfo2();
  return int64_t(info.uordblks + info.hblkhd);
}

Expected<Arena> fastllm::rt::allocateArena(int64_t bytes) {
  size_t size = (size_t(bytes) + 63) / 64 * 64;
  // What the allocation really took, measured by the allocator itself (with
  // its header and page rounding), so that the plan's figure is compared
  // with memory the process holds, not with itself.
  int64_t before = allocatorBytesInUse();
  char *data = static_cast<char *>(std::aligned_alloc(64, size));
  if (!data)
    return errorf("cannot allocate the model's %lld-byte arena",
                  (long long)bytes);
  int64_t took = allocatorBytesInUse() - before;
  std::memset(data, 0, size);
  return Arena{ArenaPtr(data, [](char *p) { std::free(p); }), took};
}

void fastllm::rt::synchronizeDevice() {}

Expected<std::unique_ptr<ShardComm>>
fastllm::rt::createShardComm(Communicator &comm, double) {
  return createMpiShardComm(comm); // MPI's own timeout covers it
}

void fastllm::rt::deviceFill(float *out, int64_t n, float value) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i)
    out[i] = value;
}

void fastllm::rt::deviceCopy(float *out, const float *in, int64_t n) {
  if (out != in)
    std::memcpy(out, in, n * sizeof(float));
}

void fastllm::rt::deviceScale(float *out, const float *in, int64_t n,
                              float scale) {
  if (scale == 1.0f)
    return deviceCopy(out, in, n);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i)
    out[i] = in[i] * scale;
}

void fastllm::rt::deviceAddScaled(float *out, const float *in, int64_t n,
                                  float scale) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i)
    out[i] += in[i] * scale;
}

double fastllm::rt::deviceSumOfSquares(const AdamW &opt,
                                       const float *gradShard) {
  return opt.sumOfSquares(gradShard);
}

void fastllm::rt::deviceClipGradients(const AdamW &opt, float *gradShard,
                                      double totalNorm, double maxNorm) {
  opt.clipGradients(gradShard, totalNorm, maxNorm);
}

void fastllm::rt::deviceAdamWStep(const AdamW &opt, float *master,
                                  const float *gradShard, float *m, float *v,
                                  double lr, int64_t t) {
  opt.step(master, gradShard, m, v, lr, t);
}
