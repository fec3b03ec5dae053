//===- DeviceTest.cu - the CUDA side of runtime/Device.h ------------------===//
//
// On a GPU: the device's elementwise work and optimizer equal the CPU's
// (AdamW bit for bit: one per-element function, no fused multiply-add).
// Without one: the GPU tests are skipped with the reason, and the host-side
// contract still holds (initDevice explains there is no GPU).
//
//===----------------------------------------------------------------------===//

#include "runtime/Device.h"
#include "runtime/Optimizer.h"
#include "runtime/Plan.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace fastllm::rt;

namespace {

std::string noGpuReason() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    return cudaGetErrorString(err);
  return count == 0 ? "the driver sees none" : "";
}

} // namespace

TEST(CudaDeviceHost, InitDeviceExplainsAMissingGpu) {
  std::string reason = noGpuReason();
  Status s = initDevice(0);
  if (reason.empty()) {
    EXPECT_TRUE(s.ok()) << s.message();
  } else {
    EXPECT_EQ(s.message(), "no CUDA GPU: " + reason);
  }
  EXPECT_STREQ(deviceTarget(), "cuda");
}

class CudaDevice : public ::testing::Test {
protected:
  void SetUp() override {
    static const std::string reason = noGpuReason();
    if (!reason.empty())
      GTEST_SKIP() << "no CUDA GPU: " << reason;
    ASSERT_TRUE(initDevice(0).ok());
  }
};

/// A one-stage plan of `elements` trainable elements: a decayed matrix and
/// a vector that is not.
namespace {

struct OneStage {
  ParamInfo params[2] = {{"w", 1, 2, {64, 40}, 2560, 0, 1, 1},
                         {"b", 1, 1, {40}, 40, 2560, 1, 0}};
  StageInfo stage = {0, 2624, -1, -1};
  PlanInfo plan{};
  OneStage() {
    plan.numParams = 2;
    plan.params = params;
    plan.paramElements = 2624;
    plan.dataParallel = 1;
    plan.zeroStage = 1;
    plan.numStages = 1;
    plan.stages = &stage;
  }
};

std::vector<float> randomVector(size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(rng);
  return v;
}

} // namespace

TEST_F(CudaDevice, AdamWEqualsTheCpuBitForBit) {
  OneStage model;
  AdamW opt(model.plan, AdamWConfig{}, 0);
  const size_t n = model.plan.paramElements;
  std::vector<float> master = randomVector(n, 1, 0.02f),
                     grads = randomVector(n, 2, 1e-3f);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  Expected<Arena> arena = allocateArena(4 * n * sizeof(float));
  ASSERT_TRUE(arena.ok()) << arena.status().message();
  float *d = reinterpret_cast<float *>(arena->data.get());
  std::copy(master.begin(), master.end(), d);
  std::copy(grads.begin(), grads.end(), d + n);
  for (int64_t t = 1; t <= 3; ++t) {
    opt.step(master.data(), grads.data(), m.data(), v.data(), 1e-3, t);
    deviceAdamWStep(opt, d, d + n, d + 2 * n, d + 3 * n, 1e-3, t);
  }
  synchronizeDevice();
  for (size_t j = 0; j < n; ++j) {
    ASSERT_EQ(d[j], master[j]) << "master " << j;
    ASSERT_EQ(d[2 * n + j], m[j]) << "m " << j;
    ASSERT_EQ(d[3 * n + j], v[j]) << "v " << j;
  }
  double cpu = opt.sumOfSquares(grads.data());
  EXPECT_NEAR(deviceSumOfSquares(opt, d + n), cpu, 1e-12 * cpu);
}

TEST_F(CudaDevice, ClippingAndElementwiseWorkEqualTheCpu) {
  OneStage model;
  AdamW opt(model.plan, AdamWConfig{}, 0);
  const size_t n = model.plan.paramElements;
  std::vector<float> grads = randomVector(n, 3, 1.0f),
                     other = randomVector(n, 4, 1.0f);
  Expected<Arena> arena = allocateArena(2 * n * sizeof(float));
  ASSERT_TRUE(arena.ok());
  float *d = reinterpret_cast<float *>(arena->data.get());
  std::copy(grads.begin(), grads.end(), d);
  std::copy(other.begin(), other.end(), d + n);
  double norm = std::sqrt(opt.sumOfSquares(grads.data()));
  opt.clipGradients(grads.data(), norm, 0.5);
  deviceClipGradients(opt, d, norm, 0.5);
  deviceAddScaled(d + n, d, int64_t(n), 0.25f); // other += clipped * 0.25
  synchronizeDevice();
  for (size_t j = 0; j < n; ++j) {
    ASSERT_EQ(d[j], grads[j]) << j;
    ASSERT_EQ(d[n + j], other[j] + grads[j] * 0.25f) << j;
  }
  deviceScale(d, d, int64_t(n), 2.0f);
  deviceFill(d + n, int64_t(n), 0.0f);
  synchronizeDevice();
  for (size_t j = 0; j < n; ++j) {
    ASSERT_EQ(d[j], grads[j] * 2.0f) << j;
    ASSERT_EQ(d[n + j], 0.0f) << j;
  }
}
