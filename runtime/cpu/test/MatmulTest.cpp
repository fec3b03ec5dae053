//===- MatmulTest.cpp - matmul and addMatmul --------------------*- C++ -*-===//
//
// Part of the CPU kernel library's tests: see TestUtil.h.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/test/TestUtil.h"

extern "C" char *openblas_get_corename(void);

using namespace fastllm::rt::cpu;
using namespace fastllm::rt::cpu::test;

namespace {

struct MatmulCase {
  Shape batch, aStrides, bStrides;
  int64_t m, n, k;
};

std::vector<double> refMatmul(const std::vector<float> &a,
                              const std::vector<float> &b, const MatmulCase &c,
                              bool transA, bool transB) {
  int64_t m = c.m, n = c.n, k = c.k;
  std::vector<double> out(numel(c.batch) * m * n);
  for (int64_t bi = 0; bi < numel(c.batch); ++bi) {
    Shape index = unravel(bi, c.batch);
    int64_t ao = dot(index, c.aStrides), bo = dot(index, c.bStrides);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += double(a[ao + (transA ? p * m + i : i * k + p)]) *
               b[bo + (transB ? j * k + p : p * n + j)];
        out[(bi * m + i) * n + j] = s;
      }
  }
  return out;
}

/// Elements a strided batch of [rows, cols] matrices spans.
int64_t spanOf(const Shape &batch, const Shape &strides, int64_t matrix) {
  int64_t last = 0;
  for (size_t d = 0; d < batch.size(); ++d)
    last += (batch[d] - 1) * strides[d];
  return last + matrix;
}

void checkMatmul(const MatmulCase &c, unsigned seed) {
  for (bool transA : {false, true})
    for (bool transB : {false, true}) {
      auto a = randomFloats(spanOf(c.batch, c.aStrides, c.m * c.k), seed);
      auto b = randomFloats(spanOf(c.batch, c.bStrides, c.k * c.n), seed + 1);
      std::vector<float> out(numel(c.batch) * c.m * c.n, kInfF);
      matmul(out.data(), a.data(), b.data(), int(c.batch.size()),
             c.batch.data(), c.aStrides.data(), c.bStrides.data(), c.m, c.n,
             c.k, transA, transB);
      expectAllClose(out, refMatmul(a, b, c, transA, transB), 1e-5, 2e-6 * c.k,
                     "transA=" + std::to_string(transA) +
                         " transB=" + std::to_string(transB));
      // addMatmul adds the same product into what the buffer holds.
      auto acc = randomFloats(out.size(), seed + 2);
      std::vector<double> want = refMatmul(a, b, c, transA, transB);
      for (size_t i = 0; i < want.size(); ++i)
        want[i] += acc[i];
      addMatmul(acc.data(), a.data(), b.data(), int(c.batch.size()),
                c.batch.data(), c.aStrides.data(), c.bStrides.data(), c.m, c.n,
                c.k, transA, transB);
      expectAllClose(acc, want, 1e-5, 2e-6 * (c.k + 1),
                     "addMatmul transA=" + std::to_string(transA) +
                         " transB=" + std::to_string(transB));
    }
}

// Tests a single small product in all four transpositions.
TEST(MatmulTest, NoBatch) { checkMatmul({{}, {}, {}, 5, 7, 3}, 20); }

// Tests a batch where B broadcasts along the first batch dim and A along
// none, and one where A broadcasts along everything.
TEST(MatmulTest, BatchBroadcast) {
  checkMatmul({{2, 3}, {3 * 15, 15}, {0, 12}, 5, 4, 3}, 21);
  checkMatmul({{2, 3}, {0, 0}, {3 * 12, 12}, 5, 4, 3}, 22);
}

// Tests the case that folds the batch into one taller product (contiguous
// A, B shared by all).
TEST(MatmulTest, SharedWeightFoldsBatch) {
  checkMatmul({{4, 3}, {3 * 6 * 5, 6 * 5}, {0, 0}, 6, 7, 5}, 23);
}

// Tests products large enough to be split into bands (by rows, by columns,
// and an odd batch split in two), and many small products run in parallel.
TEST(MatmulTest, ThreadedSplits) {
  checkMatmul({{}, {}, {}, 130, 70, 90}, 24);
  checkMatmul({{}, {}, {}, 20, 300, 64}, 25);
  checkMatmul({{5}, {64 * 40}, {40 * 48}, 64, 48, 40}, 26);
  checkMatmul(
      {{4, 12}, {12 * 17 * 8, 17 * 8}, {12 * 8 * 19, 8 * 19}, 17, 19, 8}, 27);
}

// Tests that an empty contraction gives zeros.
TEST(MatmulTest, EmptyContraction) {
  std::vector<float> out(6, 1.f);
  const float *none = nullptr; // T comes from the operands' type
  matmul(out.data(), none, none, 0, nullptr, nullptr, nullptr, 2, 3, 0, false,
         false);
  for (float v : out)
    EXPECT_EQ(v, 0.f);
}

// Tests that addMatmul with an empty contraction leaves the buffer as it is.
TEST(MatmulTest, AddMatmulEmptyContraction) {
  std::vector<float> acc = {1.f, -2.f, 3.f, 4.f, 5.f, 6.f};
  const std::vector<float> before = acc;
  const float *none = nullptr; // T comes from the operands' type
  addMatmul(acc.data(), none, none, 0, nullptr, nullptr, nullptr, 2, 3, 0,
            false, false);
  EXPECT_EQ(acc, before);
}

// Tests that OpenBLAS runs vector kernels: Debian's 0.3.21 falls back to its
// SSE3 "Prescott" kernels on CPUs it does not know, which matmul corrects.
TEST(MatmulTest, BlasUsesVectorKernels) {
  std::vector<float> a(4, 1.f), out(4);
  matmul(out.data(), a.data(), a.data(), 0, nullptr, nullptr, nullptr, 2, 2, 2,
         false, false);
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2"))
    EXPECT_STRNE(openblas_get_corename(), "Prescott");
}

} // namespace
