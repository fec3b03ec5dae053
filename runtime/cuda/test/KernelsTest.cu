//===- KernelsTest.cu - the CUDA kernels against the CPU kernels ----------===//
//
// Each CUDA kernel runs on small random inputs and is compared with the CPU
// library's kernel (runtime/cpu/Kernels.h) on the same inputs: broadcasting
// and non-contiguous batches, attention lengths that are not a multiple of
// the tile, ignored targets. Floats agree within 1e-5 (1e-4 for matmul and
// attention) of max(|expected|, 1): relative for values above 1, absolute
// below; data movement and gatherGrad agree exactly.
//
// The bf16 kernels run on inputs rounded to bf16 and are compared with the
// CPU's float kernels on the same rounded inputs (the CPU library has no
// bf16), within the tolerances kBf16Tol and kBf16LongTol explain; float
// results of bf16 kernels (losses, lse) within the float tests' tolerances,
// and bf16 data movement, fill, copy, addInto and gatherGrad exactly.
//
// The GPU tests skip themselves, with the reason, where no GPU is visible.
// The host-side tests at the top need none: the scalar math, the plans that
// pack host shapes into kernel parameters, and the element types' choices.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/Kernels.cuh"
#include "runtime/cuda/kernels/Mma.cuh"
#include "runtime/cuda/kernels/Plans.cuh"

#include <gtest/gtest.h>

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace rt = fastllm::rt;
using rt::cuda::detail::AttentionKernel;
using rt::cuda::detail::attentionSharedBytes;
using bf16 = __nv_bfloat16;

} // namespace

//===----------------------------------------------------------------------===//
// Host-side tests
//===----------------------------------------------------------------------===//

// Tests that collapsing merges the dims every operand walks as one and keeps
// a broadcast operand's dims apart from a contiguous one's.
TEST(CudaKernelsHost, CollapseDims) {
  // [2, 3, 4] + [3, 1]: the first input is contiguous, the second steps
  // along dim 1 only.
  int64_t shape[rt::cuda::kMaxRank] = {2, 3, 4};
  int64_t strides[2][rt::cuda::kMaxRank] = {{12, 4, 1}, {0, 1, 0}};
  int rank = rt::cuda::detail::collapseDims(3, shape, 2, strides);
  ASSERT_EQ(rank, 3);
  // [2, 3, 4] + [4]: dims 0 and 1 merge (both operands walk them as one).
  int64_t shape2[rt::cuda::kMaxRank] = {2, 3, 4};
  int64_t strides2[2][rt::cuda::kMaxRank] = {{12, 4, 1}, {0, 0, 1}};
  rank = rt::cuda::detail::collapseDims(3, shape2, 2, strides2);
  ASSERT_EQ(rank, 2);
  EXPECT_EQ(shape2[0], 6);
  EXPECT_EQ(shape2[1], 4);
  EXPECT_EQ(strides2[0][0], 4);
  EXPECT_EQ(strides2[1][0], 0);
  EXPECT_EQ(strides2[0][1], 1);
  EXPECT_EQ(strides2[1][1], 1);
  // Size-1 dims disappear; a contiguous tensor becomes one dim.
  int64_t shape3[rt::cuda::kMaxRank] = {1, 5, 1, 7};
  int64_t strides3[1][rt::cuda::kMaxRank] = {{35, 7, 7, 1}};
  rank = rt::cuda::detail::collapseDims(4, shape3, 1, strides3);
  ASSERT_EQ(rank, 1);
  EXPECT_EQ(shape3[0], 35);
  EXPECT_EQ(strides3[0][0], 1);
}

// Tests the packing of elementwise's host arrays: totals, a scalar, an
// empty output, a transposed operand that stops merging.
TEST(CudaKernelsHost, ElementwiseLayout) {
  const int64_t shape[] = {5, 7};
  const int64_t contiguous[] = {7, 1}, transposed[] = {1, 5};
  const int64_t *strides[] = {contiguous, transposed};
  auto layout = rt::cuda::detail::makeElementwiseLayout<2>(2, shape, strides);
  EXPECT_EQ(layout.total, 35);
  EXPECT_EQ(layout.rank, 2);
  EXPECT_EQ(layout.strides[1][0], 1);
  EXPECT_EQ(layout.strides[1][1], 5);

  const int64_t none[] = {0};
  const int64_t *noStrides[] = {none};
  auto scalar = rt::cuda::detail::makeElementwiseLayout<1>(0, none, noStrides);
  EXPECT_EQ(scalar.total, 1);
  EXPECT_EQ(scalar.rank, 0);

  const int64_t empty[] = {3, 0, 2}, emptyStrides[] = {0, 2, 1};
  const int64_t *emptyOperand[] = {emptyStrides};
  EXPECT_EQ(
      rt::cuda::detail::makeElementwiseLayout<1>(3, empty, emptyOperand).total,
      0);
}

// Tests the launch shapes: at least one block, capped grids, rows per block.
TEST(CudaKernelsHost, LaunchConfig) {
  auto one = rt::cuda::detail::gridFor(1);
  EXPECT_EQ(one.blocks, 1u);
  EXPECT_EQ(one.threads, unsigned(rt::cuda::detail::kBlockThreads));
  EXPECT_EQ(rt::cuda::detail::gridFor(1000).blocks, 4u);
  EXPECT_EQ(rt::cuda::detail::gridFor(1000, 128).blocks, 8u);
  EXPECT_EQ(rt::cuda::detail::gridFor(int64_t(1) << 40).blocks,
            unsigned(rt::cuda::detail::kMaxGridBlocks));
  EXPECT_EQ(rt::cuda::detail::rowsFor(7).blocks, 7u);
  EXPECT_EQ(rt::cuda::detail::rowsFor(0).blocks, 1u);
  EXPECT_EQ(rt::cuda::detail::rowsFor(int64_t(1) << 40).blocks,
            unsigned(rt::cuda::detail::kMaxGridBlocks));
}

// Tests StridedIndex's offsets against a hand-computed walk.
TEST(CudaKernelsHost, StridedIndex) {
  rt::cuda::detail::StridedIndex at{3, {2, 3, 4}, {100, 10, 1}};
  EXPECT_EQ(at.offset(0), 0);
  EXPECT_EQ(at.offset(5), 11);   // (0, 1, 1)
  EXPECT_EQ(at.offset(23), 123); // (1, 2, 3)
  rt::cuda::detail::StridedIndex scalar{};
  EXPECT_EQ(scalar.offset(0), 0);
}

// Tests matmul's batch planning: no batch, a contiguous batch, the fold of
// an A stack onto a shared B (not with transA), broadcasts that need several
// calls, and a batch with gaps between matrices.
TEST(CudaKernelsHost, PlanMatmul) {
  using rt::cuda::detail::planMatmul;
  const int64_t m = 3, k = 4, n = 5;
  auto plain = planMatmul(0, nullptr, nullptr, nullptr, m, k, false);
  EXPECT_EQ(plain.m, m);
  EXPECT_EQ(plain.count, 1);
  EXPECT_EQ(plain.calls, 1);

  const int64_t b1[] = {6}, a1[] = {m * k}, s1[] = {k * n};
  auto batched = planMatmul(1, b1, a1, s1, m, k, false);
  EXPECT_EQ(batched.count, 6);
  EXPECT_EQ(batched.aStride, m * k);
  EXPECT_EQ(batched.bStride, k * n);
  EXPECT_EQ(batched.calls, 1);

  const int64_t b2[] = {2, 3}, a2[] = {3 * m * k, m * k}, s2[] = {0, 0};
  auto folded = planMatmul(2, b2, a2, s2, m, k, false);
  EXPECT_EQ(folded.m, 6 * m);
  EXPECT_EQ(folded.count, 1);
  EXPECT_EQ(folded.calls, 1);
  auto notFolded = planMatmul(2, b2, a2, s2, m, k, true);
  EXPECT_EQ(notFolded.m, m);
  EXPECT_EQ(notFolded.count, 6);
  EXPECT_EQ(notFolded.bStride, 0);

  // A broadcast along dim 1, B along dim 0: nothing merges.
  const int64_t a3[] = {m * k, 0}, s3[] = {0, k * n};
  auto mixed = planMatmul(2, b2, a3, s3, m, k, false);
  EXPECT_EQ(mixed.count, 3);
  EXPECT_EQ(mixed.aStride, 0);
  EXPECT_EQ(mixed.bStride, k * n);
  EXPECT_EQ(mixed.calls, 2);
  EXPECT_EQ(mixed.aFirst.offset(1), m * k);
  EXPECT_EQ(mixed.bFirst.offset(1), 0);

  const int64_t a4[] = {2 * m * k + 5}, s4[] = {k * n};
  auto gaps = planMatmul(1, b1, a4, s4, m, k, false);
  EXPECT_EQ(gaps.count, 6);
  EXPECT_EQ(gaps.aStride, 2 * m * k + 5);
}

// Tests transpose's plans: a 2-D transpose is tiled, a permutation that keeps
// the last dim moves rows, the outer dims of a tiled one are walked.
TEST(CudaKernelsHost, PlanTranspose) {
  using rt::cuda::detail::planTranspose;
  const int64_t shape2[] = {3, 5}, perm2[] = {1, 0};
  auto t2 = planTranspose(2, shape2, perm2);
  ASSERT_TRUE(t2.tiled);
  EXPECT_EQ(t2.qSize, 5);
  EXPECT_EQ(t2.lastSize, 3);
  EXPECT_EQ(t2.qOutStride, 3);
  EXPECT_EQ(t2.lastInStride, 5);
  EXPECT_EQ(t2.numTiles, 1);

  const int64_t shape4[] = {2, 3, 4, 5}, rows[] = {1, 0, 2, 3};
  auto keep = planTranspose(4, shape4, rows);
  EXPECT_FALSE(keep.tiled);
  EXPECT_EQ(keep.rank, 3); // [3, 2, 20]
  EXPECT_EQ(keep.dims[2], 20);
  EXPECT_EQ(keep.inStrides[2], 1);

  const int64_t moveLast[] = {0, 3, 1, 2};
  auto tiled = planTranspose(4, shape4, moveLast);
  ASSERT_TRUE(tiled.tiled);
  EXPECT_EQ(tiled.rank, 3); // [2, 5, 12]
  EXPECT_EQ(tiled.qSize, 5);
  EXPECT_EQ(tiled.lastSize, 12);
  EXPECT_EQ(tiled.outerIn.rank, 1);
  EXPECT_EQ(tiled.outerIn.strides[0], 60);
  EXPECT_EQ(tiled.outerOut.strides[0], 60);
  EXPECT_EQ(tiled.numTiles, 2);

  const int64_t big[] = {40, 70};
  EXPECT_EQ(planTranspose(2, big, perm2).numTiles, 3 * 2);
}

// Tests reduce's plans: a reduced contiguous dim, a kept one, merging of
// neighbours with the same role, and size-1 dims.
TEST(CudaKernelsHost, PlanReduce) {
  using rt::cuda::detail::planReduce;
  const int64_t shape[] = {2, 3, 4};
  const bool middle[] = {false, true, false};
  auto p = planReduce(3, shape, middle);
  EXPECT_EQ(p.keptCount, 8);
  EXPECT_EQ(p.redCount, 3);
  EXPECT_FALSE(p.innerReduced);
  ASSERT_EQ(p.kept.rank, 2);
  EXPECT_EQ(p.kept.strides[0], 12);
  EXPECT_EQ(p.kept.strides[1], 1);
  ASSERT_EQ(p.red.rank, 1);
  EXPECT_EQ(p.red.strides[0], 4);
  EXPECT_EQ(p.kept.offset(5), 12 + 1); // output (1, 1)

  const bool last2[] = {false, true, true};
  auto q = planReduce(3, shape, last2);
  EXPECT_TRUE(q.innerReduced);
  ASSERT_EQ(q.red.rank, 1);
  EXPECT_EQ(q.red.shape[0], 12);

  const int64_t ones[] = {3, 1, 4};
  const bool onlyOne[] = {false, true, false};
  auto r = planReduce(3, ones, onlyOne);
  EXPECT_EQ(r.red.rank, 0);
  EXPECT_EQ(r.keptCount, 12);
}

// Tests the column sums' parts at GPT-2 124M's shapes (8192 rows; bias and
// LayerNorm columns 768, 2304, 3072; tiles of 32 columns for norms and
// strided reduce, 256 for reduceColumnsKernel): every launch fills the 132
// SMs of an H100 with at least 64 rows a part, a small problem is not cut,
// and the count depends on the shape alone.
TEST(CudaKernelsHost, ColumnPartsFillTheGpu) {
  using rt::cuda::detail::columnParts;
  for (int64_t cols : {768, 2304, 3072})
    for (int64_t tile : {32, 256}) {
      const int64_t tiles = (cols + tile - 1) / tile;
      const int64_t parts = columnParts(tiles, 8192);
      SCOPED_TRACE(::testing::Message()
                   << cols << " columns, tiles of " << tile << ": " << tiles
                   << " x " << parts << " blocks");
      EXPECT_GE(tiles * parts, 132);
      EXPECT_LE(tiles * parts, 2 * 1024);
      EXPECT_GE(8192 / parts, 64);
    }
  EXPECT_EQ(columnParts(3, 100), 1);  // 100 rows: one part
  EXPECT_EQ(columnParts(1, 64), 1);
  EXPECT_EQ(columnParts(2, 10000), 156);  // rows / 64 bounds it
  EXPECT_EQ(columnParts(24, 8192), 43);
}

// Tests that gatherGrad's bands depend on the shapes only, make about 1024
// blocks, and never exceed the table's rows.
TEST(CudaKernelsHost, GatherGradBands) {
  using rt::cuda::detail::gatherGradBands;
  EXPECT_EQ(gatherGradBands(1, 50304), 1024);
  EXPECT_EQ(gatherGradBands(1, 5), 5);
  EXPECT_EQ(gatherGradBands(3, 5000), 342);
  EXPECT_EQ(gatherGradBands(4096, 100), 1);
  EXPECT_EQ(gatherGradBands(0, 0), 1);
}

// Tests the attention kernels' shared memory: the sizes of the arrays each
// kernel carves, so a head dim of 128 fits every GPU since sm_80.
TEST(CudaKernelsHost, AttentionSharedBytes) {
  // Forward: q [32][64], k [32][65], v and o [32][64], p [8][32].
  EXPECT_EQ(attentionSharedBytes(AttentionKernel::Forward, 64, 64),
            (32 * (64 + 65 + 64 + 64) + 256) * sizeof(float));
  // dQ: q, dout, k [32][65], v [32][65], dq, ds [8][32].
  EXPECT_EQ(attentionSharedBytes(AttentionKernel::QueryGrad, 64, 64),
            (32 * (64 + 64 + 65 + 65 + 64) + 256) * sizeof(float));
  // dK/dV: k, v, q [32][65], dout [32][65], lse, D, dk, dv, p, ds.
  EXPECT_EQ(attentionSharedBytes(AttentionKernel::KeyValueGrad, 64, 64),
            (32 * (64 + 64 + 65 + 65 + 1 + 1 + 64 + 64) + 512) * sizeof(float));
  for (auto kernel : {AttentionKernel::Forward, AttentionKernel::QueryGrad,
                      AttentionKernel::KeyValueGrad})
    EXPECT_LE(attentionSharedBytes(kernel, 128, 128), size_t(163 * 1024));
  // Odd head dims need no padding.
  EXPECT_EQ(attentionSharedBytes(AttentionKernel::Forward, 17, 5),
            (32 * (17 + 17 + 5 + 5) + 256) * sizeof(float));

  // Tensor cores, 64-row tiles. Forward: bf16 q, k, v [64][64], fp32
  // scores [64][64], bf16 P [64][64], fp32 o [64][64].
  const size_t tile = 64 * 64;
  EXPECT_EQ(attentionSharedBytes(AttentionKernel::TcForward, 64, 64),
            3 * tile * 2 + tile * 4 + tile * 2 + tile * 4);
  // dQ: bf16 q, k, v, dout; fp32 scores and dP; bf16 dS; fp32 dq; lse, D.
  EXPECT_EQ(attentionSharedBytes(AttentionKernel::TcQueryGrad, 64, 64),
            4 * tile * 2 + 2 * tile * 4 + tile * 2 + tile * 4 + 2 * 64 * 4);
  // dK/dV: the same plus bf16 P and fp32 dv.
  EXPECT_EQ(attentionSharedBytes(AttentionKernel::TcKeyValueGrad, 64, 64),
            4 * tile * 2 + 2 * tile * 4 + 2 * tile * 2 + 2 * tile * 4 +
                2 * 64 * 4);
  // d = dv = 128 fits an H100 (227 KiB per block).
  for (auto kernel : {AttentionKernel::TcForward, AttentionKernel::TcQueryGrad,
                      AttentionKernel::TcKeyValueGrad})
    EXPECT_LE(attentionSharedBytes(kernel, 128, 128), size_t(227 * 1024));
  EXPECT_TRUE(rt::cuda::detail::tensorCoreAttentionShape(64, 64));
  EXPECT_TRUE(rt::cuda::detail::tensorCoreAttentionShape(16, 128));
  EXPECT_FALSE(rt::cuda::detail::tensorCoreAttentionShape(40, 16));
  EXPECT_FALSE(rt::cuda::detail::tensorCoreAttentionShape(64, 17));
  EXPECT_FALSE(rt::cuda::detail::tensorCoreAttentionShape(0, 16));
}

// Tests the element types' host-side choices: matmul's cuBLASLt data type for
// float and bf16, and that a bf16 kernel computes in float (the others in
// their own type).
TEST(CudaKernelsHost, ElementTypes) {
  using rt::cuda::detail::ComputeType;
  using rt::cuda::detail::gemmDataType;
  EXPECT_EQ(gemmDataType<float>(), CUDA_R_32F);
  EXPECT_EQ(gemmDataType<bf16>(), CUDA_R_16BF);
  EXPECT_TRUE((std::is_same_v<ComputeType<bf16>, float>));
  EXPECT_TRUE((std::is_same_v<ComputeType<float>, float>));
  EXPECT_TRUE((std::is_same_v<ComputeType<double>, double>));
  EXPECT_TRUE((std::is_same_v<ComputeType<int64_t>, int64_t>));
  // widen is exact: every bf16 is a float.
  const bf16 x = __float2bfloat16(-1.375f);
  EXPECT_EQ(rt::cuda::detail::widen(x), -1.375f);
  EXPECT_EQ(rt::cuda::detail::widen(2.5f), 2.5f);
}

//===----------------------------------------------------------------------===//
// GPU test helpers
//===----------------------------------------------------------------------===//

namespace {

/// Why no GPU can run the tests, or "" when one can.
std::string noGpuReason() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    return cudaGetErrorString(err);
  return count == 0 ? "the driver sees none" : "";
}

class CudaKernels : public ::testing::Test {
protected:
  void SetUp() override {
    static const std::string reason = noGpuReason();
    if (!reason.empty())
      GTEST_SKIP() << "no CUDA GPU: " << reason;
  }
};

/// A device buffer holding a copy of a host vector (bool included).
template <typename T> class DeviceArray {
public:
  explicit DeviceArray(size_t n) : n(n) {
    if (n)
      EXPECT_EQ(cudaMalloc(&ptr, n * sizeof(T)), cudaSuccess);
  }
  explicit DeviceArray(const std::vector<T> &host) : DeviceArray(host.size()) {
    std::unique_ptr<T[]> staged(new T[n]);
    std::copy(host.begin(), host.end(), staged.get());
    if (n)
      EXPECT_EQ(
          cudaMemcpy(ptr, staged.get(), n * sizeof(T), cudaMemcpyHostToDevice),
          cudaSuccess);
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray &) = delete;
  DeviceArray &operator=(const DeviceArray &) = delete;

  T *get() const { return ptr; }

  /// The contents once the kernels' stream is done.
  std::vector<T> download() const {
    EXPECT_EQ(cudaStreamSynchronize(rt::cuda::stream()), cudaSuccess);
    std::unique_ptr<T[]> staged(new T[n]);
    if (n)
      EXPECT_EQ(
          cudaMemcpy(staged.get(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost),
          cudaSuccess);
    return std::vector<T>(staged.get(), staged.get() + n);
  }

private:
  size_t n;
  T *ptr = nullptr;
};

std::mt19937 &rng() {
  static std::mt19937 generator(1234);
  return generator;
}

template <typename T = float>
std::vector<T> randomReals(size_t n, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (T &x : v)
    x = static_cast<T>(dist(rng()));
  return v;
}

template <typename T> std::vector<T> randomInts(size_t n, T lo, T hi) {
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  std::vector<T> v(n);
  for (T &x : v)
    x = static_cast<T>(dist(rng()));
  return v;
}

/// got ≈ want elementwise: |got - want| <= tol·max(|want|, 1), NaN matching
/// NaN and infinities matching exactly.
template <typename T>
::testing::AssertionResult near(const std::vector<T> &got,
                                const std::vector<T> &want, double tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << "size " << got.size() << ", expected " << want.size();
  std::ostringstream bad;
  int mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = want[i];
    bool ok =
        (std::isnan(g) && std::isnan(w)) ||
        (std::isinf(w) ? g == w
                       : std::abs(g - w) <= tol * std::max(std::abs(w), 1.0));
    if (!ok && mismatches++ < 8)
      bad << "\n  [" << i << "] " << g << ", expected " << w;
  }
  if (mismatches)
    return ::testing::AssertionFailure()
           << mismatches << " of " << got.size() << " differ:" << bad.str();
  return ::testing::AssertionSuccess();
}

rt::cpu::Reduction cpuReduction(rt::cuda::Reduction r) {
  return r == rt::cuda::Reduction::None  ? rt::cpu::Reduction::None
         : r == rt::cuda::Reduction::Sum ? rt::cpu::Reduction::Sum
                                         : rt::cpu::Reduction::Mean;
}

rt::cpu::ReduceKind cpuKind(rt::cuda::ReduceKind k) {
  return k == rt::cuda::ReduceKind::Sum    ? rt::cpu::ReduceKind::Sum
         : k == rt::cuda::ReduceKind::Mean ? rt::cpu::ReduceKind::Mean
                                           : rt::cpu::ReduceKind::Max;
}

int64_t product(const std::vector<int64_t> &shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t(1),
                         std::multiplies<int64_t>());
}

/// Tolerances of bf16 results against the CPU's float kernel on the same
/// bf16 inputs, in near()'s units. A bf16 kernel computes in float and
/// rounds each result once, which moves it by at most 2^-9 of its size; the
/// float computation itself differs from the CPU's by ~1e-5 (the float
/// tests' tolerance). kBf16Tol, about 2^-8, is twice the rounding bound.
/// Matmul and attention sum long products in another order than the CPU
/// (cuBLASLt's tensor-core tiles, attention's tiles) and already differ by
/// up to 1e-4 in float: kBf16LongTol allows those sums' float differences
/// on top of the rounding.
constexpr double kBf16Tol = 4e-3;
constexpr double kBf16LongTol = 1e-2;

/// Rounds xs to bf16 in place and returns the bf16 values: the CPU's float
/// kernels then see exactly the inputs of the bf16 kernels.
std::vector<bf16> roundToBf16(std::vector<float> &xs) {
  std::vector<bf16> rounded(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    rounded[i] = __float2bfloat16(xs[i]);
    xs[i] = __bfloat162float(rounded[i]);
  }
  return rounded;
}

/// The values of xs as floats (exact).
std::vector<float> widened(const std::vector<bf16> &xs) {
  std::vector<float> out(xs.size());
  for (size_t i = 0; i < xs.size(); ++i)
    out[i] = __bfloat162float(xs[i]);
  return out;
}

/// xs rounded to bf16, as floats: what a bf16 kernel that computed xs in
/// float stores.
std::vector<float> roundedToBf16(std::vector<float> xs) {
  roundToBf16(xs);
  return xs;
}

/// The bits of xs: bf16 data movement is checked against the CPU's uint16_t
/// kernels, which move the same bits.
std::vector<uint16_t> bitsOf(const std::vector<bf16> &xs) {
  std::vector<uint16_t> bits(xs.size());
  std::memcpy(bits.data(), xs.data(), xs.size() * sizeof(uint16_t));
  return bits;
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

struct Add {
  __host__ __device__ float operator()(float x0, float x1) const {
    return x0 + x1;
  }
};
struct AddGeluGpu {
  __host__ __device__ float operator()(float x0, float x1) const {
    return rt::cuda::gelu(x0 + x1, false);
  }
};
struct AddGeluCpu {
  float operator()(float x0, float x1) const {
    return rt::cpu::gelu(x0 + x1, false);
  }
};
struct Less {
  __host__ __device__ bool operator()(float x0, float x1) const {
    return x0 < x1;
  }
};
struct Select {
  __host__ __device__ float operator()(bool x0, float x1, float x2) const {
    return x0 ? x1 : x2;
  }
};
struct ToFloat {
  __host__ __device__ float operator()(int64_t x0) const {
    return static_cast<float>(x0);
  }
};
struct TwiceXPlusY {
  __host__ __device__ float operator()(float x0, float x1) const {
    return 2.f * x0 + x1;
  }
};

} // namespace

// Tests a broadcast add fused with GELU: [2, 3, 4] + [3, 1].
TEST_F(CudaKernels, ElementwiseBroadcast) {
  const int64_t shape[] = {2, 3, 4}, sa[] = {12, 4, 1}, sb[] = {0, 1, 0};
  auto a = randomReals(24), b = randomReals(3);
  DeviceArray<float> da(a), db(b), dout(24);
  rt::cuda::elementwise(dout.get(), 3, shape, AddGeluGpu{},
                        rt::cuda::In<float>{da.get(), sa},
                        rt::cuda::In<float>{db.get(), sb});
  std::vector<float> want(24);
  rt::cpu::elementwise(want.data(), 3, shape, AddGeluCpu{},
                       rt::cpu::In<float>{a.data(), sa},
                       rt::cpu::In<float>{b.data(), sb});
  EXPECT_TRUE(near(dout.download(), want, 1e-5));
}

// Tests an operand read transposed, a rank-8 broadcast, and a scalar.
TEST_F(CudaKernels, ElementwiseStridedAndScalar) {
  const int64_t shape[] = {5, 7}, sa[] = {7, 1}, sb[] = {1, 5};
  auto a = randomReals(35), b = randomReals(35);
  DeviceArray<float> da(a), db(b), dout(35);
  rt::cuda::elementwise(dout.get(), 2, shape, Add{},
                        rt::cuda::In<float>{da.get(), sa},
                        rt::cuda::In<float>{db.get(), sb});
  std::vector<float> want(35);
  rt::cpu::elementwise(want.data(), 2, shape, Add{},
                       rt::cpu::In<float>{a.data(), sa},
                       rt::cpu::In<float>{b.data(), sb});
  EXPECT_TRUE(near(dout.download(), want, 1e-5));

  const int64_t shape8[] = {2, 1, 3, 2, 1, 2, 3, 2};
  const int64_t s8a[] = {72, 72, 24, 12, 12, 6, 2, 1};
  // y is [2, 3] read transposed: dim 2 walks its columns, dim 5 its rows.
  const int64_t s8b[] = {0, 0, 1, 0, 0, 3, 0, 0};
  auto x = randomReals(144), y = randomReals(6);
  DeviceArray<float> dx(x), dy(y), d8(144);
  rt::cuda::elementwise(d8.get(), 8, shape8, Add{},
                        rt::cuda::In<float>{dx.get(), s8a},
                        rt::cuda::In<float>{dy.get(), s8b});
  std::vector<float> want8(144);
  rt::cpu::elementwise(want8.data(), 8, shape8, Add{},
                       rt::cpu::In<float>{x.data(), s8a},
                       rt::cpu::In<float>{y.data(), s8b});
  EXPECT_TRUE(near(d8.download(), want8, 1e-5));

  const int64_t none[] = {0};
  std::vector<float> s = {1.25f}, t = {-3.5f};
  DeviceArray<float> ds(s), dt(t), dscalar(1);
  rt::cuda::elementwise(dscalar.get(), 0, none, Add{},
                        rt::cuda::In<float>{ds.get(), none},
                        rt::cuda::In<float>{dt.get(), none});
  EXPECT_EQ(dscalar.download(), std::vector<float>{-2.25f});
}

struct MulAdd {
  __host__ __device__ float operator()(float a, float b, float c) const {
    return a * b + c;
  }
};

// Tests the vectorised elementwise path (inner dims of 8k, contiguous or
// broadcast along them, aligned) against the CPU: a [6, 40] matrix times a
// row vector plus a column vector, in float and into bf16; and the layouts
// it must leave to the scalar kernel: a misaligned input, an outer stride
// that is not a multiple of 8 (a slice), an inner stride of 2.
TEST_F(CudaKernels, ElementwiseVectors) {
  const int64_t shape[] = {6, 40}, sa[] = {40, 1}, sRow[] = {0, 1},
                sCol[] = {1, 0};
  auto a = randomReals(6 * 80), row = randomReals(40), col = randomReals(6);
  DeviceArray<float> da(a), drow(row), dcol(col), dout(240);
  DeviceArray<bf16> dout16(240);
  std::vector<float> want(240);
  struct Layout {
    int64_t offset;
    const int64_t *strides;
    const char *what;
  };
  const int64_t sliced[] = {41, 1}, everyOther[] = {80, 2};
  for (Layout l : {Layout{0, sa, "vectors"}, Layout{1, sa, "misaligned"},
                   Layout{0, sliced, "outer stride 41"},
                   Layout{0, everyOther, "inner stride 2"}}) {
    SCOPED_TRACE(l.what);
    rt::cuda::elementwise(dout.get(), 2, shape, MulAdd{},
                          rt::cuda::In<float>{da.get() + l.offset, l.strides},
                          rt::cuda::In<float>{drow.get(), sRow},
                          rt::cuda::In<float>{dcol.get(), sCol});
    rt::cpu::elementwise(want.data(), 2, shape, MulAdd{},
                         rt::cpu::In<float>{a.data() + l.offset, l.strides},
                         rt::cpu::In<float>{row.data(), sRow},
                         rt::cpu::In<float>{col.data(), sCol});
    EXPECT_TRUE(near(dout.download(), want, 1e-5));
  }
  rt::cuda::elementwise(dout16.get(), 2, shape, MulAdd{},
                        rt::cuda::In<float>{da.get(), sa},
                        rt::cuda::In<float>{drow.get(), sRow},
                        rt::cuda::In<float>{dcol.get(), sCol});
  rt::cpu::elementwise(want.data(), 2, shape, MulAdd{},
                       rt::cpu::In<float>{a.data(), sa},
                       rt::cpu::In<float>{row.data(), sRow},
                       rt::cpu::In<float>{col.data(), sCol});
  EXPECT_TRUE(near(widened(dout16.download()), want, kBf16Tol));
}

// Tests bool and integer operands and results: compare, select, cast.
TEST_F(CudaKernels, ElementwiseTypes) {
  const int64_t shape[] = {4, 6}, s[] = {6, 1}, col[] = {1, 0};
  auto a = randomReals(24), b = randomReals(24);
  DeviceArray<float> da(a), db(b);
  DeviceArray<bool> mask(24);
  rt::cuda::elementwise(mask.get(), 2, shape, Less{},
                        rt::cuda::In<float>{da.get(), s},
                        rt::cuda::In<float>{db.get(), s});
  std::vector<bool> wantMask(24);
  for (int i = 0; i < 24; ++i)
    wantMask[i] = a[i] < b[i];
  EXPECT_EQ(mask.download(), wantMask);

  std::vector<bool> rowMask = {true, false, false, true};
  DeviceArray<bool> dRowMask(rowMask);
  DeviceArray<float> selected(24);
  rt::cuda::elementwise(selected.get(), 2, shape, Select{},
                        rt::cuda::In<bool>{dRowMask.get(), col},
                        rt::cuda::In<float>{da.get(), s},
                        rt::cuda::In<float>{db.get(), s});
  std::vector<float> wantSelected(24);
  for (int i = 0; i < 24; ++i)
    wantSelected[i] = rowMask[i / 6] ? a[i] : b[i];
  EXPECT_EQ(selected.download(), wantSelected);

  auto ints = randomInts<int64_t>(24, -1000, 1000);
  DeviceArray<int64_t> dints(ints);
  DeviceArray<float> cast(24);
  rt::cuda::elementwise(cast.get(), 2, shape, ToFloat{},
                        rt::cuda::In<int64_t>{dints.get(), s});
  EXPECT_EQ(cast.download(), std::vector<float>(ints.begin(), ints.end()));
}

// Tests an in-place update: the output is the first input.
TEST_F(CudaKernels, ElementwiseInPlace) {
  const int64_t shape[] = {1000}, s[] = {1}, bcast[] = {0};
  auto a = randomReals(1000), b = randomReals(1);
  DeviceArray<float> da(a), db(b);
  rt::cuda::elementwise(da.get(), 1, shape, TwiceXPlusY{},
                        rt::cuda::In<float>{da.get(), s},
                        rt::cuda::In<float>{db.get(), bcast});
  std::vector<float> want(1000);
  rt::cpu::elementwise(want.data(), 1, shape, TwiceXPlusY{},
                       rt::cpu::In<float>{a.data(), s},
                       rt::cpu::In<float>{b.data(), bcast});
  EXPECT_TRUE(near(da.download(), want, 1e-5));
}

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

namespace {

struct MatmulCase {
  const char *name;
  std::vector<int64_t> batch, aStrides, bStrides;
  int64_t m, n, k;
};

/// Elements a strided batch of matrices spans (strides ≥ 0).
int64_t span(const std::vector<int64_t> &batch,
             const std::vector<int64_t> &strides, int64_t matrix) {
  int64_t last = 0;
  for (size_t d = 0; d < batch.size(); ++d)
    last += (batch[d] - 1) * strides[d];
  return last + matrix;
}

/// No batch, a contiguous batch, an A stack on a shared B, broadcasts on
/// either side, broadcasts that need several cuBLASLt calls, batches with
/// gaps, and k = 0.
std::vector<MatmulCase> matmulCases() {
  const int64_t m = 13, n = 9, k = 21, mk = m * k, kn = k * n;
  return {
      {"plain", {}, {}, {}, m, n, k},
      {"large", {}, {}, {}, 67, 45, 129},
      {"batched", {4}, {mk}, {kn}, m, n, k},
      {"shared B", {2, 3}, {3 * mk, mk}, {0, 0}, m, n, k},
      {"shared A", {3}, {0}, {kn}, m, n, k},
      {"mixed", {2, 3}, {mk, 0}, {0, kn}, m, n, k},
      {"three dims", {2, 2, 3}, {6 * mk, 3 * mk, mk}, {0, 3 * kn, kn}, m, n, k},
      {"gaps", {3}, {2 * mk + 5}, {kn + 3}, m, n, k},
      {"k = 0", {2}, {0}, {0}, m, n, 0},
  };
}

/// Runs matmul on T = float or bf16 for every case and transpose
/// combination, and compares with the CPU's float matmul on the same inputs
/// (rounded to bf16 for bf16).
template <typename T> void checkMatmul(double tol) {
  for (const MatmulCase &c : matmulCases())
    for (bool transA : {false, true})
      for (bool transB : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << c.name << " transA=" << transA << " transB=" << transB);
        const int batchRank = int(c.batch.size());
        auto a = randomReals(span(c.batch, c.aStrides, c.m * c.k));
        auto b = randomReals(span(c.batch, c.bStrides, c.k * c.n));
        const int64_t cSize = product(c.batch) * c.m * c.n;
        std::vector<float> got;
        if constexpr (std::is_same_v<T, bf16>) {
          DeviceArray<bf16> da(roundToBf16(a)), db(roundToBf16(b)), dc(cSize);
          rt::cuda::matmul(dc.get(), da.get(), db.get(), batchRank,
                           c.batch.data(), c.aStrides.data(), c.bStrides.data(),
                           c.m, c.n, c.k, transA, transB);
          got = widened(dc.download());
        } else {
          DeviceArray<float> da(a), db(b), dc(cSize);
          rt::cuda::matmul(dc.get(), da.get(), db.get(), batchRank,
                           c.batch.data(), c.aStrides.data(), c.bStrides.data(),
                           c.m, c.n, c.k, transA, transB);
          got = dc.download();
        }
        std::vector<float> want(cSize);
        rt::cpu::matmul(want.data(), a.data(), b.data(), batchRank,
                        c.batch.data(), c.aStrides.data(), c.bStrides.data(),
                        c.m, c.n, c.k, transA, transB);
        EXPECT_TRUE(near(got, want, tol));

        // addMatmul: the product, unrounded (fp32 for either T), added into
        // an fp32 buffer; compared with the CPU's addMatmul on the same
        // (rounded) inputs, so within the float tolerance.
        auto acc = randomReals(cSize);
        std::vector<float> wantAcc = acc;
        DeviceArray<float> dacc(acc);
        if constexpr (std::is_same_v<T, bf16>) {
          // a and b hold bf16 values already (rounded above).
          DeviceArray<bf16> da(roundToBf16(a)), db(roundToBf16(b));
          rt::cuda::addMatmul(dacc.get(), da.get(), db.get(), batchRank,
                              c.batch.data(), c.aStrides.data(),
                              c.bStrides.data(), c.m, c.n, c.k, transA, transB);
        } else {
          DeviceArray<float> da(a), db(b);
          rt::cuda::addMatmul(dacc.get(), da.get(), db.get(), batchRank,
                              c.batch.data(), c.aStrides.data(),
                              c.bStrides.data(), c.m, c.n, c.k, transA, transB);
        }
        rt::cpu::addMatmul(wantAcc.data(), a.data(), b.data(), batchRank,
                           c.batch.data(), c.aStrides.data(), c.bStrides.data(),
                           c.m, c.n, c.k, transA, transB);
        EXPECT_TRUE(near(dacc.download(), wantAcc, 1e-4)) << "addMatmul";
      }
}

/// The column-major strided-batched GEMM `g` describes, on the host, the
/// way cuBLASLt defines it: D = op(first)·op(second), each product's D
/// rows·cols elements after the last.
void referenceLtGemm(const rt::cuda::detail::LtGemm &g, const float *first,
                     const float *second, float *d) {
  auto at = [](const rt::cuda::detail::LtOperand &x, const float *p,
               int64_t row, int64_t col) {
    // op(x)(row, col): stored transposed when x.trans.
    return x.trans ? p[col + row * x.ld] : p[row + col * x.ld];
  };
  for (int64_t i = 0; i < g.count; ++i)
    for (int64_t col = 0; col < g.cols; ++col)
      for (int64_t row = 0; row < g.rows; ++row) {
        double sum = 0;
        for (int64_t l = 0; l < g.depth; ++l)
          sum += double(at(g.first, first + i * g.first.stride, row, l)) *
                 at(g.second, second + i * g.second.stride, l, col);
        d[i * g.rows * g.cols + row + col * g.rows] = float(sum);
      }
}

} // namespace

// Tests the row-major to column-major mapping the cuBLASLt calls are made
// with: for every case and transpose combination, the GEMMs planMatmul and
// planLtGemm describe (cuBLASLt's column-major semantics, on the host) give
// the CPU matmul's product.
TEST(CudaKernelsHost, LtGemmMapping) {
  namespace detail = rt::cuda::detail;
  for (const MatmulCase &c : matmulCases())
    for (bool transA : {false, true})
      for (bool transB : {false, true}) {
        if (c.k == 0)
          continue; // matmul fills zeros without a GEMM
        SCOPED_TRACE(::testing::Message()
                     << c.name << " transA=" << transA << " transB=" << transB);
        const int batchRank = int(c.batch.size());
        auto a = randomReals(span(c.batch, c.aStrides, c.m * c.k));
        auto b = randomReals(span(c.batch, c.bStrides, c.k * c.n));
        const int64_t cSize = product(c.batch) * c.m * c.n;
        const detail::MatmulPlan plan =
            detail::planMatmul(batchRank, c.batch.data(), c.aStrides.data(),
                               c.bStrides.data(), c.m, c.k, transA);
        const detail::LtGemm gemm =
            detail::planLtGemm(plan, c.n, c.k, transA, transB);
        EXPECT_EQ(plan.calls * gemm.count * gemm.rows * gemm.cols, cSize);
        std::vector<float> got(cSize, std::nanf(""));
        for (int64_t call = 0; call < plan.calls; ++call)
          referenceLtGemm(gemm, b.data() + plan.bFirst.offset(call),
                          a.data() + plan.aFirst.offset(call),
                          got.data() + call * plan.count * plan.m * c.n);
        std::vector<float> want(cSize);
        rt::cpu::matmul(want.data(), a.data(), b.data(), batchRank,
                        c.batch.data(), c.aStrides.data(), c.bStrides.data(),
                        c.m, c.n, c.k, transA, transB);
        EXPECT_TRUE(near(got, want, 1e-5));
      }
}

// Tests matmul and addMatmul against the CPU for every transpose combination
// and every batch layout of matmulCases.
TEST_F(CudaKernels, Matmul) { checkMatmul<float>(1e-4); }

// Tests the bf16 matmul (bf16 A, B and C, fp32 accumulation) and addMatmul
// (bf16 A and B, fp32 accumulator) the same way.
TEST_F(CudaKernels, Bf16Matmul) { checkMatmul<bf16>(kBf16LongTol); }

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

namespace {

template <typename T>
void checkTranspose(const std::vector<int64_t> &shape,
                    const std::vector<int64_t> &perm) {
  SCOPED_TRACE(::testing::Message() << "rank " << shape.size());
  const int64_t n = product(shape);
  auto in = randomInts<int64_t>(n, 0, 100);
  std::vector<T> host(in.begin(), in.end());
  DeviceArray<T> din(host), dout(n);
  rt::cuda::transpose(dout.get(), din.get(), int(shape.size()), shape.data(),
                      perm.data());
  std::unique_ptr<T[]> want(new T[n]), staged(new T[n]);
  std::copy(host.begin(), host.end(), staged.get());
  rt::cpu::transpose(want.get(), staged.get(), int(shape.size()), shape.data(),
                     perm.data());
  EXPECT_EQ(dout.download(), std::vector<T>(want.get(), want.get() + n));
}

} // namespace

// Tests transpose through tiles (partial ones too) and through row copies,
// for several element types, and a scalar.
TEST_F(CudaKernels, Transpose) {
  checkTranspose<float>({3, 5}, {1, 0});
  checkTranspose<float>({40, 70}, {1, 0});
  checkTranspose<float>({2, 3, 4, 5}, {0, 3, 1, 2});
  checkTranspose<float>({2, 3, 4, 5}, {1, 0, 2, 3});
  checkTranspose<float>({2, 1, 33, 3}, {2, 0, 3, 1});
  checkTranspose<float>({}, {});
  checkTranspose<int64_t>({33, 2, 65}, {2, 1, 0});
  checkTranspose<double>({7, 9}, {1, 0});
  checkTranspose<bool>({5, 34}, {1, 0});
  checkTranspose<int8_t>({3, 4, 5}, {2, 0, 1});
  checkTranspose<uint16_t>({6, 40}, {1, 0});
}

// Tests slice with a negative stride and its gradient.
TEST_F(CudaKernels, SliceAndSliceGrad) {
  const int64_t inShape[] = {4, 6, 5}, start[] = {1, 5, 0},
                stride[] = {2, -2, 1}, outShape[] = {2, 3, 5};
  auto in = randomReals(120), dout = randomReals(30);
  DeviceArray<float> din(in), dsliced(30), ddout(dout), dgrad(120);
  rt::cuda::slice(dsliced.get(), din.get(), 3, inShape, start, stride,
                  outShape);
  std::vector<float> want(30);
  rt::cpu::slice(want.data(), in.data(), 3, inShape, start, stride, outShape);
  EXPECT_EQ(dsliced.download(), want);

  rt::cuda::sliceGrad(dgrad.get(), ddout.get(), 3, inShape, start, stride,
                      outShape);
  std::vector<float> wantGrad(120);
  rt::cpu::sliceGrad(wantGrad.data(), dout.data(), 3, inShape, start, stride,
                     outShape);
  EXPECT_EQ(dgrad.download(), wantGrad);
}

// Tests concat along a middle dim, with an empty input that has no buffer.
TEST_F(CudaKernels, Concat) {
  const int64_t outer = 3, inner = 4, sizes[] = {2, 0, 3};
  auto a = randomReals(outer * 2 * inner), c = randomReals(outer * 3 * inner);
  DeviceArray<float> da(a), dc(c), dout(outer * 5 * inner);
  const float *ins[] = {da.get(), nullptr, dc.get()};
  rt::cuda::concat(dout.get(), 3, ins, sizes, outer, inner);
  std::vector<float> want(outer * 5 * inner);
  const float *hostIns[] = {a.data(), nullptr, c.data()};
  rt::cpu::concat(want.data(), 3, hostIns, sizes, outer, inner);
  EXPECT_EQ(dout.download(), want);

  // Rows of whole 16-byte chunks go in chunks, the others element by
  // element, in one call: sizes 2, 1, 3 of inner 2 are 32, 8 (and then
  // misaligned) and 24 bytes.
  const int64_t mixed[] = {2, 1, 3};
  auto x = randomReals(7 * 4), y = randomReals(7 * 2), z = randomReals(7 * 6);
  DeviceArray<float> dx(x), dy(y), dz(z), dmixed(7 * 12);
  const float *mixedIns[] = {dx.get(), dy.get(), dz.get()};
  rt::cuda::concat(dmixed.get(), 3, mixedIns, mixed, 7, 2);
  std::vector<float> wantMixed(7 * 12);
  const float *hostMixed[] = {x.data(), y.data(), z.data()};
  rt::cpu::concat(wantMixed.data(), 3, hostMixed, mixed, 7, 2);
  EXPECT_EQ(dmixed.download(), wantMixed);
}

// Tests gather with negative indices (int64) and with inner = 1 (int32).
TEST_F(CudaKernels, Gather) {
  auto table = randomReals(2 * 5 * 3);
  std::vector<int64_t> idx = {0, -1, 3, 3, -5};
  DeviceArray<float> dtable(table), dout(2 * 5 * 3);
  DeviceArray<int64_t> didx(idx);
  rt::cuda::gather(dout.get(), dtable.get(), didx.get(), 2, 5, 5, 3);
  std::vector<float> want(2 * 5 * 3);
  rt::cpu::gather(want.data(), table.data(), idx.data(), 2, 5, 5, 3);
  EXPECT_EQ(dout.download(), want);

  auto ints = randomInts<int32_t>(7 * 11, -50, 50);
  auto idx32 = randomInts<int32_t>(9, 0, 10);
  DeviceArray<int32_t> dints(ints), didx32(idx32), dout32(7 * 9);
  rt::cuda::gather(dout32.get(), dints.get(), didx32.get(), 7, 11, 9, 1);
  std::vector<int32_t> want32(7 * 9);
  rt::cpu::gather(want32.data(), ints.data(), idx32.data(), 7, 11, 9, 1);
  EXPECT_EQ(dout32.download(), want32);
}

// Tests gatherGrad with repeated and negative indices, in float and double:
// the additions happen in the CPU's order, so the results are identical.
TEST_F(CudaKernels, GatherGrad) {
  std::vector<int64_t> idx = {1, 1, 4, 1, 0, -1, 2};
  auto dout = randomReals(2 * 7 * 33);
  DeviceArray<float> ddout(dout), ddin(2 * 6 * 33);
  DeviceArray<int64_t> didx(idx);
  rt::cuda::gatherGrad(ddin.get(), ddout.get(), didx.get(), 2, 6, 7, 33);
  std::vector<float> want(2 * 6 * 33);
  rt::cpu::gatherGrad(want.data(), dout.data(), idx.data(), 2, 6, 7, 33);
  EXPECT_EQ(ddin.download(), want);

  // An embedding-like table: many indices into few rows, many bands.
  auto idx32 = randomInts<int32_t>(300, 0, 49);
  auto dout64 = randomReals<double>(300 * 16);
  DeviceArray<int32_t> didx32(idx32);
  DeviceArray<double> ddout64(dout64), ddin64(50 * 16);
  rt::cuda::gatherGrad(ddin64.get(), ddout64.get(), didx32.get(), 1, 50, 300,
                       16);
  std::vector<double> want64(50 * 16);
  rt::cpu::gatherGrad(want64.data(), dout64.data(), idx32.data(), 1, 50, 300,
                      16);
  EXPECT_EQ(ddin64.download(), want64);

  // A vocabulary-like table: bands of 2-3 rows each, indices in 3 chunks of
  // a block's width, a row wider than the block.
  auto idxWide = randomInts<int64_t>(600, -2999, 2999);
  idxWide[10] = idxWide[500] = idxWide[599] = 7; // one row, three chunks
  auto doutWide = randomReals(600 * 300);
  DeviceArray<int64_t> didxWide(idxWide);
  DeviceArray<float> ddoutWide(doutWide), ddinWide(3000 * 300);
  rt::cuda::gatherGrad(ddinWide.get(), ddoutWide.get(), didxWide.get(), 1,
                       3000, 600, 300);
  std::vector<float> wantWide(3000 * 300);
  rt::cpu::gatherGrad(wantWide.data(), doutWide.data(), idxWide.data(), 1,
                      3000, 600, 300);
  EXPECT_EQ(ddinWide.download(), wantWide);
}

// Tests fill, copy and addInto.
TEST_F(CudaKernels, FillCopyAddInto) {
  auto a = randomReals(1001), b = randomReals(1001);
  DeviceArray<float> da(a), db(b), dcopy(1001);
  rt::cuda::fill(dcopy.get(), 1001, 2.5f);
  EXPECT_EQ(dcopy.download(), std::vector<float>(1001, 2.5f));
  rt::cuda::copy(dcopy.get(), da.get(), 1001);
  EXPECT_EQ(dcopy.download(), a);
  rt::cuda::addInto(da.get(), db.get(), 1001);
  std::vector<float> want = a;
  rt::cpu::addInto(want.data(), b.data(), 1001);
  EXPECT_EQ(da.download(), want);
}

//===----------------------------------------------------------------------===//
// Reductions, softmax, normalisation
//===----------------------------------------------------------------------===//

namespace {

template <typename T>
void checkReduce(const std::vector<int64_t> &shape,
                 const std::vector<bool> &reducedDims,
                 rt::cuda::ReduceKind kind, const std::vector<T> &in,
                 double tol) {
  SCOPED_TRACE(::testing::Message() << "kind " << int(kind) << " dims "
                                    << ::testing::PrintToString(reducedDims));
  const int rank = int(shape.size());
  std::unique_ptr<bool[]> reduced(new bool[rank + 1]);
  int64_t kept = 1;
  for (int d = 0; d < rank; ++d) {
    reduced[d] = reducedDims[d];
    kept *= reducedDims[d] ? 1 : shape[d];
  }
  DeviceArray<T> din(in), dout(kept);
  rt::cuda::reduce(dout.get(), din.get(), rank, shape.data(), reduced.get(),
                   kind);
  std::vector<T> want(kept);
  rt::cpu::reduce(want.data(), in.data(), rank, shape.data(), reduced.get(),
                  cpuKind(kind));
  if constexpr (std::is_floating_point_v<T>)
    EXPECT_TRUE(near(dout.download(), want, tol));
  else
    EXPECT_EQ(dout.download(), want);
}

} // namespace

// Tests reduce over every subset of dims of a 3-D tensor, each kind, several
// types, size-1 and empty dims, and NaN propagation by Max.
TEST_F(CudaKernels, Reduce) {
  using Kind = rt::cuda::ReduceKind;
  const std::vector<int64_t> shape = {4, 5, 70};
  auto x = randomReals(4 * 5 * 70, -3, 3);
  for (int mask = 0; mask < 8; ++mask)
    for (Kind kind : {Kind::Sum, Kind::Mean, Kind::Max})
      checkReduce<float>(shape,
                         {bool(mask & 4), bool(mask & 2), bool(mask & 1)}, kind,
                         x, 1e-5);
  auto xd = randomReals<double>(4 * 5 * 70);
  checkReduce<double>(shape, {true, false, true}, Kind::Mean, xd, 1e-12);
  auto xi = randomInts<int32_t>(4 * 5 * 70, -100, 100);
  checkReduce<int32_t>(shape, {false, true, false}, Kind::Sum, xi, 0);
  checkReduce<int32_t>(shape, {false, false, true}, Kind::Mean, xi, 0);
  auto xl = randomInts<int64_t>(4 * 5 * 70, -100000, 100000);
  checkReduce<int64_t>(shape, {true, true, false}, Kind::Max, xl, 0);

  auto ones = randomReals(12);
  checkReduce<float>({3, 1, 4}, {false, true, false}, Kind::Sum, ones, 1e-5);
  for (Kind kind : {Kind::Sum, Kind::Mean, Kind::Max})
    checkReduce<float>({3, 0, 2}, {false, true, false}, kind, {}, 1e-5);

  auto withNan = randomReals(4 * 5 * 70);
  withNan[123] = std::numeric_limits<float>::quiet_NaN();
  checkReduce<float>(shape, {false, false, true}, Kind::Max, withNan, 1e-5);
  checkReduce<float>(shape, {true, false, false}, Kind::Max, withNan, 1e-5);

  // Enough rows that the columns' sums are cut into parts (columnParts):
  // 300 rows, 11 column tiles -> 4 parts, the last one short; a NaN in the
  // third part.
  const std::vector<int64_t> tall = {300, 5, 70};
  auto xt = randomReals(300 * 5 * 70, -3, 3);
  for (Kind kind : {Kind::Sum, Kind::Mean, Kind::Max})
    checkReduce<float>(tall, {true, false, false}, kind, xt, 1e-5);
  xt[230 * 350 + 17] = std::numeric_limits<float>::quiet_NaN();
  checkReduce<float>(tall, {true, false, false}, Kind::Max, xt, 1e-5);

  // A [rows, cols] matrix over its rows with cols a multiple of 8: 8
  // columns per thread (reduceColumnsKernel), in parts (600 rows) and
  // not (70 rows), a NaN for Max; 264 columns: a second, partial tile.
  for (int64_t rows : {600, 70}) {
    const std::vector<int64_t> matrix = {rows, 264};
    auto xm = randomReals(rows * 264, -3, 3);
    for (Kind kind : {Kind::Sum, Kind::Mean, Kind::Max})
      checkReduce<float>(matrix, {true, false}, kind, xm, 1e-5);
    xm[(rows - 3) * 264 + 260] = std::numeric_limits<float>::quiet_NaN();
    checkReduce<float>(matrix, {true, false}, Kind::Max, xm, 1e-5);
  }
  auto xi32 = randomInts<int32_t>(600 * 264, -100, 100);
  checkReduce<int32_t>({600, 264}, {true, false}, Kind::Sum, xi32, 0);
}

// Tests softmax and log-softmax along the last dim and a middle dim, with
// -inf entries and an all -inf row (NaN, as on the CPU), and the gradients.
TEST_F(CudaKernels, SoftmaxAndGrad) {
  struct Case {
    int64_t outer, n, inner;
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (Case c : {Case{3, 37, 1}, Case{2, 3000, 1}, Case{2, 5, 7}})
    for (bool log : {false, true}) {
      SCOPED_TRACE(::testing::Message() << c.outer << "x" << c.n << "x"
                                        << c.inner << " log=" << log);
      const int64_t size = c.outer * c.n * c.inner;
      auto x = randomReals(size, -4, 4);
      x[1] = -inf;
      if (c.inner == 1)
        for (int64_t i = 0; i < c.n; ++i)
          x[c.n + i] = -inf; // the second row
      DeviceArray<float> dx(x), dy(size);
      rt::cuda::softmax(dy.get(), dx.get(), c.outer, c.n, c.inner, log);
      std::vector<float> y(size);
      rt::cpu::softmax(y.data(), x.data(), c.outer, c.n, c.inner, log);
      EXPECT_TRUE(near(dy.download(), y, 1e-5));

      // The gradient at a finite point.
      auto finite = randomReals(size, -4, 4);
      rt::cpu::softmax(y.data(), finite.data(), c.outer, c.n, c.inner, log);
      auto g = randomReals(size);
      DeviceArray<float> dyFinite(y), dg(g), ddx(size);
      rt::cuda::softmaxGrad(ddx.get(), dyFinite.get(), dg.get(), c.outer, c.n,
                            c.inner, log);
      std::vector<float> want(size);
      rt::cpu::softmaxGrad(want.data(), y.data(), g.data(), c.outer, c.n,
                           c.inner, log);
      EXPECT_TRUE(near(ddx.download(), want, 1e-5));
    }
}

namespace {

/// layerNorm and its gradient on `rows` x `cols` against the CPU's.
void checkLayerNorm(int64_t rows, int64_t cols) {
  SCOPED_TRACE(::testing::Message() << rows << " rows");
  const float eps = 1e-5f;
  auto x = randomReals(rows * cols, 2, 5), scale = randomReals(cols),
       bias = randomReals(cols), dy = randomReals(rows * cols);
  DeviceArray<float> dx(x), dscale(scale), dbias(bias), ddy(dy);
  for (bool withBias : {true, false}) {
    SCOPED_TRACE(withBias ? "bias" : "no bias");
    DeviceArray<float> out(rows * cols), gx(rows * cols), gscale(cols),
        gbias(cols);
    rt::cuda::layerNorm(out.get(), dx.get(), dscale.get(),
                        withBias ? dbias.get() : nullptr, rows, cols, eps);
    std::vector<float> want(rows * cols);
    rt::cpu::layerNorm(want.data(), x.data(), scale.data(),
                       withBias ? bias.data() : nullptr, rows, cols, eps);
    EXPECT_TRUE(near(out.download(), want, 1e-5));

    rt::cuda::layerNormGrad(gx.get(), gscale.get(),
                            withBias ? gbias.get() : nullptr, dx.get(),
                            dscale.get(), ddy.get(), rows, cols, eps);
    std::vector<float> wantX(rows * cols), wantScale(cols), wantBias(cols);
    rt::cpu::layerNormGrad(wantX.data(), wantScale.data(),
                           withBias ? wantBias.data() : nullptr, x.data(),
                           scale.data(), dy.data(), rows, cols, eps);
    EXPECT_TRUE(near(gx.download(), wantX, 1e-5));
    EXPECT_TRUE(near(gscale.download(), wantScale, 1e-5));
    if (withBias)
      EXPECT_TRUE(near(gbias.download(), wantBias, 1e-5));
  }
}

} // namespace

// Tests layerNorm (with and without bias) and its gradient (with and
// without dbias) on rows whose mean is far from 0; 7 rows, and 700, whose
// dscale and dbias are summed in 10 parts (columnParts).
TEST_F(CudaKernels, LayerNormAndGrad) {
  for (int64_t rows : {7, 700})
    checkLayerNorm(rows, 300);
  for (int64_t rows : {9, 700})
    checkLayerNorm(rows, 264); // a warp per row, 8 elements at a time
}

// Tests rmsNorm and its gradient, with more rows than a column block has
// lanes.
TEST_F(CudaKernels, RmsNormAndGrad) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 70},
                            std::pair<int64_t, int64_t>{37, 264}}) {
    SCOPED_TRACE(::testing::Message() << rows << " x " << cols);
    const float eps = 1e-6f;
    auto x = randomReals(rows * cols), scale = randomReals(cols),
         dy = randomReals(rows * cols);
    DeviceArray<float> dx(x), dscale(scale), ddy(dy), out(rows * cols),
        gx(rows * cols), gscale(cols);
    rt::cuda::rmsNorm(out.get(), dx.get(), dscale.get(), rows, cols, eps);
    std::vector<float> want(rows * cols);
    rt::cpu::rmsNorm(want.data(), x.data(), scale.data(), rows, cols, eps);
    EXPECT_TRUE(near(out.download(), want, 1e-5));

    rt::cuda::rmsNormGrad(gx.get(), gscale.get(), dx.get(), dscale.get(),
                          ddy.get(), rows, cols, eps);
    std::vector<float> wantX(rows * cols), wantScale(cols);
    rt::cpu::rmsNormGrad(wantX.data(), wantScale.data(), x.data(), scale.data(),
                         dy.data(), rows, cols, eps);
    EXPECT_TRUE(near(gx.download(), wantX, 1e-5));
    EXPECT_TRUE(near(gscale.download(), wantScale, 1e-5));
  }
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

// Tests causal attention and its gradients: one token, lengths below, at and
// above multiples of the 32-row tile, and head dims that differ (d ≠ dv, odd
// ones, more than a warp's width).
TEST_F(CudaKernels, CausalAttentionAndGrad) {
  struct Case {
    int64_t batch, t, d, dv;
  };
  for (Case c : {Case{2, 1, 8, 8}, Case{3, 33, 16, 24}, Case{2, 64, 32, 32},
                 Case{2, 70, 64, 64}, Case{1, 129, 40, 17}}) {
    SCOPED_TRACE(::testing::Message() << "batch " << c.batch << " t " << c.t
                                      << " d " << c.d << " dv " << c.dv);
    const float scale = 1.f / std::sqrt(float(c.d));
    const int64_t qSize = c.batch * c.t * c.d, vSize = c.batch * c.t * c.dv;
    auto q = randomReals(qSize, -2, 2), k = randomReals(qSize, -2, 2),
         v = randomReals(vSize), dout = randomReals(vSize);
    DeviceArray<float> dq(q), dk(k), dv(v), ddout(dout), out(vSize),
        lse(c.batch * c.t);
    rt::cuda::causalAttention(out.get(), lse.get(), dq.get(), dk.get(),
                              dv.get(), c.batch, c.t, c.d, c.dv, scale);
    std::vector<float> wantOut(vSize), wantLse(c.batch * c.t);
    rt::cpu::causalAttention(wantOut.data(), wantLse.data(), q.data(), k.data(),
                             v.data(), c.batch, c.t, c.d, c.dv, scale);
    EXPECT_TRUE(near(out.download(), wantOut, 1e-4));
    EXPECT_TRUE(near(lse.download(), wantLse, 1e-4));

    // The gradients from the CPU's forward, so that both start equal.
    DeviceArray<float> cpuOut(wantOut), cpuLse(wantLse), gq(qSize), gk(qSize),
        gv(vSize);
    rt::cuda::causalAttentionGrad(gq.get(), gk.get(), gv.get(), dq.get(),
                                  dk.get(), dv.get(), cpuOut.get(),
                                  cpuLse.get(), ddout.get(), c.batch, c.t, c.d,
                                  c.dv, scale);
    std::vector<float> wantQ(qSize), wantK(qSize), wantV(vSize);
    rt::cpu::causalAttentionGrad(wantQ.data(), wantK.data(), wantV.data(),
                                 q.data(), k.data(), v.data(), wantOut.data(),
                                 wantLse.data(), dout.data(), c.batch, c.t, c.d,
                                 c.dv, scale);
    EXPECT_TRUE(near(gq.download(), wantQ, 1e-4));
    EXPECT_TRUE(near(gk.download(), wantK, 1e-4));
    EXPECT_TRUE(near(gv.download(), wantV, 1e-4));
  }
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

namespace {

template <typename Idx>
void checkLosses(bool hasIgnore, int64_t classes = 37) {
  using R = rt::cuda::Reduction;
  const int64_t rows = 19, ignoreIndex = -100;
  SCOPED_TRACE(::testing::Message() << "Idx bytes " << sizeof(Idx)
                                    << " hasIgnore " << hasIgnore << " classes "
                                    << classes);
  auto logits = randomReals(rows * classes, -3, 3);
  auto targets = randomInts<Idx>(rows, 0, classes - 1);
  if (hasIgnore)
    targets[2] = targets[7] = targets[8] = Idx(ignoreIndex);
  std::vector<float> logProbs(rows * classes);
  rt::cpu::softmax(logProbs.data(), logits.data(), rows, classes, 1, true);
  DeviceArray<float> dlogits(logits), dlogProbs(logProbs);
  DeviceArray<Idx> dtargets(targets);
  auto dlossRows = randomReals(rows);
  for (R r : {R::None, R::Sum, R::Mean}) {
    SCOPED_TRACE(::testing::Message() << "reduction " << int(r));
    const int64_t lossSize = r == R::None ? rows : 1;
    std::vector<float> dloss =
        r == R::None ? dlossRows : std::vector<float>{0.7f};
    DeviceArray<float> loss(lossSize), nll(lossSize), ddloss(dloss),
        grad(rows * classes), nllGrad(rows * classes);

    rt::cuda::crossEntropy(loss.get(), dlogits.get(), dtargets.get(), rows,
                           classes, hasIgnore, ignoreIndex, r);
    std::vector<float> want(lossSize);
    rt::cpu::crossEntropy(want.data(), logits.data(), targets.data(), rows,
                          classes, hasIgnore, ignoreIndex, cpuReduction(r));
    EXPECT_TRUE(near(loss.download(), want, 1e-5));

    rt::cuda::crossEntropyGrad(grad.get(), dlogits.get(), dtargets.get(),
                               ddloss.get(), rows, classes, hasIgnore,
                               ignoreIndex, r);
    std::vector<float> wantGrad(rows * classes);
    rt::cpu::crossEntropyGrad(wantGrad.data(), logits.data(), targets.data(),
                              dloss.data(), rows, classes, hasIgnore,
                              ignoreIndex, cpuReduction(r));
    EXPECT_TRUE(near(grad.download(), wantGrad, 1e-5));

    rt::cuda::nllLoss(nll.get(), dlogProbs.get(), dtargets.get(), rows, classes,
                      hasIgnore, ignoreIndex, r);
    rt::cpu::nllLoss(want.data(), logProbs.data(), targets.data(), rows,
                     classes, hasIgnore, ignoreIndex, cpuReduction(r));
    EXPECT_TRUE(near(nll.download(), want, 1e-5));

    rt::cuda::nllLossGrad(nllGrad.get(), dtargets.get(), ddloss.get(), rows,
                          classes, hasIgnore, ignoreIndex, r);
    rt::cpu::nllLossGrad(wantGrad.data(), targets.data(), dloss.data(), rows,
                         classes, hasIgnore, ignoreIndex, cpuReduction(r));
    EXPECT_TRUE(near(nllGrad.download(), wantGrad, 1e-5));
  }
}

} // namespace

// Tests cross entropy and NLL, forward and backward, for every reduction,
// with and without ignored targets, for both index types; rows of 37
// classes (element by element) and of 2000 (16-byte vectors, 2 per thread).
TEST_F(CudaKernels, Losses) {
  checkLosses<int64_t>(false);
  checkLosses<int64_t>(true);
  checkLosses<int32_t>(true);
  checkLosses<int64_t>(true, 2000);
}

// Tests that a mean over targets that are all ignored is NaN (0/0), as in
// PyTorch, and that the rows get no gradient.
TEST_F(CudaKernels, LossesAllIgnored) {
  const int64_t rows = 4, classes = 5;
  auto logits = randomReals(rows * classes);
  std::vector<int64_t> targets(rows, -1);
  std::vector<float> dloss = {1.f};
  DeviceArray<float> dlogits(logits), loss(1), ddloss(dloss),
      grad(rows * classes);
  DeviceArray<int64_t> dtargets(targets);
  rt::cuda::crossEntropy(loss.get(), dlogits.get(), dtargets.get(), rows,
                         classes, true, -1, rt::cuda::Reduction::Mean);
  EXPECT_TRUE(std::isnan(loss.download()[0]));
  rt::cuda::crossEntropyGrad(grad.get(), dlogits.get(), dtargets.get(),
                             ddloss.get(), rows, classes, true, -1,
                             rt::cuda::Reduction::Mean);
  EXPECT_EQ(grad.download(), std::vector<float>(rows * classes, 0.f));
}

//===----------------------------------------------------------------------===//
// bf16
//===----------------------------------------------------------------------===//

namespace {

// Functors as the emitter writes them for bf16 tensors: operands and result
// in the element type, float math taking bf16 through its conversions.
struct AddBf16 {
  __host__ __device__ bf16 operator()(bf16 x0, bf16 x1) const {
    return x0 + x1;
  }
};
struct GeluBf16 {
  __host__ __device__ bf16 operator()(bf16 x0) const {
    return rt::cuda::gelu(x0, false);
  }
};
struct GeluCpu {
  float operator()(float x0) const { return rt::cpu::gelu(x0, false); }
};
struct Bf16ToFloat {
  __host__ __device__ float operator()(bf16 x0) const {
    return static_cast<float>(x0);
  }
};
struct FloatToBf16 {
  __host__ __device__ bf16 operator()(float x0) const {
    return static_cast<bf16>(x0);
  }
};

} // namespace

// Tests elementwise on bf16: a broadcast add and a GELU on bf16 operands,
// a float functor (Add) on bf16 operands with a bf16 result, and the two
// casts, which are exact (bf16 to float) and round to nearest even (float to
// bf16) as the host does.
TEST_F(CudaKernels, Bf16Elementwise) {
  const int64_t shape[] = {2, 3, 4}, sa[] = {12, 4, 1}, sb[] = {0, 1, 0};
  auto a = randomReals(24, -3, 3), b = randomReals(3);
  DeviceArray<bf16> da(roundToBf16(a)), db(roundToBf16(b)), sum(24),
      floatSum(24), act(24);
  rt::cuda::elementwise(sum.get(), 3, shape, AddBf16{},
                        rt::cuda::In<bf16>{da.get(), sa},
                        rt::cuda::In<bf16>{db.get(), sb});
  rt::cuda::elementwise(floatSum.get(), 3, shape, Add{},
                        rt::cuda::In<bf16>{da.get(), sa},
                        rt::cuda::In<bf16>{db.get(), sb});
  std::vector<float> want(24);
  rt::cpu::elementwise(want.data(), 3, shape, Add{},
                       rt::cpu::In<float>{a.data(), sa},
                       rt::cpu::In<float>{b.data(), sb});
  EXPECT_TRUE(near(widened(sum.download()), want, kBf16Tol));
  EXPECT_EQ(widened(floatSum.download()), roundedToBf16(want));

  rt::cuda::elementwise(act.get(), 3, shape, GeluBf16{},
                        rt::cuda::In<bf16>{da.get(), sa});
  rt::cpu::elementwise(want.data(), 3, shape, GeluCpu{},
                       rt::cpu::In<float>{a.data(), sa});
  EXPECT_TRUE(near(widened(act.download()), want, kBf16Tol));

  DeviceArray<float> wide(24);
  rt::cuda::elementwise(wide.get(), 3, shape, Bf16ToFloat{},
                        rt::cuda::In<bf16>{da.get(), sa});
  EXPECT_EQ(wide.download(), a);
  auto f = randomReals(24);
  DeviceArray<float> df(f);
  DeviceArray<bf16> narrow(24);
  rt::cuda::elementwise(narrow.get(), 3, shape, FloatToBf16{},
                        rt::cuda::In<float>{df.get(), sa});
  EXPECT_EQ(widened(narrow.download()), roundedToBf16(f));
}

// Tests bf16 transpose (tiled and by rows), slice, sliceGrad, concat and
// gather (both index types), called as generated code calls them, against
// the CPU's uint16_t kernels on the same bits.
TEST_F(CudaKernels, Bf16DataMovement) {
  auto values = randomReals(4 * 6 * 5, -4, 4);
  const std::vector<bf16> x = roundToBf16(values);
  const std::vector<uint16_t> bits = bitsOf(x);
  DeviceArray<bf16> dx(x);

  const int64_t shape[] = {4, 6, 5}, tiled[] = {2, 0, 1}, rows[] = {1, 0, 2};
  for (const int64_t *perm : {tiled, rows}) {
    DeviceArray<bf16> out(120);
    rt::cuda::transpose<bf16>(out.get(), dx.get(), 3, shape, perm);
    std::vector<uint16_t> want(120);
    rt::cpu::transpose(want.data(), bits.data(), 3, shape, perm);
    EXPECT_EQ(bitsOf(out.download()), want);
  }

  const int64_t start[] = {1, 5, 0}, stride[] = {2, -2, 1}, small[] = {2, 3, 5};
  DeviceArray<bf16> sliced(30), grad(120);
  rt::cuda::slice(sliced.get(), dx.get(), 3, shape, start, stride, small);
  std::vector<uint16_t> wantSliced(30), wantGrad(120);
  rt::cpu::slice(wantSliced.data(), bits.data(), 3, shape, start, stride,
                 small);
  EXPECT_EQ(bitsOf(sliced.download()), wantSliced);
  rt::cuda::sliceGrad(grad.get(), sliced.get(), 3, shape, start, stride, small);
  rt::cpu::sliceGrad(wantGrad.data(), wantSliced.data(), 3, shape, start,
                     stride, small);
  EXPECT_EQ(bitsOf(grad.download()), wantGrad);

  // [4, 6, 5] and [4, 6, 5] along the middle dim.
  const int64_t sizes[] = {6, 6};
  const bf16 *ins[] = {dx.get(), grad.get()};
  DeviceArray<bf16> joined(240);
  rt::cuda::concat(joined.get(), 2, ins, sizes, 4, 5);
  const uint16_t *hostIns[] = {bits.data(), wantGrad.data()};
  std::vector<uint16_t> wantJoined(240);
  rt::cpu::concat(wantJoined.data(), 2, hostIns, sizes, 4, 5);
  EXPECT_EQ(bitsOf(joined.download()), wantJoined);

  std::vector<int64_t> idx = {0, -1, 3, 3, -5};
  auto idx32 = randomInts<int32_t>(7, 0, 5);
  DeviceArray<int64_t> didx(idx);
  DeviceArray<int32_t> didx32(idx32);
  DeviceArray<bf16> gathered(4 * 5 * 5), gathered32(4 * 7 * 5);
  rt::cuda::gather<bf16, int64_t>(gathered.get(), dx.get(), didx.get(), 4, 6, 5,
                                  5);
  rt::cuda::gather<bf16, int32_t>(gathered32.get(), dx.get(), didx32.get(), 4,
                                  6, 7, 5);
  std::vector<uint16_t> wantGathered(4 * 5 * 5), wantGathered32(4 * 7 * 5);
  rt::cpu::gather(wantGathered.data(), bits.data(), idx.data(), 4, 6, 5, 5);
  rt::cpu::gather(wantGathered32.data(), bits.data(), idx32.data(), 4, 6, 7, 5);
  EXPECT_EQ(bitsOf(gathered.download()), wantGathered);
  EXPECT_EQ(bitsOf(gathered32.download()), wantGathered32);
}

// Tests that the bf16 gatherGrad sums in float in the CPU's order and rounds
// once: exactly the CPU's float gradient, rounded to bf16.
TEST_F(CudaKernels, Bf16GatherGrad) {
  std::vector<int64_t> idx = {1, 1, 4, 1, 0, -1, 2};
  auto dout = randomReals(2 * 7 * 33);
  DeviceArray<bf16> ddout(roundToBf16(dout)), ddin(2 * 6 * 33);
  DeviceArray<int64_t> didx(idx);
  rt::cuda::gatherGrad<bf16, int64_t>(ddin.get(), ddout.get(), didx.get(), 2, 6,
                                      7, 33);
  std::vector<float> want(2 * 6 * 33);
  rt::cpu::gatherGrad(want.data(), dout.data(), idx.data(), 2, 6, 7, 33);
  EXPECT_EQ(widened(ddin.download()), roundedToBf16(want));

  auto idx32 = randomInts<int32_t>(300, 0, 49);
  auto dout32 = randomReals(300 * 16);
  DeviceArray<int32_t> didx32(idx32);
  DeviceArray<bf16> ddout32(roundToBf16(dout32)), ddin32(50 * 16);
  rt::cuda::gatherGrad<bf16, int32_t>(ddin32.get(), ddout32.get(), didx32.get(),
                                      1, 50, 300, 16);
  std::vector<float> want32(50 * 16);
  rt::cpu::gatherGrad(want32.data(), dout32.data(), idx32.data(), 1, 50, 300,
                      16);
  EXPECT_EQ(widened(ddin32.download()), roundedToBf16(want32));
}

// Tests fill with a float literal, copy and addInto on bf16 (the sum in
// float, rounded once), and addInto of a bf16 gradient into a float one.
TEST_F(CudaKernels, Bf16FillCopyAddInto) {
  auto a = randomReals(1001), b = randomReals(1001), acc = randomReals(1001);
  DeviceArray<bf16> da(roundToBf16(a)), db(roundToBf16(b)), dcopy(1001);
  rt::cuda::fill(dcopy.get(), 1001, 2.5f);
  EXPECT_EQ(widened(dcopy.download()), std::vector<float>(1001, 2.5f));
  rt::cuda::copy(dcopy.get(), da.get(), 1001);
  EXPECT_EQ(widened(dcopy.download()), a);

  rt::cuda::addInto(da.get(), db.get(), 1001);
  std::vector<float> want(1001);
  for (int i = 0; i < 1001; ++i)
    want[i] = a[i] + b[i];
  EXPECT_EQ(widened(da.download()), roundedToBf16(want));

  DeviceArray<float> dacc(acc);
  rt::cuda::addInto(dacc.get(), db.get(), 1001);
  for (int i = 0; i < 1001; ++i)
    want[i] = acc[i] + b[i];
  EXPECT_EQ(dacc.download(), want);
}

// Tests that dropout draws the CPU's masks bit for bit: float and bf16 (the
// CPU's float result on the same rounded inputs, rounded once), a splat
// input, and samples whose size is not a multiple of the four words a
// Philox call makes.
TEST_F(CudaKernels, Dropout) {
  const int64_t samples = 3, per = 1001, n = samples * per;
  const uint32_t threshold = rt::dropoutThreshold(0.3f);
  const float scale = rt::dropoutScale(0.3f);
  auto x = randomReals(n);
  std::vector<float> want(n);
  DeviceArray<float> dx(x), dout(n);
  rt::cuda::dropout(dout.get(), dx.get(), false, n, per, 77u, threshold, scale,
                    5, 9, 12);
  rt::cpu::dropout(want.data(), x.data(), false, n, per, 77u, threshold, scale,
                   5, 9, 12);
  EXPECT_EQ(dout.download(), want);

  std::vector<float> two = {2.0f};
  DeviceArray<float> dtwo(two);
  rt::cuda::dropout(dout.get(), dtwo.get(), true, n, per, 77u, threshold, scale,
                    5, 9, 12);
  rt::cpu::dropout(want.data(), two.data(), true, n, per, 77u, threshold, scale,
                   5, 9, 12);
  EXPECT_EQ(dout.download(), want);

  DeviceArray<bf16> dxb(roundToBf16(x)), doutb(n);
  rt::cuda::dropout(doutb.get(), dxb.get(), false, n, per, 77u, threshold,
                    scale, 5, 9, 12);
  rt::cpu::dropout(want.data(), x.data(), false, n, per, 77u, threshold, scale,
                   5, 9, 12);
  EXPECT_EQ(widened(doutb.download()), roundedToBf16(want));
}

// Tests reduce<bf16> over every subset of dims, each kind (sums in double,
// rounded once; Max exact), and empty dims (0, NaN, -inf as for float).
TEST_F(CudaKernels, Bf16Reduce) {
  using Kind = rt::cuda::ReduceKind;
  auto check = [](const std::vector<int64_t> &shape,
                  const std::vector<bool> &reducedDims, Kind kind,
                  std::vector<float> in) {
    SCOPED_TRACE(::testing::Message() << "kind " << int(kind) << " dims "
                                      << ::testing::PrintToString(reducedDims));
    const int rank = int(shape.size());
    std::unique_ptr<bool[]> reduced(new bool[rank]);
    int64_t kept = 1;
    for (int d = 0; d < rank; ++d) {
      reduced[d] = reducedDims[d];
      kept *= reducedDims[d] ? 1 : shape[d];
    }
    DeviceArray<bf16> din(roundToBf16(in)), dout(kept);
    rt::cuda::reduce<bf16>(dout.get(), din.get(), rank, shape.data(),
                           reduced.get(), kind);
    std::vector<float> want(kept);
    rt::cpu::reduce(want.data(), in.data(), rank, shape.data(), reduced.get(),
                    cpuKind(kind));
    EXPECT_TRUE(near(widened(dout.download()), want, kBf16Tol));
  };
  const std::vector<int64_t> shape = {4, 5, 70};
  auto x = randomReals(4 * 5 * 70, -3, 3);
  for (int mask = 0; mask < 8; ++mask)
    for (Kind kind : {Kind::Sum, Kind::Mean, Kind::Max})
      check(shape, {bool(mask & 4), bool(mask & 2), bool(mask & 1)}, kind, x);
  for (Kind kind : {Kind::Sum, Kind::Mean, Kind::Max})
    check({3, 0, 2}, {false, true, false}, kind, {});
  // A bias gradient's shape: [batch, seq, cols] over the first two, cols a
  // multiple of 8 (reduceColumnsKernel, in parts).
  auto bias = randomReals(4 * 150 * 264, -3, 3);
  for (Kind kind : {Kind::Sum, Kind::Mean, Kind::Max})
    check({4, 150, 264}, {true, true, false}, kind, bias);
}

// Tests bf16 softmax and log-softmax along the last and a middle dim, with
// -inf entries and an all -inf row, and the gradients.
TEST_F(CudaKernels, Bf16SoftmaxAndGrad) {
  struct Case {
    int64_t outer, n, inner;
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (Case c : {Case{3, 37, 1}, Case{2, 3000, 1}, Case{2, 5, 7}})
    for (bool log : {false, true}) {
      SCOPED_TRACE(::testing::Message() << c.outer << "x" << c.n << "x"
                                        << c.inner << " log=" << log);
      const int64_t size = c.outer * c.n * c.inner;
      auto x = randomReals(size, -4, 4);
      x[1] = -inf;
      if (c.inner == 1)
        for (int64_t i = 0; i < c.n; ++i)
          x[c.n + i] = -inf; // the second row
      DeviceArray<bf16> dx(roundToBf16(x)), dy(size);
      rt::cuda::softmax(dy.get(), dx.get(), c.outer, c.n, c.inner, log);
      std::vector<float> y(size);
      rt::cpu::softmax(y.data(), x.data(), c.outer, c.n, c.inner, log);
      EXPECT_TRUE(near(widened(dy.download()), y, kBf16Tol));

      // The gradient at a finite point, from bf16 y and dy.
      auto finite = randomReals(size, -4, 4);
      rt::cpu::softmax(y.data(), finite.data(), c.outer, c.n, c.inner, log);
      auto g = randomReals(size);
      DeviceArray<bf16> dyFinite(roundToBf16(y)), dg(roundToBf16(g)), ddx(size);
      rt::cuda::softmaxGrad(ddx.get(), dyFinite.get(), dg.get(), c.outer, c.n,
                            c.inner, log);
      std::vector<float> want(size);
      rt::cpu::softmaxGrad(want.data(), y.data(), g.data(), c.outer, c.n,
                           c.inner, log);
      EXPECT_TRUE(near(widened(ddx.download()), want, kBf16Tol));
    }
}

// Tests bf16 layerNorm (with and without bias, the latter as `nullptr`) and
// its gradient (with and without dbias): every tensor in bf16.
TEST_F(CudaKernels, Bf16LayerNormAndGrad) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{7, 300},
                            std::pair<int64_t, int64_t>{9, 264}}) {
    SCOPED_TRACE(::testing::Message() << rows << " x " << cols);
    const float eps = 1e-5f;
    auto x = randomReals(rows * cols, 2, 5), scale = randomReals(cols),
         bias = randomReals(cols), dy = randomReals(rows * cols);
    DeviceArray<bf16> dx(roundToBf16(x)), dscale(roundToBf16(scale)),
        dbias(roundToBf16(bias)), ddy(roundToBf16(dy));
    for (bool withBias : {true, false}) {
      SCOPED_TRACE(withBias ? "bias" : "no bias");
      DeviceArray<bf16> out(rows * cols), gx(rows * cols), gscale(cols),
          gbias(cols);
      if (withBias)
        rt::cuda::layerNorm(out.get(), dx.get(), dscale.get(), dbias.get(), rows,
                            cols, eps);
      else
        rt::cuda::layerNorm(out.get(), dx.get(), dscale.get(), nullptr, rows,
                            cols, eps);
      std::vector<float> want(rows * cols);
      rt::cpu::layerNorm(want.data(), x.data(), scale.data(),
                         withBias ? bias.data() : nullptr, rows, cols, eps);
      EXPECT_TRUE(near(widened(out.download()), want, kBf16Tol));

      rt::cuda::layerNormGrad(gx.get(), gscale.get(),
                              withBias ? gbias.get() : nullptr, dx.get(),
                              dscale.get(), ddy.get(), rows, cols, eps);
      std::vector<float> wantX(rows * cols), wantScale(cols), wantBias(cols);
      rt::cpu::layerNormGrad(wantX.data(), wantScale.data(),
                             withBias ? wantBias.data() : nullptr, x.data(),
                             scale.data(), dy.data(), rows, cols, eps);
      EXPECT_TRUE(near(widened(gx.download()), wantX, kBf16Tol));
      EXPECT_TRUE(near(widened(gscale.download()), wantScale, kBf16Tol));
      if (withBias)
        EXPECT_TRUE(near(widened(gbias.download()), wantBias, kBf16Tol));
    }
  }
}

// Tests bf16 rmsNorm and its gradient, with and without dscale.
TEST_F(CudaKernels, Bf16RmsNormAndGrad) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 70},
                            std::pair<int64_t, int64_t>{37, 264}}) {
    SCOPED_TRACE(::testing::Message() << rows << " x " << cols);
    const float eps = 1e-6f;
    auto x = randomReals(rows * cols), scale = randomReals(cols),
         dy = randomReals(rows * cols);
    DeviceArray<bf16> dx(roundToBf16(x)), dscale(roundToBf16(scale)),
        ddy(roundToBf16(dy)), out(rows * cols), gx(rows * cols), gscale(cols),
        gxOnly(rows * cols);
    rt::cuda::rmsNorm(out.get(), dx.get(), dscale.get(), rows, cols, eps);
    std::vector<float> want(rows * cols);
    rt::cpu::rmsNorm(want.data(), x.data(), scale.data(), rows, cols, eps);
    EXPECT_TRUE(near(widened(out.download()), want, kBf16Tol));

    rt::cuda::rmsNormGrad(gx.get(), gscale.get(), dx.get(), dscale.get(),
                          ddy.get(), rows, cols, eps);
    rt::cuda::rmsNormGrad(gxOnly.get(), nullptr, dx.get(), dscale.get(),
                          ddy.get(), rows, cols, eps);
    std::vector<float> wantX(rows * cols), wantScale(cols);
    rt::cpu::rmsNormGrad(wantX.data(), wantScale.data(), x.data(), scale.data(),
                         dy.data(), rows, cols, eps);
    EXPECT_TRUE(near(widened(gx.download()), wantX, kBf16Tol));
    EXPECT_TRUE(near(widened(gscale.download()), wantScale, kBf16Tol));
    EXPECT_EQ(bitsOf(gxOnly.download()), bitsOf(gx.download()));
  }
}

namespace {

/// One warp: C = A·B for bf16 A [16][16] and B [16][16] (row-major in
/// global memory), twice: with B's fragments read by ldmatrix from Bᵀ
/// (cBt) and by ldmatrix.trans from B (cB); A through ldmatrix, C and the
/// accumulators written from the fragment layout Mma.cuh documents. The
/// 16-byte copies go through cp.async.
__global__ void mmaFragmentsKernel(float *cBt, float *cB, const bf16 *a,
                                   const bf16 *b) {
  namespace m = rt::cuda::mma;
  __shared__ __align__(16) bf16 as[16][16], bs[16][16], bts[16][16];
  const int lane = threadIdx.x, g = lane / 4, c = lane % 4, mi = lane / 8;
  // 32 lanes x 16 bytes = 512 bytes = A; the same for B.
  m::cpAsync16(&as[lane / 2][lane % 2 * 8], a + lane * 8, 16);
  m::cpAsync16(&bs[lane / 2][lane % 2 * 8], b + lane * 8, 16);
  m::cpAsyncCommit();
  m::cpAsyncWait<0>();
  __syncwarp();
  for (int e = lane; e < 256; e += 32)
    bts[e % 16][e / 16] = bs[e / 16][e % 16];
  __syncwarp();
  uint32_t af[4], bt[4], bn[4];
  m::ldmatrixX4(af, &as[(mi % 2) * 8 + lane % 8][(mi / 2) * 8]);
  // Bᵀ's rows are B's columns: matrices (n block, k block) in the order
  // (0,0), (0,1), (1,0), (1,1) give b0, b1 of n-tiles 0 and 8.
  m::ldmatrixX4(bt, &bts[(mi / 2) * 8 + lane % 8][(mi % 2) * 8]);
  // B's rows are k: matrices (k block, n block) (0,0), (1,0), (0,1), (1,1).
  m::ldmatrixX4Trans(bn, &bs[(mi % 2) * 8 + lane % 8][(mi / 2) * 8]);
  float d[4][4] = {};
  m::mmaBf16(d[0], af, bt[0], bt[1]);
  m::mmaBf16(d[1], af, bt[2], bt[3]);
  m::mmaBf16(d[2], af, bn[0], bn[1]);
  m::mmaBf16(d[3], af, bn[2], bn[3]);
  for (int f = 0; f < 4; ++f)
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = (f % 2) * 8 + 2 * c + e % 2;
      (f < 2 ? cBt : cB)[row * 16 + col] = d[f][e];
    }
}

} // namespace

// Tests the warp-level primitives of the register-resident kernels against
// a product on the host: on a GPU this checks the fragment layouts that
// Mma.cuh documents (and the emulation implements) against the hardware.
// bf16 products are exact in fp32; 16 of them summed differ from the
// host's double sum by rounding alone.
TEST_F(CudaKernels, MmaFragmentsMatchTheHost) {
  auto a = randomReals(256, -2, 2), b = randomReals(256, -2, 2);
  DeviceArray<bf16> da(roundToBf16(a)), db(roundToBf16(b));
  DeviceArray<float> cBt(256), cB(256);
  FASTLLM_LAUNCH(1, 32, 0, rt::cuda::stream(), mmaFragmentsKernel)
  (cBt.get(), cB.get(), da.get(), db.get());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<float> want(256);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      double sum = 0;
      for (int x = 0; x < 16; ++x)
        sum += double(a[i * 16 + x]) * b[x * 16 + j];
      want[i * 16 + j] = float(sum);
    }
  EXPECT_TRUE(near(cBt.download(), want, 1e-5));
  EXPECT_TRUE(near(cB.download(), want, 1e-5));
}

// Tests bf16 causal attention (bf16 q, k, v, out; float lse) and its
// gradients, on lengths below and above the tiles and head dims d ≠ dv: the
// scalar kernels (dims not multiples of 16), the tensor-core ones through
// shared memory (d ≠ dv, d = 48) and the register-resident ones (d = dv of
// 16, 32, 64, 128: one token, exactly one 64-row tile, tiles past t).
TEST_F(CudaKernels, Bf16CausalAttentionAndGrad) {
  struct Case {
    int64_t batch, t, d, dv;
  };
  for (Case c : {Case{3, 33, 16, 24}, Case{1, 129, 40, 17}, Case{2, 70, 64, 64},
                 Case{3, 1, 16, 16}, Case{1, 64, 32, 16}, Case{2, 130, 64, 64},
                 Case{1, 200, 128, 128}, Case{2, 190, 32, 32},
                 Case{1, 96, 48, 48}}) {
    SCOPED_TRACE(::testing::Message()
                 << "batch " << c.batch << " t " << c.t << " d " << c.d
                 << " dv " << c.dv << " in registers "
                 << rt::cuda::detail::flashAttentionShape(c.d, c.dv)
                 << " tensor cores "
                 << rt::cuda::detail::tensorCoreAttentionShape(c.d, c.dv));
    const float scale = 1.f / std::sqrt(float(c.d));
    const int64_t qSize = c.batch * c.t * c.d, vSize = c.batch * c.t * c.dv;
    auto q = randomReals(qSize, -2, 2), k = randomReals(qSize, -2, 2),
         v = randomReals(vSize), dout = randomReals(vSize);
    DeviceArray<bf16> dq(roundToBf16(q)), dk(roundToBf16(k)),
        dv(roundToBf16(v)), ddout(roundToBf16(dout)), out(vSize);
    DeviceArray<float> lse(c.batch * c.t);
    rt::cuda::causalAttention(out.get(), lse.get(), dq.get(), dk.get(),
                              dv.get(), c.batch, c.t, c.d, c.dv, scale);
    std::vector<float> wantOut(vSize), wantLse(c.batch * c.t);
    rt::cpu::causalAttention(wantOut.data(), wantLse.data(), q.data(), k.data(),
                             v.data(), c.batch, c.t, c.d, c.dv, scale);
    EXPECT_TRUE(near(widened(out.download()), wantOut, kBf16LongTol));
    EXPECT_TRUE(near(lse.download(), wantLse, 1e-4));

    // The gradients from the CPU's forward, its output rounded to bf16 for
    // both.
    DeviceArray<bf16> cpuOut(roundToBf16(wantOut)), gq(qSize), gk(qSize),
        gv(vSize);
    DeviceArray<float> cpuLse(wantLse);
    rt::cuda::causalAttentionGrad(gq.get(), gk.get(), gv.get(), dq.get(),
                                  dk.get(), dv.get(), cpuOut.get(),
                                  cpuLse.get(), ddout.get(), c.batch, c.t, c.d,
                                  c.dv, scale);
    std::vector<float> wantQ(qSize), wantK(qSize), wantV(vSize);
    rt::cpu::causalAttentionGrad(wantQ.data(), wantK.data(), wantV.data(),
                                 q.data(), k.data(), v.data(), wantOut.data(),
                                 wantLse.data(), dout.data(), c.batch, c.t, c.d,
                                 c.dv, scale);
    EXPECT_TRUE(near(widened(gq.download()), wantQ, kBf16LongTol));
    EXPECT_TRUE(near(widened(gk.download()), wantK, kBf16LongTol));
    EXPECT_TRUE(near(widened(gv.download()), wantV, kBf16LongTol));
  }
}

namespace {

/// The losses on bf16 logits and log-probabilities, called as generated code
/// calls them (Idx named, T deduced): float losses within the float tests'
/// 1e-5, bf16 gradients within kBf16Tol.
template <typename Idx>
void checkBf16Losses(bool hasIgnore, int64_t classes = 37) {
  using R = rt::cuda::Reduction;
  const int64_t rows = 19, ignoreIndex = -100;
  SCOPED_TRACE(::testing::Message() << "Idx bytes " << sizeof(Idx)
                                    << " hasIgnore " << hasIgnore << " classes "
                                    << classes);
  auto logits = randomReals(rows * classes, -3, 3);
  auto targets = randomInts<Idx>(rows, 0, classes - 1);
  if (hasIgnore)
    targets[2] = targets[7] = targets[8] = Idx(ignoreIndex);
  DeviceArray<bf16> dlogits(roundToBf16(logits));
  std::vector<float> logProbs(rows * classes);
  rt::cpu::softmax(logProbs.data(), logits.data(), rows, classes, 1, true);
  DeviceArray<bf16> dlogProbs(roundToBf16(logProbs));
  DeviceArray<Idx> dtargets(targets);
  auto dlossRows = randomReals(rows);
  for (R r : {R::None, R::Sum, R::Mean}) {
    SCOPED_TRACE(::testing::Message() << "reduction " << int(r));
    const int64_t lossSize = r == R::None ? rows : 1;
    std::vector<float> dloss =
        r == R::None ? dlossRows : std::vector<float>{0.7f};
    DeviceArray<float> loss(lossSize), nll(lossSize), ddloss(dloss);
    DeviceArray<bf16> grad(rows * classes), nllGrad(rows * classes);

    rt::cuda::crossEntropy<Idx>(loss.get(), dlogits.get(), dtargets.get(), rows,
                                classes, hasIgnore, ignoreIndex, r);
    std::vector<float> want(lossSize);
    rt::cpu::crossEntropy(want.data(), logits.data(), targets.data(), rows,
                          classes, hasIgnore, ignoreIndex, cpuReduction(r));
    EXPECT_TRUE(near(loss.download(), want, 1e-5));

    rt::cuda::crossEntropyGrad<Idx>(grad.get(), dlogits.get(), dtargets.get(),
                                    ddloss.get(), rows, classes, hasIgnore,
                                    ignoreIndex, r);
    std::vector<float> wantGrad(rows * classes);
    rt::cpu::crossEntropyGrad(wantGrad.data(), logits.data(), targets.data(),
                              dloss.data(), rows, classes, hasIgnore,
                              ignoreIndex, cpuReduction(r));
    EXPECT_TRUE(near(widened(grad.download()), wantGrad, kBf16Tol));

    rt::cuda::nllLoss<Idx>(nll.get(), dlogProbs.get(), dtargets.get(), rows,
                           classes, hasIgnore, ignoreIndex, r);
    rt::cpu::nllLoss(want.data(), logProbs.data(), targets.data(), rows,
                     classes, hasIgnore, ignoreIndex, cpuReduction(r));
    EXPECT_TRUE(near(nll.download(), want, 1e-5));

    rt::cuda::nllLossGrad<Idx>(nllGrad.get(), dtargets.get(), ddloss.get(),
                               rows, classes, hasIgnore, ignoreIndex, r);
    rt::cpu::nllLossGrad(wantGrad.data(), targets.data(), dloss.data(), rows,
                         classes, hasIgnore, ignoreIndex, cpuReduction(r));
    EXPECT_TRUE(near(widened(nllGrad.download()), wantGrad, kBf16Tol));
  }
}

} // namespace

// Tests cross entropy and NLL on bf16 inputs with float losses, forward and
// backward, for every reduction, with and without ignored targets, for both
// index types; rows of 37 classes, and of 4000 (16-byte vectors).
TEST_F(CudaKernels, Bf16Losses) {
  checkBf16Losses<int64_t>(false);
  checkBf16Losses<int64_t>(true);
  checkBf16Losses<int32_t>(true);
  checkBf16Losses<int64_t>(true, 4000); // 16-byte vectors, 2 per thread
}
